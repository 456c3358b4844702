// Shared helpers of the model subcommands.
#include "model_cli.hpp"

#include "cli_common.hpp"
#include "skvq/error.hpp"

namespace skvq::tools {

LoadedModel load_model_args(const std::string& model_path, const std::string& tokenizer_path) {
  LoadedModel lm;
  try {
    lm.model = model::load_model(model_path, tokenizer_path, &lm.tokenizer);
  } catch (const Error& e) {
    const std::string msg = std::string(e.what()).substr(6);
    const bool tok = msg.rfind("tokenizer", 0) == 0;
    throw UsageError((tok ? "--tokenizer " : "--model ") + msg);
  }
  if (lm.tokenizer.size() != lm.model.cfg.vocab_size) {
    throw UsageError("--tokenizer has " + std::to_string(lm.tokenizer.size()) + " pieces but the model's vocab_size is " +
                     std::to_string(lm.model.cfg.vocab_size));
  }
  return lm;
}

std::string model_signature(const model::Model& m) {
  const auto& c = m.cfg;
  return "llama dim=" + std::to_string(c.dim) + " hidden=" + std::to_string(c.hidden_dim) + " layers=" +
         std::to_string(c.n_layers) + " heads=" + std::to_string(c.n_heads) + " kv_heads=" + std::to_string(c.n_kv_heads) +
         " vocab=" + std::to_string(c.vocab_size) + " seq_len=" + std::to_string(c.seq_len);
}

}  // namespace skvq::tools
