// libFuzzer target for the .npy reader: any input either parses or throws
// skvq::Error; it never crashes or reads out of bounds, and what parses
// holds exactly as many bytes as its shape and dtype say.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "io/npy.hpp"
#include "skvq/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const skvq::io::NpyArray a = skvq::io::parse_npy(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
    if (a.data.size() != static_cast<std::size_t>(a.numel()) * a.item_size()) std::abort();
  } catch (const skvq::Error&) {
  }
  return 0;
}
