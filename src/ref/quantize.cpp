// Scalar reference quantizer (spec section 4). Compiled with
// -ffp-contract=off: every operation is rounded separately.
#include "ref/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ref/meta.hpp"

namespace skvq::ref {

namespace {

float code_of(float x, float lo, float scale, float levels) {
  const float q = std::nearbyint((x - lo) / scale);  // default rounding: half to even
  return std::min(std::max(q, 0.0f), levels);
}

}  // namespace

void quantize_group(const float* x, int g, int bits, const float* grid, int n_grid, MetaType meta,
                    std::uint8_t* codes, float* lo_out, float* scale_out) {
  const float levels = static_cast<float>((1 << bits) - 1);
  const float inv_g = 1.0f / static_cast<float>(g);
  float gmin = x[0], gmax = x[0];
  for (int s = 1; s < g; ++s) {
    gmin = std::min(gmin, x[s]);
    gmax = std::max(gmax, x[s]);
  }
  const float mid = (gmax + gmin) * 0.5f;
  const float rng = gmax - gmin;

  float best_err = 0.0f, best_lo = 0.0f, best_scale = 0.0f;
  for (int a = 0; a < n_grid; ++a) {
    const float t = grid[a] * rng;
    const float lo = meta_round_lo(mid - t * 0.5f, meta);
    const float scale = meta_round_scale(std::max(t / levels, kMinScaleF32), meta);
    float err = 0.0f;
    for (int s = 0; s < g; ++s) {
      const float recon = code_of(x[s], lo, scale, levels) * scale + lo;
      const float d = recon - x[s];
      err += d * d;
    }
    err = err * inv_g;
    if (a == 0 || err < best_err) {  // ties keep the earlier alpha
      best_err = err;
      best_lo = lo;
      best_scale = scale;
    }
  }
  for (int s = 0; s < g; ++s) {
    codes[s] = static_cast<std::uint8_t>(code_of(x[s], best_lo, best_scale, levels));
  }
  *lo_out = best_lo;
  *scale_out = best_scale;
}

void quantize_rows(const QuantParams& p) {
  const int g = p.group_size;
  const int G = p.padded_dim / g;
  const int D = p.row_dim();
  std::vector<float> xp(static_cast<std::size_t>(p.padded_dim));
  for (std::int64_t r = 0; r < p.n_rows; ++r) {
    const float* row = p.x + r * D;
    const std::int32_t* perm = p.row_perm(r);
    for (int j = 0; j < p.padded_dim; ++j) {
      const int c = j < D ? j : D - 1;
      xp[static_cast<std::size_t>(j)] = row[perm ? perm[c] : c];
    }
    for (int k = 0; k < G; ++k) {
      const std::int64_t e = r * p.padded_dim + static_cast<std::int64_t>(k) * g;
      quantize_group(xp.data() + static_cast<std::size_t>(k) * g, g, p.bits, p.grid, p.n_grid, p.meta, p.codes + e,
                     p.lo + r * G + k, p.scale + r * G + k);
    }
  }
}

}  // namespace skvq::ref
