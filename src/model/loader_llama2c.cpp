// llama2.c checkpoints: legacy (version 0: 7-int32 header, negative
// vocab_size = separate classifier, freq_cis tables after the final norm),
// version 1 ("ak42", fp32) and version 2 ("ak42", int8 groups + fp32 scales).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "core/open_input.hpp"
#include "model/model.hpp"
#include "skvq/error.hpp"

namespace skvq::model {

namespace {

constexpr std::uint32_t kMagic = 0x616b3432;  // "ak42"

std::string read_all(const std::string& path) {
  std::ifstream f;
  if (const std::string why = open_input(f, path); !why.empty()) throw Error("skvq: model " + path + ": " + why);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

class Cursor {
 public:
  Cursor(std::string_view b, std::string path, std::size_t pos) : b_(b), path_(std::move(path)), pos_(pos) {}
  std::vector<float> f32(std::size_t n, const char* what) {
    need(n * 4, what);
    std::vector<float> v(n);
    std::memcpy(v.data(), b_.data() + pos_, n * 4);
    pos_ += n * 4;
    return v;
  }
  std::vector<float> q80(std::size_t n, std::size_t group, const char* what) {  // int8 values, then fp32 scales
    if (n % group != 0) {
      throw Error("skvq: model " + path_ + ": " + what + " has " + std::to_string(n) + " values, not a multiple of group_size=" +
                  std::to_string(group));
    }
    need(n + n / group * 4, what);
    std::vector<float> v(n);
    const auto* q = reinterpret_cast<const std::int8_t*>(b_.data() + pos_);
    std::vector<float> s(n / group);
    std::memcpy(s.data(), b_.data() + pos_ + n, n / group * 4);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(q[i]) * s[i / group];
    pos_ += n + n / group * 4;
    return v;
  }
  void skip(std::size_t n, const char* what) {
    need(n, what);
    pos_ += n;
  }
  std::size_t pos() const { return pos_; }

 private:
  void need(std::size_t n, const char* what) {
    if (n > b_.size() - pos_) {
      throw Error("skvq: model " + path_ + ": truncated: " + what + " needs " + std::to_string(n) + " bytes at offset " +
                  std::to_string(pos_) + ", file has " + std::to_string(b_.size()));
    }
  }
  std::string_view b_;
  std::string path_;
  std::size_t pos_;
};

void read_header(std::string_view b, std::size_t off, const std::string& path, ModelConfig* c, int* raw_vocab) {
  std::int32_t h[7];
  std::memcpy(h, b.data() + off, sizeof h);
  if (h[5] == std::numeric_limits<std::int32_t>::min()) {  // no positive counterpart
    throw Error("skvq: model " + path + ": vocab_size=" + std::to_string(h[5]) + " is invalid");
  }
  c->dim = h[0];
  c->hidden_dim = h[1];
  c->n_layers = h[2];
  c->n_heads = h[3];
  c->n_kv_heads = h[4];
  *raw_vocab = h[5];
  c->vocab_size = std::abs(h[5]);
  c->seq_len = h[6];
}

}  // namespace

void validate_config(const ModelConfig& c, const std::string& path) {
  auto bad = [&](const std::string& field, long long v, const std::string& why) {
    throw Error("skvq: model " + path + ": " + field + "=" + std::to_string(v) + " " + why);
  };
  if (c.dim < 1 || c.dim > 65536) bad("dim", c.dim, "must be in [1, 65536]");
  if (c.hidden_dim < 1 || c.hidden_dim > 262144) bad("hidden_dim", c.hidden_dim, "must be in [1, 262144]");
  if (c.n_layers < 1 || c.n_layers > 1024) bad("n_layers", c.n_layers, "must be in [1, 1024]");
  if (c.n_heads < 1 || c.dim % c.n_heads != 0) bad("n_heads", c.n_heads, "must divide dim=" + std::to_string(c.dim));
  if (c.head_dim() % 2 != 0) bad("head_dim", c.head_dim(), "must be even (RoPE rotates pairs)");
  if (c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads != 0) bad("n_kv_heads", c.n_kv_heads, "must divide n_heads=" + std::to_string(c.n_heads));
  if (c.vocab_size < 3 || c.vocab_size > (1 << 22)) bad("vocab_size", c.vocab_size, "must be in [3, 4194304]");
  if (c.seq_len < 1 || c.seq_len > (1 << 24)) bad("seq_len", c.seq_len, "must be in [1, 16777216]");
  auto bad_real = [&](const std::string& field, float v) {
    std::ostringstream o;
    o << v;
    throw Error("skvq: model " + path + ": " + field + "=" + o.str() + " must be positive and finite");
  };
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) bad_real("rope_theta", c.rope_theta);
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps)) bad_real("norm_eps", c.norm_eps);
}

Model load_llama2c(const std::string& path) { return parse_llama2c(read_all(path), path); }

Model parse_llama2c(std::string_view b, const std::string& path) {
  if (b.size() < 28) throw Error("skvq: model " + path + ": truncated header (" + std::to_string(b.size()) + " bytes)");
  Model m;
  ModelConfig& c = m.cfg;
  std::uint32_t magic = 0;
  std::memcpy(&magic, b.data(), 4);
  int version = 0, raw_vocab = 0, group = 0;
  std::size_t off = 0;
  if (magic == kMagic) {
    if (b.size() < 256) throw Error("skvq: model " + path + ": truncated header (" + std::to_string(b.size()) + " bytes)");
    std::int32_t v;
    std::memcpy(&v, b.data() + 4, 4);
    version = v;
    if (version != 1 && version != 2) {
      throw Error("skvq: model " + path + ": llama2.c export version " + std::to_string(version) + " is not supported (0, 1, 2)");
    }
    read_header(b, 8, path, &c, &raw_vocab);
    c.shared_classifier = b[36] != 0;
    if (version == 2) {
      std::memcpy(&group, b.data() + 37, 4);
      if (group < 1 || group > (1 << 20)) throw Error("skvq: model " + path + ": group_size=" + std::to_string(group) + " is invalid");
    }
    off = 256;
  } else {
    read_header(b, 0, path, &c, &raw_vocab);
    c.shared_classifier = raw_vocab > 0;
    off = 28;
  }
  validate_config(c, path);
  const std::size_t dim = static_cast<std::size_t>(c.dim), hid = static_cast<std::size_t>(c.hidden_dim);
  const std::size_t L = static_cast<std::size_t>(c.n_layers), kv = static_cast<std::size_t>(c.kv_dim());
  const std::size_t V = static_cast<std::size_t>(c.vocab_size), hs = static_cast<std::size_t>(c.head_dim());
  // Expected size, checked before reading anything big.
  const std::size_t n_matrix = V * dim + L * (2 * dim * dim + 2 * kv * dim + 3 * hid * dim) + (c.shared_classifier ? 0 : V * dim);
  const std::size_t n_norm = 2 * L * dim + dim;
  std::size_t expect = 0;
  if (version == 0) expect = 28 + 4 * (n_matrix + n_norm + static_cast<std::size_t>(c.seq_len) * hs);
  else if (version == 1) expect = 256 + 4 * (n_matrix + n_norm);
  else expect = 256 + 4 * n_norm + n_matrix + 4 * (n_matrix / static_cast<std::size_t>(group));
  if (b.size() != expect) {
    throw Error("skvq: model " + path + ": file has " + std::to_string(b.size()) + " bytes but its header (version " +
                std::to_string(version) + ") implies " + std::to_string(expect) + ": truncated or not this format");
  }
  m.layers.resize(L);
  Cursor cur(b, path, off);
  auto per_layer = [&](std::vector<float> LayerWeights::*field, std::size_t n, const char* what, bool quant) {
    for (auto& l : m.layers) {
      l.*field = quant ? cur.q80(n, static_cast<std::size_t>(group), what) : cur.f32(n, what);
    }
  };
  if (version == 0) {
    m.tok_embeddings = cur.f32(V * dim, "token embedding");
    per_layer(&LayerWeights::attn_norm, dim, "attention rmsnorm", false);
    per_layer(&LayerWeights::wq, dim * dim, "wq", false);
    per_layer(&LayerWeights::wk, kv * dim, "wk", false);
    per_layer(&LayerWeights::wv, kv * dim, "wv", false);
    per_layer(&LayerWeights::wo, dim * dim, "wo", false);
    per_layer(&LayerWeights::ffn_norm, dim, "ffn rmsnorm", false);
    per_layer(&LayerWeights::w1, hid * dim, "w1", false);
    per_layer(&LayerWeights::w2, dim * hid, "w2", false);
    per_layer(&LayerWeights::w3, hid * dim, "w3", false);
    m.final_norm = cur.f32(dim, "final rmsnorm");
    cur.skip(static_cast<std::size_t>(c.seq_len) * hs * 4, "freq_cis");
    if (!c.shared_classifier) m.wcls = cur.f32(V * dim, "classifier");
  } else {
    const bool q = version == 2;
    per_layer(&LayerWeights::attn_norm, dim, "attention rmsnorm", false);
    per_layer(&LayerWeights::ffn_norm, dim, "ffn rmsnorm", false);
    m.final_norm = cur.f32(dim, "final rmsnorm");
    m.tok_embeddings = q ? cur.q80(V * dim, static_cast<std::size_t>(group), "token embedding") : cur.f32(V * dim, "token embedding");
    per_layer(&LayerWeights::wq, dim * dim, "wq", q);
    per_layer(&LayerWeights::wk, kv * dim, "wk", q);
    per_layer(&LayerWeights::wv, kv * dim, "wv", q);
    per_layer(&LayerWeights::wo, dim * dim, "wo", q);
    per_layer(&LayerWeights::w1, hid * dim, "w1", q);
    per_layer(&LayerWeights::w2, dim * hid, "w2", q);
    per_layer(&LayerWeights::w3, hid * dim, "w3", q);
    if (!c.shared_classifier) m.wcls = q ? cur.q80(V * dim, static_cast<std::size_t>(group), "classifier") : cur.f32(V * dim, "classifier");
  }
  auto finite = [&](const std::vector<float>& w) {
    for (float x : w) {
      if (!std::isfinite(x)) throw Error("skvq: model " + path + ": weights hold a non-finite value");
    }
  };
  finite(m.tok_embeddings);
  finite(m.final_norm);
  finite(m.wcls);
  for (const auto& l : m.layers) {
    for (const auto* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3, &l.attn_norm, &l.ffn_norm}) finite(*w);
  }
  return m;
}

Model random_model(const ModelConfig& c, std::uint32_t seed) {
  validate_config(c, "random_model");
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  const auto dim = static_cast<std::size_t>(c.dim), hid = static_cast<std::size_t>(c.hidden_dim);
  const auto kv = static_cast<std::size_t>(c.kv_dim()), V = static_cast<std::size_t>(c.vocab_size);
  auto fill = [&](std::size_t n, float s) {
    std::vector<float> v(n);
    for (float& x : v) x = s * nd(rng);
    return v;
  };
  auto ones = [&](std::size_t n) { return std::vector<float>(n, 1.0f); };
  const float sd = 1.0f / std::sqrt(static_cast<float>(dim)), sh = 1.0f / std::sqrt(static_cast<float>(hid));
  Model m;
  m.cfg = c;
  m.tok_embeddings = fill(V * dim, 1.0f);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights l;
    l.attn_norm = ones(dim);
    l.wq = fill(dim * dim, sd);
    l.wk = fill(kv * dim, sd);
    l.wv = fill(kv * dim, sd);
    l.wo = fill(dim * dim, sd);
    l.ffn_norm = ones(dim);
    l.w1 = fill(hid * dim, sd);
    l.w2 = fill(dim * hid, sh);
    l.w3 = fill(hid * dim, sd);
    m.layers.push_back(std::move(l));
  }
  m.final_norm = ones(dim);
  if (!c.shared_classifier) m.wcls = fill(V * dim, sd);
  return m;
}

std::string llama2c_bytes(const Model& m, int version, int group) {
  if (version < 0 || version > 2) throw Error("skvq: llama2c_bytes: version=" + std::to_string(version) + " must be 0, 1 or 2");
  if (version == 2 && (group < 1 || m.cfg.dim % group != 0)) {
    throw Error("skvq: llama2c_bytes: group=" + std::to_string(group) + " must divide dim=" + std::to_string(m.cfg.dim));
  }
  const ModelConfig& c = m.cfg;
  std::string b;
  auto put = [&](const void* p, std::size_t n) { b.append(static_cast<const char*>(p), n); };
  const std::int32_t h[7] = {c.dim,         c.hidden_dim, c.n_layers, c.n_heads,
                             c.n_kv_heads, c.shared_classifier || version > 0 ? c.vocab_size : -c.vocab_size, c.seq_len};
  if (version > 0) {
    put(&kMagic, 4);
    put(&version, 4);
    put(h, sizeof h);
    const std::uint8_t shared = c.shared_classifier;
    put(&shared, 1);
    if (version == 2) put(&group, 4);
    b.resize(256, '\0');
  } else {
    put(h, sizeof h);
  }
  auto f32 = [&](const std::vector<float>& v) { put(v.data(), v.size() * 4); };
  auto q80 = [&](const std::vector<float>& v) {  // int8 groups against their largest magnitude, then the scales
    const auto g = static_cast<std::size_t>(group);
    std::vector<std::int8_t> q(v.size());
    std::vector<float> s(v.size() / g);
    for (std::size_t gi = 0; gi < s.size(); ++gi) {
      float mx = 0;
      for (std::size_t k = 0; k < g; ++k) mx = std::max(mx, std::fabs(v[gi * g + k]));
      s[gi] = mx / 127.0f;
      for (std::size_t k = 0; k < g; ++k) q[gi * g + k] = static_cast<std::int8_t>(s[gi] > 0 ? std::nearbyint(v[gi * g + k] / s[gi]) : 0);
    }
    put(q.data(), q.size());
    put(s.data(), s.size() * 4);
  };
  auto w = [&](const std::vector<float>& v) { version == 2 ? q80(v) : f32(v); };
  auto layers = [&](std::vector<float> LayerWeights::*f, bool matrix) {
    for (const auto& l : m.layers) matrix ? w(l.*f) : f32(l.*f);
  };
  using LW = LayerWeights;
  if (version == 0) {
    f32(m.tok_embeddings);
    layers(&LW::attn_norm, false);
    for (auto f : {&LW::wq, &LW::wk, &LW::wv, &LW::wo}) layers(f, true);
    layers(&LW::ffn_norm, false);
    for (auto f : {&LW::w1, &LW::w2, &LW::w3}) layers(f, true);
    f32(m.final_norm);
    b.append(static_cast<std::size_t>(c.seq_len) * static_cast<std::size_t>(c.head_dim()) * 4, '\0');  // freq_cis (unused)
  } else {
    layers(&LW::attn_norm, false);
    layers(&LW::ffn_norm, false);
    f32(m.final_norm);
    w(m.tok_embeddings);
    for (auto f : {&LW::wq, &LW::wk, &LW::wv, &LW::wo, &LW::w1, &LW::w2, &LW::w3}) layers(f, true);
  }
  if (!c.shared_classifier) w(m.wcls);
  return b;
}

Model load_model(const std::string& path, const std::string& tokenizer_path, Tokenizer* tok) {
  std::ifstream f;
  if (const std::string why = open_input(f, path); !why.empty()) throw Error("skvq: model " + path + ": " + why);
  char magic[4] = {0, 0, 0, 0};
  f.read(magic, 4);
  if (std::memcmp(magic, "GGUF", 4) == 0) {
    Model m = load_gguf(path, tok);
    if (!tokenizer_path.empty()) *tok = Tokenizer::load_llama2c(tokenizer_path, m.cfg.vocab_size);
    return m;
  }
  Model m = load_llama2c(path);
  std::string tp = tokenizer_path;
  if (tp.empty()) {  // a tokenizer beside the checkpoint
    namespace fs = std::filesystem;
    const fs::path dir = fs::path(path).parent_path();
    for (const char* name : {"tokenizer.bin", "tok105.bin"}) {
      if (fs::exists(dir / name)) {
        tp = (dir / name).string();
        break;
      }
    }
    if (tp.empty()) {
      for (const auto& e : fs::directory_iterator(dir.empty() ? fs::path(".") : dir)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("tok", 0) == 0 && e.path().extension() == ".bin") {
          tp = e.path().string();
          break;
        }
      }
    }
    if (tp.empty()) throw Error("skvq: model " + path + ": no tokenizer given (--tokenizer) and none found beside it");
  }
  *tok = Tokenizer::load_llama2c(tp, m.cfg.vocab_size);
  return m;
}

}  // namespace skvq::model
