// Reference dense attention.
#include "ref/attention.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "skvq/error.hpp"

namespace skvq::ref {

void dense_attention(const TensorView& q, const TensorView& k, const TensorView& v, float scale,
                     const TensorView& out) {
  const std::int64_t B = q.shape[0], Hq = q.shape[1], Sq = q.shape[2], D = q.shape[3];
  const std::int64_t Hkv = k.shape[1], T = k.shape[2], Dv = v.shape[3];
  if (k.shape[0] != B || v.shape[0] != B || k.shape[3] != D || v.shape[1] != Hkv || v.shape[2] != T ||
      Hkv == 0 || Hq % Hkv != 0 || out.shape != Shape4{B, Hq, Sq, Dv} || Sq > T) {
    throw Error("skvq: dense_attention shapes q " + shape_string(q.shape) + " k " + shape_string(k.shape) +
                " v " + shape_string(v.shape) + " out " + shape_string(out.shape) + " are inconsistent");
  }
  const std::int64_t G = Hq / Hkv;
  std::vector<double> s(static_cast<std::size_t>(T)), acc(static_cast<std::size_t>(Dv));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t hq = 0; hq < Hq; ++hq) {
      const std::int64_t h = hq / G;
      for (std::int64_t i = 0; i < Sq; ++i) {
        const std::int64_t n = T - Sq + i + 1;
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < n; ++j) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < D; ++d) dot += static_cast<double>(q.at(b, hq, i, d)) * k.at(b, h, j, d);
          s[static_cast<std::size_t>(j)] = dot * scale;
          mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        }
        double sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (std::int64_t j = 0; j < n; ++j) {
          const double p = std::exp(s[static_cast<std::size_t>(j)] - mx);
          sum += p;
          for (std::int64_t d = 0; d < Dv; ++d) acc[static_cast<std::size_t>(d)] += p * v.at(b, h, j, d);
        }
        for (std::int64_t d = 0; d < Dv; ++d) {
          out.set(b, hq, i, d, static_cast<float>(acc[static_cast<std::size_t>(d)] / sum));
        }
      }
    }
}

}  // namespace skvq::ref
