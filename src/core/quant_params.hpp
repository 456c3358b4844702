// Parameters of the row quantizer, the kernel family behind a chunk flush.
// One struct for every backend (ref, cpu SIMD, cuda); each backend must give
// identical codes, lo and scale for identical inputs.
#pragma once

#include <cstdint>

#include "skvq/config.hpp"

namespace skvq {

struct QuantParams {
  // Input rows x [n_rows, dim]. The quantizer sees row r as xp[j] = x[r][perm_r[min(j, dim - 1)]]
  // for j < padded_dim: permuted (perm_r = perm + ((r / rows_per_perm) % n_perms) * dim, or the
  // identity when perm is null) and padded by repeating the last permuted value.
  const float* x = nullptr;
  std::int64_t n_rows = 0;
  int dim = 0;               // channels per row of x (0: padded_dim, rows given permuted and padded)
  const std::int32_t* perm = nullptr;  // [n_perms, dim] or null
  std::int64_t rows_per_perm = 1;
  int n_perms = 1;
  int padded_dim = 0;        // G * group_size, G = ceil(dim / group_size)
  int group_size = 0;        // g
  int bits = 0;              // 1..8
  const float* grid = nullptr;  // [n_grid] clip factors, searched in order
  int n_grid = 0;
  MetaType meta = MetaType::fp16;
  std::uint8_t* codes = nullptr;  // [n_rows, padded_dim] out: one code per byte, in [0, 2^bits - 1]
  float* lo = nullptr;            // [n_rows, G] out: exactly representable in `meta`
  float* scale = nullptr;         // [n_rows, G] out: exactly representable in `meta`, > 0

  int row_dim() const { return dim > 0 ? dim : padded_dim; }
  // Permutation of row r (null: identity).
  const std::int32_t* row_perm(std::int64_t r) const {
    return perm ? perm + ((r / rows_per_perm) % n_perms) * row_dim() : nullptr;
  }
};

}  // namespace skvq
