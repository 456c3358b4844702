// Parameters of the row quantizer, the kernel family behind a chunk flush.
// One struct for every backend (ref, cpu SIMD, cuda); each backend must give
// identical codes, lo and scale for identical inputs.
#pragma once

#include <cstdint>

#include "skvq/config.hpp"

namespace skvq {

struct QuantParams {
  const float* x = nullptr;  // [n_rows, padded_dim] rows in permuted channel order; a ragged
                             // last group is padded by repeating the row's last value
  std::int64_t n_rows = 0;
  int padded_dim = 0;        // G * group_size, G = ceil(head_dim / group_size)
  int group_size = 0;        // g
  int bits = 0;              // 1..8
  const float* grid = nullptr;  // [n_grid] clip factors, searched in order
  int n_grid = 0;
  MetaType meta = MetaType::fp16;
  std::uint8_t* codes = nullptr;  // [n_rows, padded_dim] out: one code per byte, in [0, 2^bits - 1]
  float* lo = nullptr;            // [n_rows, G] out: exactly representable in `meta`
  float* scale = nullptr;         // [n_rows, G] out: exactly representable in `meta`, > 0
};

}  // namespace skvq
