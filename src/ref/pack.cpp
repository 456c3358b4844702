// Reference bit packing (layout drawn in pack.hpp).
#include "ref/pack.hpp"

namespace skvq::ref {

void pack_codes(const std::uint8_t* codes, std::int64_t n, int bits, std::uint8_t* stream,
                std::int64_t first) {
  const unsigned mask = (1u << bits) - 1u;
  if ((bits == 1 || bits == 2 || bits == 4 || bits == 8) && (first * bits) % 8 == 0) {
    // Whole bytes: 8 / bits codes per byte, lowest code in the lowest bits.
    const int per = 8 / bits;
    std::uint8_t* out = stream + first * bits / 8;
    std::int64_t i = 0;
    for (; i + per <= n; i += per) {
      unsigned byte = 0;
      for (int k = 0; k < per; ++k) byte |= (codes[i + k] & mask) << (k * bits);
      *out++ |= static_cast<std::uint8_t>(byte);
    }
    unsigned byte = 0;
    for (int k = 0; i + k < n; ++k) byte |= (codes[i + k] & mask) << (k * bits);
    if (i < n) *out |= static_cast<std::uint8_t>(byte);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t bit = (first + i) * bits;
    const unsigned v = (codes[i] & mask) << (bit & 7);
    stream[bit >> 3] = static_cast<std::uint8_t>(stream[bit >> 3] | (v & 0xffu));
    if ((bit & 7) + bits > 8) {
      stream[(bit >> 3) + 1] = static_cast<std::uint8_t>(stream[(bit >> 3) + 1] | (v >> 8));
    }
  }
}

void unpack_codes(const std::uint8_t* stream, std::int64_t stream_bytes, std::int64_t first,
                  std::int64_t n, int bits, std::uint8_t* codes) {
  const unsigned mask = (1u << bits) - 1u;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t bit = (first + i) * bits;
    const std::int64_t byte = bit >> 3;
    unsigned w = stream[byte];
    if (byte + 1 < stream_bytes) w |= static_cast<unsigned>(stream[byte + 1]) << 8;
    codes[i] = static_cast<std::uint8_t>((w >> (bit & 7)) & mask);
  }
}

}  // namespace skvq::ref
