// How far apart the clip search's candidates are: for groups of fp16 values
// drawn from a few distributions, each factor of the default grid quantized
// by the scalar reference (spec section 4, fp16 metadata), its error summed as
// the spec sums it, then which factor wins and the relative margin between the
// smallest error and the next. An estimate of the errors that is coarser than
// the certified one (src/cuda/clip_proxy.hpp) can decide only the groups
// whose margin exceeds its own relative bound: the table gives that share for
// a few bounds (docs/performance-history.md, "Flush throughput", session 36).
//
// Usage: clip_margins [GROUPS_PER_CELL]   (default 20000; seed fixed)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "ref/quantize.hpp"
#include "skvq/config.hpp"
#include "skvq/dtype.hpp"

namespace {

// The spec's error of one factor: (sum over slots, in order, of (recon - x)^2) * (1/g), all float32.
float spec_error(const std::vector<float>& x, int bits, float a) {
  const int g = static_cast<int>(x.size());
  std::vector<std::uint8_t> codes(x.size());
  float lo = 0.0f, scale = 0.0f;
  skvq::ref::quantize_group(x.data(), g, bits, &a, 1, skvq::MetaType::fp16, codes.data(), &lo, &scale);
  float sum = 0.0f;
  for (int i = 0; i < g; ++i) {
    const float d = skvq::ref::dequantize(codes[i], lo, scale) - x[i];
    sum += d * d;
  }
  return sum * (1.0f / static_cast<float>(g));
}

}  // namespace

int main(int argc, char** argv) {
  char* end = nullptr;
  const long n = argc > 1 ? std::strtol(argv[1], &end, 10) : 20000;
  if (argc > 2 || n < 1 || (argc > 1 && *end != '\0')) {
    std::fprintf(stderr, "clip_margins: usage: clip_margins [GROUPS_PER_CELL], a positive integer; got '%s'\n",
                 argc > 1 ? argv[1] : "");
    return 2;
  }
  const std::vector<float>& grid = skvq::default_clip_grid();
  const double bounds[] = {1e-4, 1e-3, 3e-3, 1e-2};
  std::printf("%ld groups a row; values: fp16 of the distribution; fp16 metadata\n\n", n);
  std::printf("| data | group | bits | wins by factor (");
  for (std::size_t a = 0; a < grid.size(); ++a) std::printf("%s%.2f", a ? " / " : "", static_cast<double>(grid[a]));
  std::printf(") | margin < 1e-4 | < 1e-3 | < 3e-3 | < 1e-2 |\n|---|---|---|---|---|---|---|---|\n");
  for (int kind = 0; kind < 3; ++kind) {
    for (int g : {128, 32}) {
      for (int bits : {2, 4}) {
        std::mt19937_64 rng(1234 + 17 * kind + g + bits);
        std::normal_distribution<double> normal(0.0, 1.0);
        std::student_t_distribution<double> heavy(3.0);
        std::vector<long> wins(grid.size(), 0), below(std::size(bounds), 0);
        std::vector<float> x(static_cast<std::size_t>(g));
        for (long it = 0; it < n; ++it) {
          for (float& v : x) {
            const double r = kind == 1 ? heavy(rng) : normal(rng) + (kind == 2 ? 3.0 : 0.0);
            v = skvq::f16_to_f32(skvq::f32_to_f16(static_cast<float>(r)));
          }
          std::vector<float> e(grid.size());
          for (std::size_t a = 0; a < grid.size(); ++a) e[a] = spec_error(x, bits, grid[a]);
          const std::size_t best = static_cast<std::size_t>(std::min_element(e.begin(), e.end()) - e.begin());
          ++wins[best];
          float next = INFINITY;
          for (std::size_t a = 0; a < grid.size(); ++a)
            if (a != best) next = std::min(next, e[a]);
          const double margin = e[best] > 0.0f ? (static_cast<double>(next) - e[best]) / e[best] : INFINITY;
          for (std::size_t q = 0; q < std::size(bounds); ++q) below[q] += margin < bounds[q];
        }
        std::printf("| %s | %d | %d | ", kind == 0 ? "normal" : kind == 1 ? "Student t, 3 dof" : "normal + 3", g, bits);
        for (std::size_t a = 0; a < grid.size(); ++a) std::printf("%s%.1f%%", a ? " / " : "", 100.0 * wins[a] / n);
        for (std::size_t q = 0; q < std::size(bounds); ++q) std::printf(" | %.2f%%", 100.0 * below[q] / n);
        std::printf(" |\n");
      }
    }
  }
  return 0;
}
