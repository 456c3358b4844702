// Transformer runner (llama architecture, fp32, OpenBLAS GEMMs).
#include "model/runner.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "ref/attention.hpp"
#include "skvq/attention.hpp"
#include "skvq/error.hpp"

namespace skvq::model {

namespace {

// y[n, out] = x[n, in] . w[out, in]^T
void matmul(const float* x, const float* w, float* y, int n, int in, int out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

void rmsnorm(const float* x, const float* w, float* out, int n_rows, int dim, float eps) {
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<std::size_t>(r) * dim;
    float ss = 0.0f;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    ss = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int i = 0; i < dim; ++i) out[static_cast<std::size_t>(r) * dim + i] = w[i] * (ss * xr[i]);
  }
}

// llama2.c RoPE: interleaved pairs (2i, 2i+1) of each head.
void rope(float* v, int n_rows, int width, int head_dim, std::int64_t pos0, float theta) {
  for (int r = 0; r < n_rows; ++r) {
    const float pos = static_cast<float>(pos0 + r);
    float* row = v + static_cast<std::size_t>(r) * width;
    for (int i = 0; i < width; i += 2) {
      const int hd = i % head_dim;
      const float freq = 1.0f / std::pow(theta, static_cast<float>(hd) / static_cast<float>(head_dim));
      const float val = pos * freq;
      const float fcr = std::cos(val), fci = std::sin(val);
      const float a = row[i], b = row[i + 1];
      row[i] = a * fcr - b * fci;
      row[i + 1] = a * fci + b * fcr;
    }
  }
}

// [n, heads * hd] rows -> [1, heads, n, hd] tensor of dtype dt
Tensor to_heads(const float* x, int n, int heads, int hd, DType dt) {
  Tensor t(dt, {1, heads, n, hd});
  const TensorView v = t.view();
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < n; ++i)
      store_row_f32(v.ptr(0, h, i, 0), dt, hd, x + static_cast<std::size_t>(i) * heads * hd + static_cast<std::size_t>(h) * hd);
  return t;
}

// Attention for one layer: q [1, n_heads, n, hd] f32, k/v [1, n_kv_heads, n, hd]
// fp16 (the new rows, RoPE applied) -> out [1, n_heads, n, hd] f32.
using AttnFn = Runner::Attention;

// The transformer body over tokens at positions [pos0, pos0 + n); returns the
// final-normed hidden states [n, dim].
std::vector<float> run_layers(const Model& m, std::span<const int> tokens, std::int64_t pos0, const AttnFn& attn) {
  const ModelConfig& c = m.cfg;
  const int n = static_cast<int>(tokens.size()), dim = c.dim, hd = c.head_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  std::vector<float> x(static_cast<std::size_t>(n) * dim), xb(x.size()), q(x.size()), att(x.size()), tmp(x.size());
  std::vector<float> k(static_cast<std::size_t>(n) * kvd), v(k.size());
  std::vector<float> h1(static_cast<std::size_t>(n) * hid), h3(h1.size());
  for (int i = 0; i < n; ++i) {
    std::copy_n(m.tok_embeddings.data() + static_cast<std::size_t>(tokens[static_cast<std::size_t>(i)]) * dim, dim,
                x.data() + static_cast<std::size_t>(i) * dim);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = m.layers[static_cast<std::size_t>(l)];
    rmsnorm(x.data(), w.attn_norm.data(), xb.data(), n, dim, c.norm_eps);
    matmul(xb.data(), w.wq.data(), q.data(), n, dim, dim);
    matmul(xb.data(), w.wk.data(), k.data(), n, dim, kvd);
    matmul(xb.data(), w.wv.data(), v.data(), n, dim, kvd);
    rope(q.data(), n, dim, hd, pos0, c.rope_theta);
    rope(k.data(), n, kvd, hd, pos0, c.rope_theta);
    const Tensor kt = to_heads(k.data(), n, c.n_kv_heads, hd, DType::f16);
    const Tensor vt = to_heads(v.data(), n, c.n_kv_heads, hd, DType::f16);
    const Tensor qt = to_heads(q.data(), n, c.n_heads, hd, DType::f32);
    Tensor ot(DType::f32, {1, c.n_heads, n, hd});
    attn(l, qt, kt, vt, ot);
    for (int h = 0; h < c.n_heads; ++h)
      for (int i = 0; i < n; ++i)
        std::copy_n(reinterpret_cast<const float*>(ot.view().ptr(0, h, i, 0)), hd,
                    att.data() + static_cast<std::size_t>(i) * dim + static_cast<std::size_t>(h) * hd);
    matmul(att.data(), w.wo.data(), tmp.data(), n, dim, dim);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    rmsnorm(x.data(), w.ffn_norm.data(), xb.data(), n, dim, c.norm_eps);
    matmul(xb.data(), w.w1.data(), h1.data(), n, dim, hid);
    matmul(xb.data(), w.w3.data(), h3.data(), n, dim, hid);
    for (std::size_t i = 0; i < h1.size(); ++i) {
      const float g = h1[i];
      h1[i] = g * (1.0f / (1.0f + std::exp(-g))) * h3[i];
    }
    matmul(h1.data(), w.w2.data(), tmp.data(), n, hid, dim);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  }
  rmsnorm(x.data(), m.final_norm.data(), xb.data(), n, dim, c.norm_eps);
  return xb;
}

}  // namespace

PromptCache Runner::make_cache(CacheKind kind, const Config& cfg) const {
  Config c = cfg;
  c.dense_view = false;
  if (!c.max_ctx) c.max_ctx = std::max(m_.cfg.seq_len, 1);
  ModelDesc d = ModelDesc::uniform(m_.cfg.n_layers, m_.cfg.head_dim());
  return PromptCache::build(d, kind, c);
}

namespace {

void check_tokens(std::span<const int> tokens, int V) {
  if (tokens.empty()) throw Error("skvq: forward: no tokens");
  for (int t : tokens) {
    if (t < 0 || t >= V) throw Error("skvq: forward: token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  }
}

// The classifier over the last rows of h (n rows of the model's dim): all n (all_logits) or the
// last alone, into out.
void classify(const Model& m, const std::vector<float>& h, int n, bool all_logits, float* out) {
  const int rows = all_logits ? n : 1;
  matmul(h.data() + static_cast<std::size_t>(n - rows) * m.cfg.dim, m.classifier(), out, rows, m.cfg.dim, m.cfg.vocab_size);
}

}  // namespace

std::vector<float> Runner::forward_with(std::span<const int> tokens, std::int64_t pos0, const Attention& attention,
                                        bool all_logits) const {
  const ModelConfig& c = m_.cfg;
  check_tokens(tokens, c.vocab_size);
  if (pos0 < 0) throw Error("skvq: forward_with: pos0=" + std::to_string(pos0) + " must be >= 0");
  const std::vector<float> h = run_layers(m_, tokens, pos0, attention);
  std::vector<float> logits((all_logits ? tokens.size() : 1) * static_cast<std::size_t>(c.vocab_size));
  classify(m_, h, static_cast<int>(tokens.size()), all_logits, logits.data());
  return logits;
}

std::vector<float> Runner::forward(std::span<const int> tokens, PromptCache& cache, bool all_logits) const {
  const int V = m_.cfg.vocab_size;
  std::vector<float> logits(static_cast<std::size_t>(all_logits ? tokens.size() : 1) * V);
  check_tokens(tokens, V);
  if (cache.size() != static_cast<std::size_t>(m_.cfg.n_layers)) {
    throw Error("skvq: forward: the prompt cache has " + std::to_string(cache.size()) + " layers, the model " +
                std::to_string(m_.cfg.n_layers));
  }
  // Pieces that never flush a window except with their last token.
  std::size_t done = 0;
  while (done < tokens.size()) {
    std::size_t n = tokens.size() - done;
    if (const auto* s = dynamic_cast<const SkvqCache*>(&cache.layer(0))) {
      n = piece_before_flush(n, s->config().window, s->offset() - s->q_end());
    }
    const bool last_piece = done + n == tokens.size();
    float* out = all_logits ? logits.data() + done * static_cast<std::size_t>(V) : logits.data();
    forward_piece(tokens.subspan(done, n), cache, out, all_logits, all_logits || last_piece);
    done += n;
  }
  return logits;
}

void Runner::forward_piece(std::span<const int> tokens, PromptCache& cache, float* logits, bool all_logits,
                           bool want_logits) const {
  const ModelConfig& c = m_.cfg;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim()));
  const std::vector<float> h = run_layers(m_, tokens, cache.layer(0).offset(),
                                          [&](int l, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
                                            LayerCache& lc = cache.layer(static_cast<std::size_t>(l));
                                            lc.append(k.view(), v.view());
                                            attend(lc, q.view(), scale, out.view(), opts_);
                                          });
  if (want_logits) classify(m_, h, static_cast<int>(tokens.size()), all_logits, logits);
}

std::size_t piece_before_flush(std::size_t n, std::int64_t window, std::int64_t live) {
  const std::int64_t until_flush = window - live;  // tokens until (and including) the flushing one
  if (static_cast<std::int64_t>(n) >= until_flush) n = static_cast<std::size_t>(until_flush > 1 ? until_flush - 1 : 1);
  return n;
}

std::vector<float> forward_no_cache(const Model& m, std::span<const int> tokens, NoCacheAttention how) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.cfg.head_dim()));
  return Runner(m).forward_with(tokens, 0, [&](int, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
    if (how == NoCacheAttention::float64) ref::dense_attention(q.view(), k.view(), v.view(), scale, out.view());
    else attend_dense(q.view(), k.view(), v.view(), scale, out.view());
  });
}

}  // namespace skvq::model
