// Reference attention (see attend.hpp).
#include "ref/attend.hpp"

#include <cmath>
#include <vector>

namespace skvq::ref {

void kv_row(const AttendParams& p, int side, std::int64_t b, std::int64_t h, std::int64_t t, float* out) {
  if (p.st == nullptr) {
    const TensorView& src = side == 0 ? p.k : p.v;
    if (src.strides[3] == 1) {
      load_row_f32(src.ptr(b, h, t, 0), src.dtype, src.shape[3], out);
    } else {
      for (std::int64_t d = 0; d < src.shape[3]; ++d) out[d] = src.at(b, h, t, d);
    }
    return;
  }
  const detail::SkvqState& st = *p.st;
  const detail::Side& s = side == 0 ? st.k : st.v;
  const std::int64_t D = s.head_dim, bh = b * st.heads + h, r = st.cfg.window, es = st.esize();
  const std::int64_t sinks = st.sinks_held();
  if (t < sinks) {
    load_row_f32(s.sinks.data() + (bh * sinks + t) * D * es, st.dtype, D, out);
  } else if (t < st.q_end) {
    const auto c = static_cast<std::size_t>(t / r);
    st.dequantize(s, c, bh, t % r - st.first_row(c), 1, out, /*reference=*/true);
  } else {
    load_row_f32(s.tail.data() + (bh * r + t - st.q_end) * D * es, st.dtype, D, out);
  }
}

void attend(const AttendParams& p) {
  const std::int64_t G = p.num_q_heads / p.num_kv_heads, D = p.head_dim, Dv = p.v_head_dim;
  std::vector<float> q(static_cast<std::size_t>(D)), k(static_cast<std::size_t>(D)), v(static_cast<std::size_t>(Dv)),
      acc(static_cast<std::size_t>(Dv));
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t hq = 0; hq < p.num_q_heads; ++hq) {
      const std::int64_t h = hq / G;
      for (std::int64_t i = 0; i < p.sq; ++i) {
        for (std::int64_t d = 0; d < D; ++d) q[static_cast<std::size_t>(d)] = p.q.at(b, hq, i, d);
        const std::int64_t visible = p.kv_len - p.sq + i + 1;
        float m = -INFINITY, l = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::int64_t t = 0; t < visible; ++t) {
          kv_row(p, 0, b, h, t, k.data());
          float dot = 0.0f;
          for (std::int64_t d = 0; d < D; ++d) dot += q[static_cast<std::size_t>(d)] * k[static_cast<std::size_t>(d)];
          const float s = dot * p.scale;
          const float m_new = std::max(m, s);
          const float corr = std::exp(m - m_new);
          const float w = std::exp(s - m_new);
          l = l * corr + w;
          kv_row(p, 1, b, h, t, v.data());
          for (std::int64_t d = 0; d < Dv; ++d) {
            acc[static_cast<std::size_t>(d)] = acc[static_cast<std::size_t>(d)] * corr + w * v[static_cast<std::size_t>(d)];
          }
          m = m_new;
        }
        for (std::int64_t d = 0; d < Dv; ++d) p.out.set(b, hq, i, d, acc[static_cast<std::size_t>(d)] / l);
      }
    }
}

}  // namespace skvq::ref
