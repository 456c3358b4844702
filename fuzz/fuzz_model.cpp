// libFuzzer target for the model loaders: GGUF (by its magic) or a llama2.c
// checkpoint (anything else). Any input either loads or throws skvq::Error;
// it never crashes, hangs or reads out of bounds. A loaded model must run a
// two-token forward pass through an skvq cache, and a GGUF's vocabulary must
// encode and decode.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/model.hpp"
#include "model/runner.hpp"
#include "skvq/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    using namespace skvq::model;
    Tokenizer tok;
    const bool gguf = bytes.substr(0, 4) == "GGUF";
    const Model m = gguf ? parse_gguf(bytes, "fuzz.gguf", &tok) : parse_llama2c(bytes, "fuzz.bin");
    if (gguf) {
      const std::vector<int> ids = tok.encode("a b\xc3\xa9", true);
      std::string text;
      for (std::size_t i = 1; i < ids.size(); ++i) text += tok.decode(ids[i - 1], ids[i]);
    }
    const Runner r(m);
    skvq::Config cfg;
    cfg.window = 4, cfg.n_sink = 1, cfg.group_size = 8;
    skvq::PromptCache cache = r.make_cache(skvq::CacheKind::skvq, cfg);
    const int toks[2] = {0, m.cfg.vocab_size - 1};
    (void)r.forward(toks, cache, true);
  } catch (const skvq::Error&) {
  }
  return 0;
}
