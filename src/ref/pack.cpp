// Reference bit packing (layout drawn in pack.hpp).
#include "ref/pack.hpp"

#include <bit>
#include <cstring>

namespace skvq::ref {

void pack_codes(const std::uint8_t* codes, std::int64_t n, int bits, std::uint8_t* stream,
                std::int64_t first) {
  const unsigned mask = (1u << bits) - 1u;
  if ((bits == 1 || bits == 2 || bits == 4 || bits == 8) && (first * bits) % 8 == 0) {
    // Whole bytes: 8 / bits codes per byte, lowest code in the lowest bits.
    const int per = 8 / bits;
    std::uint8_t* out = stream + first * bits / 8;
    std::int64_t i = 0;
    if (bits < 8) {
      // Eight codes (one per byte of a little-endian word) at a time: fold
      // neighbours together in log2(8) shift-or steps (SWAR).
      static_assert(std::endian::native == std::endian::little);
      const std::uint64_t lane = 0x0101010101010101ULL * mask;
      for (; i + 8 <= n; i += 8) {
        std::uint64_t x;
        std::memcpy(&x, codes + i, 8);
        x &= lane;
        const std::uint64_t m16 = 0x0001000100010001ULL * ((1ULL << (2 * bits)) - 1);
        const std::uint64_t m32 = 0x0000000100000001ULL * ((1ULL << (4 * bits)) - 1);
        x = (x | (x >> (8 - bits))) & m16;        // pairs: 2 * bits in each 16-bit lane
        x = (x | (x >> (16 - 2 * bits))) & m32;   // quads: 4 * bits in each 32-bit lane
        x = x | (x >> (32 - 4 * bits));           // octet: 8 * bits in the low bits
        // The covered bytes are zero (the contract), so storing equals OR-ing.
        std::memcpy(out, &x, static_cast<std::size_t>(bits));
        out += bits;
      }
    }
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
