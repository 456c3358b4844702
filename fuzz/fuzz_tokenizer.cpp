// libFuzzer target for the llama2.c tokenizer file: the first byte picks the
// vocabulary size (3 to 258), the rest is the file. Any input either loads or
// throws skvq::Error; what loads must encode text (its own bytes included)
// and decode every id it gives.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "model/tokenizer.hpp"
#include "skvq/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const int vocab = 3 + data[0];
  const std::string_view file(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const auto tok = skvq::model::Tokenizer::parse_llama2c(file, "fuzz.bin", vocab);
    for (const std::string& text : {std::string("Once upon a time \xe2\x96\x81\xff"), std::string(file.substr(0, 64))}) {
      const std::vector<int> ids = tok.encode(text, true);
      std::string back;
      for (std::size_t i = 1; i < ids.size(); ++i) back += tok.decode(ids[i - 1], ids[i]);
    }
  } catch (const skvq::Error&) {
  }
  return 0;
}
