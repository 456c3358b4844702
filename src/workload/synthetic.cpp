// Synthetic LLM-like keys, values and queries.
#include "workload/synthetic.hpp"

#include <cmath>
#include <random>
#include <vector>

namespace skvq::workload {

Normal::Normal(std::uint32_t seed) : gen_(seed) {}

float Normal::operator()() {
  if (has_) {
    has_ = false;
    return spare_;
  }
  const double u1 = (static_cast<double>(gen_()) + 1.0) / 4294967297.0;
  const double u2 = static_cast<double>(gen_()) / 4294967296.0;
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
  has_ = true;
  return static_cast<float>(r * std::cos(2.0 * M_PI * u2));
}

std::uint32_t Normal::next() { return gen_(); }

void fill_normal(const TensorView& t, std::uint32_t seed, float scale) {
  Normal rng(seed);
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t h = 0; h < t.shape[1]; ++h)
      for (std::int64_t s = 0; s < t.shape[2]; ++s)
        for (std::int64_t d = 0; d < t.shape[3]; ++d) t.set(b, h, s, d, rng() * scale);
}

void make_kv(const SyntheticSpec& sp, DType dtype, Tensor* keys, Tensor* values) {
  const std::int64_t B = sp.batch, H = sp.num_kv_heads, T = sp.kv_len, D = sp.head_dim;
  *keys = Tensor(dtype, {B, H, T, D});
  *values = Tensor(dtype, {B, H, T, D});
  Normal rng(sp.seed);
  const TensorView k = keys->view(), v = values->view();
  for (std::int64_t h = 0; h < H; ++h) {
    // per-head channel statistics: mean offsets, scales, a few outliers
    std::vector<float> mean(static_cast<std::size_t>(D)), scale(static_cast<std::size_t>(D)),
        vscale(static_cast<std::size_t>(D));
    for (std::int64_t d = 0; d < D; ++d) {
      mean[static_cast<std::size_t>(d)] = 0.5f * rng();
      scale[static_cast<std::size_t>(d)] = 0.5f + 0.5f * std::fabs(rng());
      vscale[static_cast<std::size_t>(d)] = 0.5f + 0.25f * std::fabs(rng());
    }
    for (int o = 0; o < sp.outlier_channels && D > 0; ++o) {
      const auto c = static_cast<std::size_t>(rng.next() % static_cast<std::uint32_t>(D));
      scale[c] *= 10.0f;
      mean[c] *= 10.0f;
    }
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        const float sink = t < sp.sink_rows ? 4.0f : 1.0f;
        for (std::int64_t d = 0; d + 1 < D; d += 2) {  // RoPE on interleaved pairs
          const float x0 = sink * (mean[static_cast<std::size_t>(d)] + scale[static_cast<std::size_t>(d)] * rng());
          const float x1 =
              sink * (mean[static_cast<std::size_t>(d + 1)] + scale[static_cast<std::size_t>(d + 1)] * rng());
          const double freq = std::pow(10000.0, -static_cast<double>(d) / static_cast<double>(D));
          const double a = static_cast<double>(t) * freq;
          const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
          k.set(b, h, t, d, x0 * c - x1 * s);
          k.set(b, h, t, d + 1, x0 * s + x1 * c);
        }
        if (D % 2) k.set(b, h, t, D - 1, sink * (mean[static_cast<std::size_t>(D - 1)] + rng()));
        for (std::int64_t d = 0; d < D; ++d) v.set(b, h, t, d, sink * vscale[static_cast<std::size_t>(d)] * rng());
      }
  }
}

Tensor make_queries(const SyntheticSpec& sp, std::int64_t num_q_heads, std::int64_t n, const Tensor& keys,
                    DType dtype) {
  const std::int64_t B = sp.batch, H = sp.num_kv_heads, T = sp.kv_len, D = sp.head_dim;
  Tensor q(dtype, {B, num_q_heads, n, D});
  Normal rng(sp.seed ^ 0x9e3779b9u);
  const TensorView kv = keys.view();
  const float sharp = 1.5f / std::sqrt(static_cast<float>(D));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t hq = 0; hq < num_q_heads; ++hq) {
      const std::int64_t h = hq / (num_q_heads / H);
      for (std::int64_t i = 0; i < n; ++i) {
        // aim at one random key, plus noise: a peaked but not one-hot softmax
        const std::int64_t target = static_cast<std::int64_t>(rng.next() % static_cast<std::uint32_t>(T));
        for (std::int64_t d = 0; d < D; ++d) {
          q.view().set(b, hq, i, d, sharp * kv.at(b, h, target, d) + 0.5f * rng());
        }
      }
    }
  return q;
}

}  // namespace skvq::workload
