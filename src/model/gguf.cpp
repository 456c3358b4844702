// GGUF (version 3) reader and writer for llama-architecture models with F32,
// F16 or BF16 tensors and the vocabulary embedded (llama.cpp's key and
// tensor names; pieces use U+2581 for spaces, as llama.cpp's SPM vocab does).
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>
#include <map>
#include <variant>

#include "core/open_input.hpp"
#include "model/model.hpp"
#include "skvq/dtype.hpp"
#include "skvq/error.hpp"

namespace skvq::model {

namespace {

enum : std::uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kStr, kArr, kU64, kI64, kF64 };
enum : std::uint32_t { kTF32 = 0, kTF16 = 1, kTBF16 = 30 };
const std::string kSpace = "\xe2\x96\x81";  // U+2581

std::string to_spm(const std::string& s) {
  std::string o;
  for (char c : s) o += c == ' ' ? kSpace : std::string(1, c);
  return o;
}

std::string from_spm(const std::string& s) {
  std::string o;
  for (std::size_t i = 0; i < s.size();) {
    if (s.compare(i, 3, kSpace) == 0) {
      o += ' ';
      i += 3;
    } else {
      o += s[i++];
    }
  }
  return o;
}

// ---- writer ----
class Out {
 public:
  template <typename T>
  void put(T v) {
    b_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    put<std::uint64_t>(s.size());
    b_ += s;
  }
  void key(const std::string& k, std::uint32_t type) {
    str(k);
    put(type);
  }
  std::string& bytes() { return b_; }

 private:
  std::string b_;
};

// ---- reader ----
struct Value {
  std::uint32_t type = 0;
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string> scalar;
  std::uint32_t elem_type = 0;
  std::vector<std::string> strs;
  std::vector<double> nums;
};

class In {
 public:
  In(std::string_view b, std::string path) : b_(b), path_(std::move(path)) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string str() {
    const auto n = get<std::uint64_t>();
    if (n > (1u << 24)) fail("a string of " + std::to_string(n) + " bytes is implausible");
    need(static_cast<std::size_t>(n));
    std::string s(b_.data() + pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  double num(std::uint32_t t) {
    switch (t) {
      case kU8: return get<std::uint8_t>();
      case kI8: return get<std::int8_t>();
      case kU16: return get<std::uint16_t>();
      case kI16: return get<std::int16_t>();
      case kU32: return get<std::uint32_t>();
      case kI32: return get<std::int32_t>();
      case kF32: return get<float>();
      case kBool: return get<std::uint8_t>();
      case kU64: return static_cast<double>(get<std::uint64_t>());
      case kI64: return static_cast<double>(get<std::int64_t>());
      case kF64: return get<double>();
    }
    fail("unknown value type " + std::to_string(t));
  }
  Value value(std::uint32_t t) {
    Value v;
    v.type = t;
    if (t == kStr) {
      v.scalar = str();
    } else if (t == kArr) {
      v.elem_type = get<std::uint32_t>();
      const auto n = get<std::uint64_t>();
      if (n > (1u << 24)) fail("an array of " + std::to_string(n) + " elements is implausible");
      for (std::uint64_t i = 0; i < n; ++i) {
        if (v.elem_type == kStr) v.strs.push_back(str());
        else if (v.elem_type == kArr) fail("nested arrays are not supported");
        else v.nums.push_back(num(v.elem_type));
      }
    } else {
      v.scalar = num(t);
    }
    return v;
  }
  std::size_t pos() const { return pos_; }
  void seek(std::size_t p) {
    if (p > b_.size()) fail("offset past the end of the file");
    pos_ = p;
  }
  [[noreturn]] void fail(const std::string& what) const { throw Error("skvq: gguf " + path_ + ": " + what); }
  void need(std::size_t n) const {
    if (n > b_.size() - pos_) fail("truncated at offset " + std::to_string(pos_));
  }

 private:
  std::string_view b_;
  std::string path_;
  std::size_t pos_ = 0;
};

struct TensorInfo {
  std::vector<std::uint64_t> dims;
  std::uint32_t type = 0;
  std::uint64_t offset = 0;
};

}  // namespace

std::string gguf_bytes(const Model& m, const Tokenizer& tok, const std::string& dtype) {
  std::uint32_t tt;
  if (dtype == "f32") tt = kTF32;
  else if (dtype == "f16") tt = kTF16;
  else if (dtype == "bf16") tt = kTBF16;
  else throw Error("skvq: convert: --dtype " + dtype + " must be f32, f16 or bf16");
  const ModelConfig& c = m.cfg;
  struct T {
    std::string name;
    std::vector<std::uint64_t> dims;  // ne0 fastest
    const std::vector<float>* data;
  };
  std::vector<T> ts;
  const auto dim = static_cast<std::uint64_t>(c.dim), hid = static_cast<std::uint64_t>(c.hidden_dim);
  const auto kv = static_cast<std::uint64_t>(c.kv_dim()), V = static_cast<std::uint64_t>(c.vocab_size);
  ts.push_back({"token_embd.weight", {dim, V}, &m.tok_embeddings});
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const auto& l = m.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    ts.push_back({p + "attn_norm.weight", {dim}, &l.attn_norm});
    ts.push_back({p + "attn_q.weight", {dim, dim}, &l.wq});
    ts.push_back({p + "attn_k.weight", {dim, kv}, &l.wk});
    ts.push_back({p + "attn_v.weight", {dim, kv}, &l.wv});
    ts.push_back({p + "attn_output.weight", {dim, dim}, &l.wo});
    ts.push_back({p + "ffn_norm.weight", {dim}, &l.ffn_norm});
    ts.push_back({p + "ffn_gate.weight", {dim, hid}, &l.w1});
    ts.push_back({p + "ffn_down.weight", {hid, dim}, &l.w2});
    ts.push_back({p + "ffn_up.weight", {dim, hid}, &l.w3});
  }
  ts.push_back({"output_norm.weight", {dim}, &m.final_norm});
  if (!c.shared_classifier) ts.push_back({"output.weight", {dim, V}, &m.wcls});

  Out o;
  o.bytes() = "GGUF";
  o.put<std::uint32_t>(3);
  o.put<std::uint64_t>(ts.size());
  const std::uint64_t n_kv = 18;
  o.put<std::uint64_t>(n_kv);
  o.key("general.architecture", kStr), o.str("llama");
  o.key("general.name", kStr), o.str("skvq-convert");
  o.key("general.alignment", kU32), o.put<std::uint32_t>(32);
  o.key("llama.context_length", kU32), o.put<std::uint32_t>(static_cast<std::uint32_t>(c.seq_len));
  o.key("llama.embedding_length", kU32), o.put<std::uint32_t>(static_cast<std::uint32_t>(c.dim));
  o.key("llama.block_count", kU32), o.put<std::uint32_t>(static_cast<std::uint32_t>(c.n_layers));
  o.key("llama.feed_forward_length", kU32), o.put<std::uint32_t>(static_cast<std::uint32_t>(c.hidden_dim));
  o.key("llama.attention.head_count", kU32), o.put<std::uint32_t>(static_cast<std::uint32_t>(c.n_heads));
  o.key("llama.attention.head_count_kv", kU32), o.put<std::uint32_t>(static_cast<std::uint32_t>(c.n_kv_heads));
  o.key("llama.rope.dimension_count", kU32), o.put<std::uint32_t>(static_cast<std::uint32_t>(c.head_dim()));
  o.key("llama.rope.freq_base", kF32), o.put<float>(c.rope_theta);
  o.key("llama.attention.layer_norm_rms_epsilon", kF32), o.put<float>(c.norm_eps);
  o.key("tokenizer.ggml.model", kStr), o.str("llama");
  o.key("tokenizer.ggml.tokens", kArr), o.put<std::uint32_t>(kStr), o.put<std::uint64_t>(static_cast<std::uint64_t>(tok.size()));
  for (const auto& p : tok.pieces()) o.str(to_spm(p));
  o.key("tokenizer.ggml.scores", kArr), o.put<std::uint32_t>(kF32), o.put<std::uint64_t>(static_cast<std::uint64_t>(tok.size()));
  for (float s : tok.scores()) o.put<float>(s);
  o.key("tokenizer.ggml.bos_token_id", kU32), o.put<std::uint32_t>(static_cast<std::uint32_t>(tok.bos()));
  o.key("tokenizer.ggml.eos_token_id", kU32), o.put<std::uint32_t>(static_cast<std::uint32_t>(tok.eos()));
  o.key("tokenizer.ggml.add_space_prefix", kBool), o.put<std::uint8_t>(tok.add_space_prefix() ? 1 : 0);
  const std::size_t esz = tt == kTF32 ? 4 : 2;
  std::uint64_t off = 0;
  for (const auto& t : ts) {
    o.str(t.name);
    o.put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) o.put<std::uint64_t>(d);
    o.put<std::uint32_t>(tt);
    o.put<std::uint64_t>(off);
    off += (t.data->size() * esz + 31) / 32 * 32;
  }
  std::string& b = o.bytes();
  b.append((32 - b.size() % 32) % 32, '\0');
  for (const auto& t : ts) {
    const std::size_t start = b.size();
    for (float x : *t.data) {
      if (tt == kTF32) b.append(reinterpret_cast<const char*>(&x), 4);
      else {
        const std::uint16_t h = tt == kTF16 ? f32_to_f16(x) : f32_to_bf16(x);
        b.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    b.append((32 - (b.size() - start) % 32) % 32, '\0');
  }
  return std::move(b);
}

void write_gguf(const Model& m, const Tokenizer& tok, const std::string& path, const std::string& dtype) {
  const std::string b = gguf_bytes(m, tok, dtype);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
  if (!f) throw Error("skvq: convert: cannot write " + path);
}

Model load_gguf(const std::string& path, Tokenizer* tok) {
  std::ifstream f;
  if (const std::string why = open_input(f, path); !why.empty()) throw Error("skvq: gguf " + path + ": " + why);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_gguf(bytes, path, tok);
}

Model parse_gguf(std::string_view bytes, const std::string& path, Tokenizer* tok) {
  In in(bytes, path);
  if (bytes.size() < 24 || bytes.compare(0, 4, "GGUF") != 0) in.fail("not a GGUF file (bad magic)");
  in.seek(4);
  const auto version = in.get<std::uint32_t>();
  if (version < 2 || version > 3) in.fail("GGUF version " + std::to_string(version) + " is not supported (2, 3)");
  const auto n_tensors = in.get<std::uint64_t>();
  const auto n_kv = in.get<std::uint64_t>();
  if (n_tensors > (1u << 20) || n_kv > (1u << 20)) in.fail("implausible tensor or key count");
  std::map<std::string, Value> kv;
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::string k = in.str();
    const auto t = in.get<std::uint32_t>();
    if (t > kF64) in.fail("key " + k + " has unknown value type " + std::to_string(t));
    kv[k] = in.value(t);
  }
  auto num = [&](const std::string& k, bool required, double dflt) -> double {
    auto it = kv.find(k);
    if (it == kv.end()) {
      if (required) in.fail("metadata key " + k + " is missing");
      return dflt;
    }
    if (it->second.type == kStr || it->second.type == kArr) in.fail("metadata key " + k + " is not a number");
    return std::visit([](auto&& x) -> double {
      using X = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<X, std::string>) return 0.0;
      else return static_cast<double>(x);
    }, it->second.scalar);
  };
  // Numbers read as doubles, checked before they are narrowed (a cast out of
  // range is undefined): ints must be whole and in int range, floats finite
  // and in float range.
  auto as_text = [](double x) {
    std::ostringstream o;
    o << x;
    return o.str();
  };
  auto integer = [&](const std::string& k, bool required, int dflt) -> int {
    const double x = num(k, required, dflt);
    if (!(x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max()) || x != std::trunc(x)) {
      in.fail("metadata key " + k + "=" + as_text(x) + " is not an integer in int range");
    }
    return static_cast<int>(x);
  };
  auto single = [&](const std::string& what, double x) -> float {
    if (!(std::fabs(x) <= std::numeric_limits<float>::max())) in.fail(what + "=" + as_text(x) + " is not a finite float");
    return static_cast<float>(x);
  };
  const auto arch = kv.find("general.architecture");
  if (arch == kv.end() || arch->second.type != kStr || std::get<std::string>(arch->second.scalar) != "llama") {
    in.fail("general.architecture must be \"llama\"");
  }
  Model m;
  ModelConfig& c = m.cfg;
  c.dim = integer("llama.embedding_length", true, 0);
  c.hidden_dim = integer("llama.feed_forward_length", true, 0);
  c.n_layers = integer("llama.block_count", true, 0);
  c.n_heads = integer("llama.attention.head_count", true, 0);
  c.n_kv_heads = integer("llama.attention.head_count_kv", false, c.n_heads);
  c.seq_len = integer("llama.context_length", true, 0);
  c.rope_theta = single("metadata key llama.rope.freq_base", num("llama.rope.freq_base", false, 10000.0));
  c.norm_eps = single("metadata key llama.attention.layer_norm_rms_epsilon",
                      num("llama.attention.layer_norm_rms_epsilon", false, 1e-5));
  const auto toks = kv.find("tokenizer.ggml.tokens");
  if (toks == kv.end() || toks->second.elem_type != kStr) in.fail("tokenizer.ggml.tokens is missing");
  c.vocab_size = static_cast<int>(toks->second.strs.size());
  validate_config(c, path);
  Tokenizer vocab;  // into *tok once everything has loaded
  {
    std::vector<std::string> pieces;
    for (const auto& s : toks->second.strs) pieces.push_back(from_spm(s));
    std::vector<float> scores(pieces.size(), 0.0f);
    const auto sc = kv.find("tokenizer.ggml.scores");
    if (sc != kv.end()) {
      if (sc->second.nums.size() != pieces.size()) in.fail("tokenizer.ggml.scores has the wrong length");
      for (std::size_t i = 0; i < pieces.size(); ++i) {
        scores[i] = single("tokenizer.ggml.scores[" + std::to_string(i) + "]", sc->second.nums[i]);
      }
    }
    const int bos = integer("tokenizer.ggml.bos_token_id", false, 1);
    const int eos = integer("tokenizer.ggml.eos_token_id", false, 2);
    if (bos < 0 || bos >= c.vocab_size || eos < 0 || eos >= c.vocab_size) in.fail("bos/eos token id out of range");
    vocab = Tokenizer(std::move(pieces), std::move(scores), bos, eos);
  }
  const int align_key = integer("general.alignment", false, 32);
  if (align_key < 1 || align_key > 4096) in.fail("general.alignment=" + std::to_string(align_key) + " is not in [1, 4096]");
  const auto align = static_cast<std::size_t>(align_key);
  std::map<std::string, TensorInfo> infos;
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    const std::string name = in.str();
    TensorInfo ti;
    const auto nd = in.get<std::uint32_t>();
    if (nd < 1 || nd > 4) in.fail("tensor " + name + " has " + std::to_string(nd) + " dims");
    for (std::uint32_t d = 0; d < nd; ++d) ti.dims.push_back(in.get<std::uint64_t>());
    ti.type = in.get<std::uint32_t>();
    ti.offset = in.get<std::uint64_t>();
    infos[name] = ti;
  }
  const std::size_t data_start = (in.pos() + align - 1) / align * align;
  auto load = [&](const std::string& name, std::vector<std::uint64_t> dims, bool required) {
    std::vector<float> out;
    const auto it = infos.find(name);
    if (it == infos.end()) {
      if (required) in.fail("tensor " + name + " is missing");
      return out;
    }
    const TensorInfo& ti = it->second;
    if (ti.dims != dims) in.fail("tensor " + name + " has unexpected dims");
    std::size_t n = 1;
    for (auto d : dims) n *= static_cast<std::size_t>(d);
    std::size_t esz = 0;
    if (ti.type == kTF32) esz = 4;
    else if (ti.type == kTF16 || ti.type == kTBF16) esz = 2;
    else in.fail("tensor " + name + " has type " + std::to_string(ti.type) + "; supported: F32, F16, BF16");
    if (ti.offset > bytes.size() || data_start + ti.offset + n * esz > bytes.size()) in.fail("tensor " + name + " data is truncated");
    const char* p = bytes.data() + data_start + ti.offset;
    out.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (esz == 4) std::memcpy(&out[i], p + 4 * i, 4);
      else {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = ti.type == kTF16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      if (!std::isfinite(out[i])) in.fail("tensor " + name + " holds a non-finite value");
    }
    return out;
  };
  const auto dim = static_cast<std::uint64_t>(c.dim), hid = static_cast<std::uint64_t>(c.hidden_dim);
  const auto kvd = static_cast<std::uint64_t>(c.kv_dim()), V = static_cast<std::uint64_t>(c.vocab_size);
  m.tok_embeddings = load("token_embd.weight", {dim, V}, true);
  m.layers.resize(static_cast<std::size_t>(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    auto& l = m.layers[static_cast<std::size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    l.attn_norm = load(p + "attn_norm.weight", {dim}, true);
    l.wq = load(p + "attn_q.weight", {dim, dim}, true);
    l.wk = load(p + "attn_k.weight", {dim, kvd}, true);
    l.wv = load(p + "attn_v.weight", {dim, kvd}, true);
    l.wo = load(p + "attn_output.weight", {dim, dim}, true);
    l.ffn_norm = load(p + "ffn_norm.weight", {dim}, true);
    l.w1 = load(p + "ffn_gate.weight", {dim, hid}, true);
    l.w2 = load(p + "ffn_down.weight", {hid, dim}, true);
    l.w3 = load(p + "ffn_up.weight", {dim, hid}, true);
  }
  m.final_norm = load("output_norm.weight", {dim}, true);
  m.wcls = load("output.weight", {dim, V}, false);
  c.shared_classifier = m.wcls.empty();
  *tok = std::move(vocab);
  return m;
}

}  // namespace skvq::model
