// Reference reconstruction of one packed row (spec section 4, step 2, last line).
#pragma once

#include <cstdint>

#include "skvq/config.hpp"

namespace skvq::ref {

// Reconstructs row `row` of a packed (b, h) stream into out[0..D) in the
// original channel order: out[perm[j]] = code[j] * scale[j / g] + lo[j / g]
// for permuted channel j (perm == nullptr: identity).
//   stream: the (b, h) code stream, stream_bytes long (ref/pack.hpp)
//   lo_row, scale_row: the row's G metadata values, meta_bytes(meta) each
void dequantize_row(const std::uint8_t* stream, std::int64_t stream_bytes, std::int64_t row, int D,
                    int bits, int g, MetaType meta, const std::uint8_t* lo_row,
                    const std::uint8_t* scale_row, const std::int32_t* perm, float* out);

}  // namespace skvq::ref
