// Scalar reference quantizer: spec section 4 in code. Every fast kernel is
// tested against these functions and must reproduce their codes exactly.
#pragma once

#include <cstdint>

#include "core/quant_params.hpp"

namespace skvq::ref {

// Quantizes one group of g values x[0..g) with the clipped min/max search.
// Writes codes[0..g) and the stored lo/scale (already rounded to `meta`).
void quantize_group(const float* x, int g, int bits, const float* grid, int n_grid, MetaType meta,
                    std::uint8_t* codes, float* lo, float* scale);

// Quantizes every group of every row (see QuantParams).
void quantize_rows(const QuantParams& p);

// recon = code * scale + lo, in float32 with each operation rounded.
inline float dequantize(std::uint8_t code, float lo, float scale) {
  const float prod = static_cast<float>(code) * scale;
  return prod + lo;
}

}  // namespace skvq::ref
