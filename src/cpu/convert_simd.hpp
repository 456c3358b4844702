// Highway SIMD conversions used on the cache's hot paths (input checks,
// gathering rows for the flush): the same results as the scalar helpers in
// skvq/dtype.hpp (fp16 and bf16 widen to float32 exactly).
#pragma once

#include <cstddef>
#include <cstdint>

#include "skvq/config.hpp"
#include "skvq/dtype.hpp"
#include "skvq/tensor.hpp"

namespace skvq::cpu {

// n contiguous elements of dtype t at p -> out[0..n) as float32.
void load_row_f32(const std::byte* p, DType t, std::int64_t n, float* out);

// Rows [t, t + n) of head (b, h) of any view -> out[n][D] as float32: through
// load_row_f32 where a row's channels are adjacent (one call where the rows
// are too), element by element otherwise.
void load_view_rows(const TensorView& v, std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t n, float* out);

// in[0..n) stored as n contiguous elements of type t at p, byte for byte as
// skvq::store_row_f32 (fp16 by SIMD conversion, round to nearest even).
void store_row_f32(std::byte* p, DType t, std::int64_t n, const float* in);

// memcpy(dst, src, bytes) with non-temporal (streaming) stores from dst's first vector-aligned
// byte, then a store fence: for memory that nothing on this core reads back soon (the staging a
// DMA copies from), whose lines then need not be read into the cache before they are written.
void stream_copy(std::byte* dst, const std::byte* src, std::size_t bytes);

// Largest |x| over x[0..n); NaN if any element is NaN.
float max_abs(const float* x, std::int64_t n);

// Largest (h & 0x7fff) over n contiguous fp16 or bf16 bit patterns: the
// largest magnitude's bits (NaN and infinity compare above every finite value).
std::uint16_t max_abs_bits16(const std::uint16_t* h, std::int64_t n);

// Rows [row0, row0 + n) of a packed (b, h) stream into out[n][D] in the
// original channel order, each exactly as ref::dequantize_row makes it (the
// product code * scale rounded, then the sum with lo): lo and scale point at
// row row0's metadata, mrow bytes a row. Rows that start on a byte at 1, 2, 4
// or 8 bits go through byte tables and SIMD; others through the reference.
void dequantize_rows(const std::uint8_t* stream, std::int64_t stream_bytes, std::int64_t row0, std::int64_t n, int D,
                     int bits, int g, MetaType meta, const std::uint8_t* lo, const std::uint8_t* scale,
                     std::int64_t mrow, const std::int32_t* perm, float* out);

}  // namespace skvq::cpu
