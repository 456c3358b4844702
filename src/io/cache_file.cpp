// Prompt-cache files: safetensors layout (8-byte little-endian header length,
// JSON header, raw tensor bytes), with the cache's own state as JSON in the
// header's "__metadata__" and a CRC-32 of the data and of that JSON.
//
// Tensors, per layer l (absent when empty):
//   skvq layers, side s in {keys, values}:
//     l{l}.{s}.codes  U8   [bytes]            chunks' code streams, concatenated
//     l{l}.{s}.lo     U8   [bytes]            chunks' lo, concatenated
//     l{l}.{s}.scale  U8   [bytes]            chunks' scale, concatenated
//     l{l}.{s}.sinks  F16|BF16|F32 [B, H, sinks, D]
//     l{l}.{s}.tail   F16|BF16|F32 [B, H, offset - q_end, D]
//     l{l}.{s}.perm   I32  [H, D]
//   plain layers: l{l}.keys, l{l}.values  [B, H, offset, D]
//   extras: x.{name} I32 [n]
#include "skvq/cache_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <type_traits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/open_input.hpp"
#include "core/skvq_state.hpp"
#include "io/report_json.hpp"
#include "skvq/error.hpp"

namespace skvq {

namespace detail {

struct CacheFileAccess {
  static std::vector<std::byte>& k(PlainCache& c) { return c.k_; }
  static std::vector<std::byte>& v(PlainCache& c) { return c.v_; }
  static const std::vector<std::byte>& k(const PlainCache& c) { return c.k_; }
  static const std::vector<std::byte>& v(const PlainCache& c) { return c.v_; }
  static void restore(PlainCache& c, DType dt, std::int64_t B, std::int64_t H, std::int64_t dk, std::int64_t dv,
                      std::int64_t offset, std::int64_t seen) {
    c.initialized_ = true;
    c.dtype_ = dt;
    c.batch_ = B;
    c.heads_ = H;
    c.dk_ = dk;
    c.dv_ = dv;
    c.offset_ = offset;
    c.cap_ = offset;
    c.tokens_seen_ = seen;
  }
  static std::int64_t cap(const PlainCache& c) { return c.cap_; }
  static std::int64_t tokens_seen(const PlainCache& c) { return c.tokens_seen_; }
  static const std::optional<std::int64_t>& max_ctx(const PlainCache& c) { return c.max_ctx_; }
};

}  // namespace detail

namespace {

using nlohmann::json;
using detail::CacheFileAccess;

constexpr const char* kFormatName = "skvq-prompt-cache";

std::uint32_t crc32(const std::uint8_t* p, std::size_t n, std::uint32_t crc = 0) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::string st_dtype(DType t) { return t == DType::f16 ? "F16" : t == DType::bf16 ? "BF16" : "F32"; }

DType parse_dtype_name(const std::string& s) {
  if (s == "float16") return DType::f16;
  if (s == "bfloat16") return DType::bf16;
  if (s == "float32") return DType::f32;
  throw Error("skvq: cache file: unknown dtype '" + s + "'");
}

class Writer {
 public:
  void add(const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape, const void* data,
           std::size_t n) {
    if (n == 0) return;
    const std::size_t begin = data_.size();
    data_.insert(data_.end(), static_cast<const std::uint8_t*>(data), static_cast<const std::uint8_t*>(data) + n);
    header_[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, data_.size()}}};
  }
  std::vector<std::uint8_t> finish(const json& meta) {
    const std::string meta_str = meta.dump();
    header_["__metadata__"] = {{"format", kFormatName},
                               {"format_version", std::to_string(kCacheFileVersion)},
                               {"skvq", meta_str},
                               {"skvq_crc32", std::to_string(crc32(reinterpret_cast<const std::uint8_t*>(meta_str.data()), meta_str.size()))},
                               {"data_crc32", std::to_string(crc32(data_.data(), data_.size()))}};
    std::string h = header_.dump();
    h.append((8 - h.size() % 8) % 8, ' ');
    std::vector<std::uint8_t> out(8 + h.size() + data_.size());
    const std::uint64_t hl = h.size();
    for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(hl >> (8 * i));
    std::memcpy(out.data() + 8, h.data(), h.size());
    if (!data_.empty()) std::memcpy(out.data() + 8 + h.size(), data_.data(), data_.size());
    return out;
  }

 private:
  json header_ = json::object();
  std::vector<std::uint8_t> data_;
};

template <typename Vec>
std::vector<std::uint8_t> concat(const std::vector<detail::PackedChunk>& chunks, Vec detail::PackedChunk::*field) {
  std::vector<std::uint8_t> out;
  for (const auto& c : chunks) out.insert(out.end(), (c.*field).begin(), (c.*field).end());
  return out;
}

void write_skvq(Writer& w, const std::string& pre, const SkvqCache& cache, json& lj) {
  const detail::SkvqState& st = cache.state();
  lj["kind"] = "skvq";
  lj["config"] = io::config_json(st.cfg);
  lj["initialized"] = st.initialized;
  lj["dtype"] = std::string(dtype_name(st.dtype));
  lj["batch"] = st.batch;
  lj["heads"] = st.heads;
  lj["offset"] = st.offset;
  lj["q_end"] = st.q_end;
  lj["fp16_key_bytes"] = st.fp16_key_bytes;
  lj["fp16_value_bytes"] = st.fp16_value_bytes;
  lj["tokens_seen"] = st.tokens_seen;
  lj["value_head_dim"] = st.v.head_dim;
  if (!st.initialized) return;
  const std::int64_t es = st.esize(), r = st.cfg.window, live = st.offset - st.q_end;
  for (int side = 0; side < 2; ++side) {
    const detail::Side& s = side == 0 ? st.k : st.v;
    const std::string p = pre + (side == 0 ? "keys." : "values.");
    const auto codes = concat(s.chunks, &detail::PackedChunk::codes);
    const auto lo = concat(s.chunks, &detail::PackedChunk::lo);
    const auto sc = concat(s.chunks, &detail::PackedChunk::scale);
    w.add(p + "codes", "U8", {static_cast<std::int64_t>(codes.size())}, codes.data(), codes.size());
    w.add(p + "lo", "U8", {static_cast<std::int64_t>(lo.size())}, lo.data(), lo.size());
    w.add(p + "scale", "U8", {static_cast<std::int64_t>(sc.size())}, sc.data(), sc.size());
    w.add(p + "sinks", st_dtype(st.dtype), {st.batch, st.heads, st.sinks_held(), s.head_dim}, s.sinks.data(), s.sinks.size());
    std::vector<std::byte> tail(static_cast<std::size_t>(st.batch * st.heads * live * s.head_dim * es));
    for (std::int64_t bh = 0; bh < st.batch * st.heads && live > 0; ++bh) {
      std::memcpy(tail.data() + bh * live * s.head_dim * es, s.tail.data() + bh * r * s.head_dim * es,
                  static_cast<std::size_t>(live * s.head_dim * es));
    }
    w.add(p + "tail", st_dtype(st.dtype), {st.batch, st.heads, live, s.head_dim}, tail.data(), tail.size());
    w.add(p + "perm", "I32", {st.heads, s.head_dim}, s.perm.data(), s.perm.size() * 4);
  }
}

void write_plain(Writer& w, const std::string& pre, const PlainCache& c, json& lj) {
  lj["kind"] = "plain";
  const auto& mc = CacheFileAccess::max_ctx(c);
  lj["max_ctx"] = mc ? json(*mc) : json(nullptr);
  lj["tokens_seen"] = CacheFileAccess::tokens_seen(c);
  lj["offset"] = c.offset();
  if (c.offset() == 0 && CacheFileAccess::k(c).empty()) {
    lj["initialized"] = false;
    return;
  }
  lj["initialized"] = true;
  const TensorView k = c.keys(), v = c.values();
  lj["dtype"] = std::string(dtype_name(k.dtype));
  lj["batch"] = k.shape[0];
  lj["heads"] = k.shape[1];
  lj["head_dim"] = k.shape[3];
  lj["value_head_dim"] = v.shape[3];
  for (const auto& [name, view] : {std::pair{"keys", k}, std::pair{"values", v}}) {
    const Tensor t = Tensor::copy_of(view);
    w.add(pre + name, st_dtype(view.dtype), {view.shape[0], view.shape[1], view.shape[2], view.shape[3]}, t.data(),
          t.nbytes());
  }
}

// ---- reading ----

// JSON integers only: nlohmann converts floats to integers with undefined
// behaviour when out of range, so every integer read checks the type first.
std::vector<std::int64_t> int_list(const json& j, const std::string& what) {
  if (!j.is_array()) throw Error("skvq: cache file: " + what + " is not a list");
  std::vector<std::int64_t> out;
  for (const auto& e : j) {
    if (!e.is_number_integer()) throw Error("skvq: cache file: " + what + " holds a non-integer " + e.dump());
    if (e.is_number_unsigned() && e.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      throw Error("skvq: cache file: " + what + " holds an out-of-range " + e.dump());
    }
    out.push_back(e.get<std::int64_t>());
  }
  return out;
}

std::int64_t int_value(const json& j, const std::string& what) {
  if (!j.is_number_integer() || (j.is_number_unsigned() && j.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))) {
    throw Error("skvq: cache file: " + what + " is not an integer: " + j.dump());
  }
  return j.get<std::int64_t>();
}

struct Reader {
  std::span<const std::uint8_t> data;
  json header;

  const json* find(const std::string& name) const {
    auto it = header.find(name);
    return it == header.end() ? nullptr : &*it;
  }
  // The bytes of tensor `name`, checked against dtype and shape; empty when
  // absent and `expect_bytes` is 0.
  std::span<const std::uint8_t> get(const std::string& name, const std::string& dtype,
                                    const std::vector<std::int64_t>& shape, std::size_t expect_bytes) const {
    const json* t = find(name);
    if (t == nullptr) {
      if (expect_bytes == 0) return {};
      throw Error("skvq: cache file: tensor '" + name + "' is missing");
    }
    if (!t->is_object() || !t->contains("dtype") || !t->contains("shape") || !t->contains("data_offsets")) {
      throw Error("skvq: cache file: tensor '" + name + "' entry is malformed");
    }
    if ((*t)["dtype"] != dtype) {
      throw Error("skvq: cache file: tensor '" + name + "' has dtype " + (*t)["dtype"].dump() + ", expected " + dtype);
    }
    if (int_list((*t)["shape"], "tensor '" + name + "' shape") != shape) {
      throw Error("skvq: cache file: tensor '" + name + "' has shape " + (*t)["shape"].dump() + ", expected " +
                  json(shape).dump());
    }
    const auto off = int_list((*t)["data_offsets"], "tensor '" + name + "' data_offsets");
    if (off.size() != 2 || off[0] < 0 || off[0] > off[1] || static_cast<std::uint64_t>(off[1]) > data.size() ||
        static_cast<std::uint64_t>(off[1] - off[0]) != expect_bytes) {
      throw Error("skvq: cache file: tensor '" + name + "' data offsets " + (*t)["data_offsets"].dump() +
                  " are inconsistent with its shape or the file size");
    }
    return data.subspan(static_cast<std::size_t>(off[0]), static_cast<std::size_t>(off[1] - off[0]));
  }
};

template <typename T>
T field(const json& j, const char* name) {
  if (!j.contains(name)) throw Error(std::string("skvq: cache file: layer field '") + name + "' is missing");
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return static_cast<T>(int_value(j[name], std::string("layer field '") + name + "'"));
  }
  try {
    return j[name].get<T>();
  } catch (const json::exception&) {
    throw Error(std::string("skvq: cache file: layer field '") + name + "' has the wrong type");
  }
}

Config config_from_json(const json& j) {
  Config c;
  if (!j.is_object()) throw Error("skvq: cache file: layer config is not an object");
  for (const auto& [k, v] : j.items()) {
    std::string text;
    if (v.is_null()) text = "none";
    else if (v.is_string()) text = v.get<std::string>();
    else if (v.is_boolean()) text = v.get<bool>() ? "true" : "false";
    else if (v.is_number_integer()) text = std::to_string(int_value(v, "config field '" + k + "'"));
    else if (v.is_number()) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.9g", v.get<double>());
      text = buf;
    } else {
      throw Error("skvq: cache file: config field '" + k + "' has an unsupported value");
    }
    c.set(k, text);
  }
  c.validate();
  return c;
}

std::unique_ptr<LayerCache> read_skvq(const Reader& rd, const std::string& pre, const json& lj) {
  const Config cfg = config_from_json(field<json>(lj, "config"));
  auto cache = std::make_unique<SkvqCache>(cfg);
  detail::SkvqState& st = cache->mutable_state();
  st.initialized = field<bool>(lj, "initialized");
  st.fp16_key_bytes = field<std::int64_t>(lj, "fp16_key_bytes");
  st.fp16_value_bytes = field<std::int64_t>(lj, "fp16_value_bytes");
  st.tokens_seen = field<std::int64_t>(lj, "tokens_seen");
  if (!st.initialized) {
    if (st.fp16_key_bytes || st.tokens_seen || field<std::int64_t>(lj, "offset")) {
      throw Error("skvq: cache file: an uninitialized layer has non-zero counters");
    }
    return cache;
  }
  st.dtype = parse_dtype_name(field<std::string>(lj, "dtype"));
  st.batch = field<std::int64_t>(lj, "batch");
  st.heads = field<std::int64_t>(lj, "heads");
  st.offset = field<std::int64_t>(lj, "offset");
  st.q_end = field<std::int64_t>(lj, "q_end");
  const std::int64_t dv = field<std::int64_t>(lj, "value_head_dim");
  const std::int64_t r = cfg.window;
  const std::int64_t limit = std::int64_t{1} << 40;
  if (st.batch < 1 || st.heads < 1 || st.batch > (1 << 24) || st.heads > (1 << 24) || st.batch * st.heads > (1 << 24) || dv < 1 || dv > (1 << 16) || st.offset < 1 ||
      st.offset > limit || st.q_end < 0 || st.q_end % r != 0 || st.q_end > st.offset || st.offset - st.q_end >= r ||
      st.tokens_seen < st.offset || st.fp16_key_bytes < 0 || st.fp16_value_bytes < 0 ||
      (cfg.max_ctx && st.offset > *cfg.max_ctx)) {
    throw Error("skvq: cache file: layer counters are inconsistent (batch " + std::to_string(st.batch) + ", heads " +
                std::to_string(st.heads) + ", offset " + std::to_string(st.offset) + ", q_end " +
                std::to_string(st.q_end) + ")");
  }
  // Bounds that keep every size product below 2^62 and loops proportional to the file.
  if (cfg.head_dim > (1 << 16) || cfg.window > (1 << 24) || cfg.group_size > (1 << 16) ||
      static_cast<double>(st.batch * st.heads) * cfg.window * static_cast<double>(std::max<std::int64_t>(cfg.head_dim, dv)) >
          static_cast<double>(std::int64_t{1} << 40) ||
      st.q_end / cfg.window > static_cast<std::int64_t>(rd.data.size())) {
    throw Error("skvq: cache file: layer sizes (head_dim " + std::to_string(cfg.head_dim) + ", window " +
                std::to_string(cfg.window) + ", q_end " + std::to_string(st.q_end) + ") do not fit the file");
  }
  st.k.head_dim = cfg.head_dim;
  st.k.bits = cfg.bits_key;
  st.v.head_dim = static_cast<int>(dv);
  st.v.bits = cfg.bits_value;
  const std::int64_t es = st.esize(), BH = st.batch * st.heads, live = st.offset - st.q_end;
  const std::string sd = st_dtype(st.dtype);
  const std::int64_t n_chunks = st.q_end / r;
  for (int side = 0; side < 2; ++side) {
    detail::Side& s = side == 0 ? st.k : st.v;
    const std::string p = pre + (side == 0 ? "keys." : "values.");
    const std::int64_t D = s.head_dim;
    std::int64_t code_total = 0, meta_total = 0;
    for (std::int64_t c = 0; c < n_chunks; ++c) {
      const std::int64_t n = c == 0 ? r - cfg.n_sink : r;
      code_total += BH * st.codes_per_head(s, n);
      meta_total += BH * st.meta_per_head(s, n);
    }
    const auto codes = rd.get(p + "codes", "U8", {code_total}, static_cast<std::size_t>(code_total));
    const auto lo = rd.get(p + "lo", "U8", {meta_total}, static_cast<std::size_t>(meta_total));
    const auto sc = rd.get(p + "scale", "U8", {meta_total}, static_cast<std::size_t>(meta_total));
    std::int64_t co = 0, mo = 0;
    for (std::int64_t c = 0; c < n_chunks; ++c) {
      detail::PackedChunk ch;
      ch.n_rows = c == 0 ? r - cfg.n_sink : r;
      const std::int64_t cb = BH * st.codes_per_head(s, ch.n_rows), mb = BH * st.meta_per_head(s, ch.n_rows);
      ch.codes.assign(codes.begin() + co, codes.begin() + co + cb);
      ch.lo.assign(lo.begin() + mo, lo.begin() + mo + mb);
      ch.scale.assign(sc.begin() + mo, sc.begin() + mo + mb);
      co += cb;
      mo += mb;
      // Metadata must decode to finite values with a positive scale.
      const int m = meta_bytes(cfg.metadata);
      for (std::size_t e = 0; e < ch.lo.size(); e += static_cast<std::size_t>(m)) {
        float l = 0.0f, sv = 1.0f;
        if (cfg.metadata == MetaType::fp32) {
          std::memcpy(&l, ch.lo.data() + e, 4);
          std::memcpy(&sv, ch.scale.data() + e, 4);
        } else if (cfg.metadata == MetaType::fp16) {
          std::uint16_t a, b;
          std::memcpy(&a, ch.lo.data() + e, 2);
          std::memcpy(&b, ch.scale.data() + e, 2);
          l = f16_to_f32(a);
          sv = f16_to_f32(b);
        } else {
          if ((ch.lo[e] & 0x7f) == 0x7f || (ch.scale[e] & 0x7f) == 0x7f) l = NAN;
          sv = (ch.scale[e] & 0x80) ? -1.0f : 1.0f;
        }
        if (!std::isfinite(l) || !std::isfinite(sv) || !(sv > 0)) {
          throw Error("skvq: cache file: tensor '" + p + "lo/scale' holds a non-finite or non-positive value");
        }
      }
      s.chunks.push_back(std::move(ch));
    }
    const std::int64_t sinks = st.sinks_held();
    const auto sk = rd.get(p + "sinks", sd, {st.batch, st.heads, sinks, D}, static_cast<std::size_t>(BH * sinks * D * es));
    s.sinks.assign(reinterpret_cast<const std::byte*>(sk.data()), reinterpret_cast<const std::byte*>(sk.data()) + sk.size());
    const auto tl = rd.get(p + "tail", sd, {st.batch, st.heads, live, D}, static_cast<std::size_t>(BH * live * D * es));
    s.tail.assign(static_cast<std::size_t>(BH * r * D * es), std::byte{0});
    for (std::int64_t bh = 0; bh < BH && live > 0; ++bh) {
      std::memcpy(s.tail.data() + bh * r * D * es, tl.data() + bh * live * D * es, static_cast<std::size_t>(live * D * es));
    }
    const bool want_perm = cfg.reorder && st.q_end > 0;
    const auto pm = rd.get(p + "perm", "I32", {st.heads, D}, want_perm ? static_cast<std::size_t>(st.heads * D * 4) : 0);
    if (want_perm != !pm.empty()) throw Error("skvq: cache file: tensor '" + p + "perm' presence contradicts the config");
    if (want_perm) {
      s.perm.resize(static_cast<std::size_t>(st.heads * D));
      std::memcpy(s.perm.data(), pm.data(), pm.size());
      s.inv.assign(s.perm.size(), -1);
      for (std::int64_t h = 0; h < st.heads; ++h)
        for (std::int64_t j = 0; j < D; ++j) {
          const std::int32_t c = s.perm[static_cast<std::size_t>(h * D + j)];
          if (c < 0 || c >= D || s.inv[static_cast<std::size_t>(h * D + c)] != -1) {
            throw Error("skvq: cache file: tensor '" + p + "perm' row " + std::to_string(h) + " is not a permutation");
          }
          s.inv[static_cast<std::size_t>(h * D + c)] = static_cast<std::int32_t>(j);
        }
    }
  }
  // Non-finite exact rows would break attention: the input check never lets them in.
  for (const detail::Side* s : {&st.k, &st.v}) {
    for (const auto* buf : {&s->sinks, &s->tail}) {
      for (std::size_t e = 0; e < buf->size(); e += static_cast<std::size_t>(es)) {
        if (!std::isfinite(load_as_f32(buf->data() + e, st.dtype))) {
          throw Error("skvq: cache file: an exact sink or tail row holds a non-finite value");
        }
      }
    }
  }
  if (cfg.dense_view) {  // rebuild the dense view from what was loaded
    st.dense_cap = std::max(st.offset, r);
    for (detail::Side* s : {&st.k, &st.v}) {
      s->dense.assign(static_cast<std::size_t>(BH * st.dense_cap * s->head_dim * es), std::byte{0});
    }
    TensorView kv, vv;
    kv.data = st.k.dense.data();
    vv.data = st.v.dense.data();
    kv.dtype = vv.dtype = st.dtype;
    kv.shape = {st.batch, st.heads, st.offset, st.k.head_dim};
    vv.shape = {st.batch, st.heads, st.offset, st.v.head_dim};
    kv.strides = {st.heads * st.dense_cap * st.k.head_dim, st.dense_cap * st.k.head_dim, st.k.head_dim, 1};
    vv.strides = {st.heads * st.dense_cap * st.v.head_dim, st.dense_cap * st.v.head_dim, st.v.head_dim, 1};
    cache->fetch_into(kv, vv);
  }
  return cache;
}

std::unique_ptr<LayerCache> read_plain(const Reader& rd, const std::string& pre, const json& lj) {
  std::optional<std::int64_t> mc;
  if (lj.contains("max_ctx") && !lj["max_ctx"].is_null()) mc = field<std::int64_t>(lj, "max_ctx");
  auto c = std::make_unique<PlainCache>(mc);
  if (!field<bool>(lj, "initialized")) return c;
  const DType dt = parse_dtype_name(field<std::string>(lj, "dtype"));
  const auto B = field<std::int64_t>(lj, "batch"), H = field<std::int64_t>(lj, "heads");
  const auto dk = field<std::int64_t>(lj, "head_dim"), dv = field<std::int64_t>(lj, "value_head_dim");
  const auto off = field<std::int64_t>(lj, "offset"), seen = field<std::int64_t>(lj, "tokens_seen");
  if (B < 1 || H < 1 || dk < 1 || dv < 1 || off < 0 || seen < off || B > (1 << 24) || H > (1 << 24) || B * H > (1 << 24) || dk > (1 << 16) ||
      dv > (1 << 16) || off > (std::int64_t{1} << 32) || (mc && off > *mc) ||
      static_cast<double>(B * H) * static_cast<double>(off) * static_cast<double>(dk + dv) *
              static_cast<double>(dtype_size(dt)) >
          static_cast<double>(rd.data.size()) + 1.0) {
    throw Error("skvq: cache file: plain layer counters are inconsistent");
  }
  const std::size_t es = dtype_size(dt);
  const auto k = rd.get(pre + "keys", st_dtype(dt), {B, H, off, dk}, static_cast<std::size_t>(B * H * off * dk) * es);
  const auto v = rd.get(pre + "values", st_dtype(dt), {B, H, off, dv}, static_cast<std::size_t>(B * H * off * dv) * es);
  CacheFileAccess::restore(*c, dt, B, H, dk, dv, off, seen);
  CacheFileAccess::k(*c).assign(reinterpret_cast<const std::byte*>(k.data()), reinterpret_cast<const std::byte*>(k.data()) + k.size());
  CacheFileAccess::v(*c).assign(reinterpret_cast<const std::byte*>(v.data()), reinterpret_cast<const std::byte*>(v.data()) + v.size());
  return c;
}

}  // namespace

std::vector<std::uint8_t> prompt_cache_bytes(const PromptCache& cache, const CacheFileExtras& extras) {
  Writer w;
  json meta;
  meta["layers"] = json::array();
  for (std::size_t l = 0; l < cache.size(); ++l) {
    json lj;
    const std::string pre = std::string("l") + std::to_string(l) + ".";
    if (const auto* s = dynamic_cast<const SkvqCache*>(&cache.layer(l))) write_skvq(w, pre, *s, lj);
    else if (const auto* p = dynamic_cast<const PlainCache*>(&cache.layer(l))) write_plain(w, pre, *p, lj);
    else throw Error("skvq: save: unsupported cache kind '" + cache.layer(l).kind() + "'");
    meta["layers"].push_back(lj);
  }
  meta["strings"] = extras.strings;
  json arrays = json::array();
  for (const auto& [name, vals] : extras.int_arrays) {
    w.add(std::string("x.") + name, "I32", {static_cast<std::int64_t>(vals.size())}, vals.data(), vals.size() * 4);
    arrays.push_back({{"name", name}, {"size", vals.size()}});
  }
  meta["int_arrays"] = arrays;
  return w.finish(meta);
}

PromptCache load_prompt_cache_bytes(std::span<const std::uint8_t> bytes, CacheFileExtras* extras) {
  if (bytes.size() < 8) throw Error("skvq: cache file: truncated (" + std::to_string(bytes.size()) + " bytes)");
  std::uint64_t hl = 0;
  for (int i = 0; i < 8; ++i) hl |= static_cast<std::uint64_t>(bytes[static_cast<std::size_t>(i)]) << (8 * i);
  if (hl < 2 || hl > bytes.size() - 8 || hl > (std::uint64_t{1} << 28)) {
    throw Error("skvq: cache file: header length " + std::to_string(hl) + " does not fit the file (" +
                std::to_string(bytes.size()) + " bytes): truncated or not a safetensors file");
  }
  Reader rd;
  rd.header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(hl), nullptr, false);
  if (rd.header.is_discarded() || !rd.header.is_object()) throw Error("skvq: cache file: header is not valid JSON");
  rd.data = bytes.subspan(8 + static_cast<std::size_t>(hl));
  const json* md = rd.find("__metadata__");
  if (md == nullptr || !md->is_object() || !md->contains("format") || (*md)["format"] != kFormatName) {
    throw Error("skvq: cache file: not an skvq prompt-cache file (safetensors metadata lacks format=skvq-prompt-cache)");
  }
  for (const char* k : {"format_version", "skvq", "skvq_crc32", "data_crc32"}) {
    if (!md->contains(k) || !(*md)[k].is_string()) throw Error(std::string("skvq: cache file: metadata '") + k + "' is missing");
  }
  const std::string ver = (*md)["format_version"].get<std::string>();
  if (ver.empty() || ver.size() > 6 || ver.find_first_not_of("0123456789") != std::string::npos) {
    throw Error("skvq: cache file: format_version '" + ver + "' is malformed");
  }
  if (std::stoi(ver) > kCacheFileVersion) {
    throw Error("skvq: cache file: format version " + ver + " is newer than this skvq supports (" +
                std::to_string(kCacheFileVersion) + ")");
  }
  const std::string meta_str = (*md)["skvq"].get<std::string>();
#ifndef SKVQ_FUZZING  // the fuzzer build skips the checksum so that it reaches the structural checks
  if (std::to_string(crc32(reinterpret_cast<const std::uint8_t*>(meta_str.data()), meta_str.size())) != (*md)["skvq_crc32"] ||
      std::to_string(crc32(rd.data.data(), rd.data.size())) != (*md)["data_crc32"]) {
    throw Error("skvq: cache file: checksum mismatch: the file is corrupted");
  }
#endif
  const json meta = json::parse(meta_str, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("layers") || !meta["layers"].is_array()) {
    throw Error("skvq: cache file: skvq metadata is malformed");
  }
  PromptCache pc;
  try {
    for (std::size_t l = 0; l < meta["layers"].size(); ++l) {
      const json& lj = meta["layers"][l];
      const std::string pre = std::string("l") + std::to_string(l) + ".";
      if (!lj.is_object() || !lj.contains("kind")) throw Error("skvq: cache file: layer " + std::to_string(l) + " is malformed");
      if (lj["kind"] == "skvq") pc.push_back(read_skvq(rd, pre, lj));
      else if (lj["kind"] == "plain") pc.push_back(read_plain(rd, pre, lj));
      else throw Error("skvq: cache file: layer " + std::to_string(l) + " has unknown kind " + lj["kind"].dump());
    }
    if (extras) {
      *extras = {};
      if (meta.contains("strings")) extras->strings = meta["strings"].get<std::map<std::string, std::string>>();
      if (meta.contains("int_arrays")) {
        for (const auto& a : meta["int_arrays"]) {
          const auto name = a.at("name").get<std::string>();
          const auto n = int_value(a.at("size"), "extra array size");
          if (n < 0 || n > (std::int64_t{1} << 32)) throw Error("skvq: cache file: extra array size is malformed");
          const auto b = rd.get(std::string("x.") + name, "I32", {n}, static_cast<std::size_t>(n) * 4);
          std::vector<std::int32_t> v(static_cast<std::size_t>(n));
          if (n) std::memcpy(v.data(), b.data(), b.size());
          extras->int_arrays[name] = std::move(v);
        }
      }
    }
  } catch (const json::exception& e) {
    throw Error(std::string("skvq: cache file: metadata is malformed (") + e.what() + ")");
  }
  return pc;
}

PromptCache load_prompt_cache(const std::string& path, CacheFileExtras* extras) {
  std::ifstream f;
  if (const std::string why = open_input(f, path); !why.empty()) throw Error("skvq: cache file " + path + ": " + why);
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  try {
    return load_prompt_cache_bytes(bytes, extras);
  } catch (const Error& e) {
    throw Error("skvq: cache file " + path + ": " + std::string(e.what()).substr(std::string("skvq: cache file: ").size()));
  }
}

void save_prompt_cache(const PromptCache& cache, const std::string& path, const CacheFileExtras& extras) {
  const std::vector<std::uint8_t> bytes = prompt_cache_bytes(cache, extras);
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::path tmp = dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("skvq: save " + path + ": cannot create " + tmp.string() + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("skvq: save " + path + ": write failed: " + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error("skvq: save " + path + ": flush to disk failed: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error("skvq: save " + path + ": rename failed: " + std::strerror(err));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace skvq
