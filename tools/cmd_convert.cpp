// skvq convert: a llama2.c checkpoint (and its tokenizer) to GGUF.
#include <cstdio>

#include "cli_common.hpp"
#include "commands.hpp"
#include "model_cli.hpp"
#include "skvq/error.hpp"

namespace skvq::tools {

void register_convert(CLI::App& app, CommandList& commands) {
  struct Args {
    std::string model, tokenizer, out, dtype = "f32";
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("convert", "Convert a llama2.c checkpoint to GGUF (vocabulary embedded)");
  sub->add_option("--model", a->model, "llama2.c checkpoint")->required();
  sub->add_option("--tokenizer", a->tokenizer, "llama2.c tokenizer file (default: beside the model)");
  sub->add_option("--out", a->out, "output .gguf")->required();
  sub->add_option("--dtype", a->dtype, "tensor type: f32, f16 or bf16")->capture_default_str();
  commands.emplace_back(sub, [a] {
    if (a->dtype != "f32" && a->dtype != "f16" && a->dtype != "bf16") throw UsageError("--dtype " + a->dtype + " must be f32, f16 or bf16");
    check_output_file("--out", a->out, false);
    LoadedModel lm = load_model_args(a->model, a->tokenizer);
    const std::string tmp = a->out + ".partial";
    try {
      model::write_gguf(lm.model, lm.tokenizer, tmp, a->dtype);
    } catch (const Error& e) {
      std::remove(tmp.c_str());
      throw UsageError("--out " + std::string(e.what()).substr(6));
    }
    if (std::rename(tmp.c_str(), a->out.c_str()) != 0) {
      std::remove(tmp.c_str());
      throw UsageError("--out " + a->out + ": cannot rename into place");
    }
    std::printf("wrote %s (%s, %d layers, vocab %d)\n", a->out.c_str(), a->dtype.c_str(), lm.model.cfg.n_layers,
                lm.model.cfg.vocab_size);
    return 0;
  });
}

}  // namespace skvq::tools
