// Highway SIMD conversions used on the cache's hot paths (input checks,
// gathering rows for the flush): the same results as the scalar helpers in
// skvq/dtype.hpp (fp16 and bf16 widen to float32 exactly).
#pragma once

#include <cstddef>
#include <cstdint>

#include "skvq/dtype.hpp"

namespace skvq::cpu {

// n contiguous elements of dtype t at p -> out[0..n) as float32.
void load_row_f32(const std::byte* p, DType t, std::int64_t n, float* out);

// Largest |x| over x[0..n); NaN if any element is NaN.
float max_abs(const float* x, std::int64_t n);

// Largest (h & 0x7fff) over n contiguous fp16 or bf16 bit patterns: the
// largest magnitude's bits (NaN and infinity compare above every finite value).
std::uint16_t max_abs_bits16(const std::uint16_t* h, std::int64_t n);

}  // namespace skvq::cpu
