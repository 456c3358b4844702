// Bit packing of quantization codes.
//
// Bit order: a stream of n codes of `bits` bits each occupies
// ceil(n * bits / 8) bytes. Code i occupies stream bits [i*bits, (i+1)*bits),
// least significant bit first, and stream bit k is bit (k % 8) of byte k / 8.
// Example, bits = 2: byte 0 = c0 | c1 << 2 | c2 << 4 | c3 << 6.
// Example, bits = 3: byte 0 = c0 | c1 << 3 | (c2 & 3) << 6, byte 1 starts with c2 >> 2.
#pragma once

#include <cstdint>

namespace skvq::ref {

constexpr std::int64_t packed_bytes(std::int64_t n_codes, int bits) {
  return (n_codes * bits + 7) / 8;
}

// Writes codes[0..n) into stream starting at code index `first`. The bytes
// the codes cover must be zero beforehand (bits are OR-ed in).
void pack_codes(const std::uint8_t* codes, std::int64_t n, int bits, std::uint8_t* stream,
                std::int64_t first = 0);

// Reads codes [first, first + n) of a stream of `stream_bytes` bytes.
void unpack_codes(const std::uint8_t* stream, std::int64_t stream_bytes, std::int64_t first,
                  std::int64_t n, int bits, std::uint8_t* codes);

}  // namespace skvq::ref
