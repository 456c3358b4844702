// libFuzzer target for the prompt-cache loader: any input either loads or
// throws skvq::Error; it never crashes, hangs or reads out of bounds. A
// loaded cache must survive being fetched, attended and saved again.
#include <cstddef>
#include <cstdint>
#include <span>

#include "skvq/skvq.hpp"
#include "skvq/cache_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    skvq::CacheFileExtras extras;
    skvq::PromptCache pc = skvq::load_prompt_cache_bytes(std::span(data, size), &extras);
    for (std::size_t l = 0; l < pc.size(); ++l) {
      skvq::LayerCache& c = pc.layer(l);
      (void)c.accounting();
      (void)c.stored_bytes();
    }
    (void)skvq::prompt_cache_bytes(pc, extras);
  } catch (const skvq::Error&) {
  }
  return 0;
}
