// SkvqCache: the state machine of spec sections 2-6 and 9 (append, flush
// frontier, sinks, frozen permutations, accounting) over a real packed store.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "core/input_check.hpp"
#include "core/quant_params.hpp"
#include "core/skvq_state.hpp"
#include "core/thread_pool.hpp"
#include "cpu/convert_simd.hpp"
#include "cpu/quantize_simd.hpp"
#include "ref/dequantize.hpp"
#include "ref/meta.hpp"
#include "ref/quantize.hpp"
#include "skvq/error.hpp"
#include "skvq/layer_cache.hpp"

namespace skvq {

using detail::PackedChunk;
using detail::Side;
using detail::SkvqState;

void detail::SkvqState::dequantize(const Side& s, std::size_t c, std::int64_t bh, std::int64_t i0, std::int64_t n,
                                   float* out, bool reference) const {
  const PackedChunk& ch = s.chunks[c];
  const std::int64_t cph = codes_per_head(s, ch.n_rows);
  const std::int64_t mph = meta_per_head(s, ch.n_rows);
  const std::int64_t mrow = groups(s) * meta_bytes(cfg.metadata);
  const std::int32_t* perm = s.perm.empty() ? nullptr : s.perm.data() + (bh % heads) * s.head_dim;
  const std::uint8_t* codes = ch.codes.data() + bh * cph;
  const std::uint8_t* lo = ch.lo.data() + bh * mph + i0 * mrow;
  const std::uint8_t* sc = ch.scale.data() + bh * mph + i0 * mrow;
  if (reference || kernel == Kernel::reference) {
    for (std::int64_t i = 0; i < n; ++i) {
      ref::dequantize_row(codes, cph, i0 + i, s.head_dim, s.bits, cfg.group_size, cfg.metadata, lo + i * mrow,
                          sc + i * mrow, perm, out + i * s.head_dim);
    }
    return;
  }
  cpu::dequantize_rows(codes, cph, i0, n, s.head_dim, s.bits, cfg.group_size, cfg.metadata, lo, sc, mrow, perm, out);
}

namespace {

// Rows [t0, t0 + n) of `src` for every (b, h) into a [B, H, cap, D] buffer at row `row0`; on up to
// `threads` of the pool's threads when the rows are many (ThreadPool::parallel_rows).
void copy_rows(const TensorView& src, std::int64_t t0, std::int64_t n, std::byte* dst,
               std::int64_t cap, std::int64_t row0, int threads) {
  const std::int64_t B = src.shape[0], H = src.shape[1], D = src.shape[3];
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(src.dtype));
  const bool rows_contiguous = src.strides[3] == 1 && src.strides[2] == D;
  // rows [i0, i1) of the n of head bh
  const auto rows = [&](std::int64_t bh, std::int64_t i0, std::int64_t i1) {
    const std::int64_t b = bh / H, h = bh % H;
    if (rows_contiguous) {  // the rows of (b, h) are one block in both
      std::memcpy(dst + ((bh * cap) + row0 + i0) * D * es, src.ptr(b, h, t0 + i0, 0),
                  static_cast<std::size_t>((i1 - i0) * D * es));
      return;
    }
    for (std::int64_t i = i0; i < i1; ++i) {
      std::byte* out = dst + ((bh * cap) + row0 + i) * D * es;
      if (src.strides[3] == 1) {
        std::memcpy(out, src.ptr(b, h, t0 + i, 0), static_cast<std::size_t>(D * es));
      } else {
        for (std::int64_t d = 0; d < D; ++d) std::memcpy(out + d * es, src.ptr(b, h, t0 + i, d), es);
      }
    }
  };
  if (B * H * n * D < detail::kParallelElements) threads = 1;
  detail::ThreadPool::global().parallel_rows(B * H, n, threads, rows);
}

// Threads for the cache's own work: set_num_threads' count, 0 meaning the whole pool.
int cache_threads(const SkvqState& st) {
  const int pool = detail::ThreadPool::global().size();
  return st.threads > 0 ? std::min(st.threads, pool) : pool;
}

// Where a flush reads a side's rows: a [B, H, T, D] view of the cache's dtype whose window w starts at
// token t0 + w * window: the tail buffer (one window, the rows appended a few at a time), or an
// append's input (whole windows straight from the caller's tensor, in any strides).
struct RowSource {
  TensorView rows;
  std::int64_t t0 = 0;
  static RowSource tail(const SkvqState& st, const Side& s) {
    return {TensorView::contiguous(const_cast<std::byte*>(s.tail.data()), st.dtype,
                                   {st.batch, st.heads, st.cfg.window, s.head_dim}),
            0};
  }
  // Rows [row, row + n) of window w of head bh as n x D float32.
  void load(const SkvqState& st, std::int64_t w, std::int64_t bh, std::int64_t row, std::int64_t n, float* out) const {
    cpu::load_view_rows(rows, bh / st.heads, bh % st.heads, t0 + w * st.cfg.window + row, n, out);
  }
};

// Stable sort of channels by ascending range (max - min over the first
// window's B*r rows of head h), NaN last; frozen as perm, with its inverse.
// Heads in parallel.
void compute_perms(const SkvqState& st, Side& s, const RowSource& src) {
  const std::int64_t B = st.batch, H = st.heads, D = s.head_dim, r = st.cfg.window;
  s.perm.assign(static_cast<std::size_t>(H * D), 0);
  s.inv.assign(static_cast<std::size_t>(H * D), 0);
  detail::ThreadPool::global().parallel_for(H, cache_threads(st), [&](std::int64_t h) {
    std::vector<float> mn(D, INFINITY), mx(D, -INFINITY), range(D), x(D);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < r; ++t) {
        src.load(st, 0, b * H + h, t, 1, x.data());
        for (std::int64_t c = 0; c < D; ++c) {
          mn[c] = std::min(mn[c], x[c]);
          mx[c] = std::max(mx[c], x[c]);
        }
      }
    for (std::int64_t c = 0; c < D; ++c) range[c] = mx[c] - mn[c];
    std::int32_t* p = s.perm.data() + h * D;
    std::iota(p, p + D, 0);
    std::stable_sort(p, p + D, [&](std::int32_t a, std::int32_t b) {
      const float ra = range[a], rb = range[b];
      if (std::isnan(ra)) return false;
      if (std::isnan(rb)) return true;
      return ra < rb;
    });
    for (std::int64_t j = 0; j < D; ++j) s.inv[h * D + p[j]] = static_cast<std::int32_t>(j);
  });
}

// Per-thread scratch of the flush (grown, never shrunk).
struct Scratch {
  std::unique_ptr<float[]> x, lo, scale;
  std::unique_ptr<std::uint8_t[]> codes;
  std::size_t n_x = 0, n_meta = 0;
  void reserve(std::size_t nx, std::size_t nm) {
    if (nx > n_x) {
      x.reset(new float[nx]);
      codes.reset(new std::uint8_t[nx]);
      n_x = nx;
    }
    if (nm > n_meta) {
      lo.reset(new float[nm]);
      scale.reset(new float[nm]);
      n_meta = nm;
    }
  }
};

// How a window's nq rows a head are cut into tasks: blocks of `rows` rows (a
// multiple of 8, so that every block's codes start on a whole byte of the
// head's stream and no two tasks write one byte), `per_head` blocks a head,
// about four tasks a thread where the `units` (heads times windows times
// sides of one job) alone give fewer.
struct FlushTasks {
  std::int64_t rows = 0, per_head = 0;
};
FlushTasks flush_tasks(std::int64_t units, std::int64_t nq, int threads) {
  const std::int64_t want = (4 * static_cast<std::int64_t>(threads) + units - 1) / units;
  const std::int64_t blocks = std::clamp<std::int64_t>(want, 1, (nq + 7) / 8);
  FlushTasks t;
  t.rows = ((nq + blocks - 1) / blocks + 7) / 8 * 8;
  t.per_head = (nq + t.rows - 1) / t.rows;
  return t;
}

// Flushes n_w whole windows of both sides, the first at the frontier st.q_end, their rows read from
// src[0] (keys) and src[1] (values), in one job on the pool: each task quantizes, packs and stores
// the metadata of its own rows of one head of one window of one side. Advances q_end.
void flush_windows(SkvqState& st, const RowSource (&src)[2], std::int64_t n_w) {
  const Config& cfg = st.cfg;
  const std::int64_t r = cfg.window, BH = st.batch * st.heads;
  const bool first = st.q_end == 0;
  const std::int64_t skip = first ? cfg.n_sink : 0;  // (window 0's sink rows)
  Side* sides[2] = {&st.k, &st.v};
  if (first && cfg.reorder) {
    for (int i = 0; i < 2; ++i) compute_perms(st, *sides[i], src[i]);
  }
  const int m = meta_bytes(cfg.metadata);
  const int threads = cache_threads(st);
  // The chunks, [side][window], and the tasks: window by window, keys then values, BH heads of
  // per_head blocks each (window 0 of a first flush has nq = r - skip rows a head, others r).
  std::vector<PackedChunk> chunks[2];
  const FlushTasks full = flush_tasks(2 * BH * n_w, r, threads), part = flush_tasks(2 * BH * n_w, r - skip, threads);
  std::int64_t per_window[2];  // tasks of window 0 and of any other, a side
  per_window[0] = BH * (skip > 0 ? part.per_head : full.per_head);
  per_window[1] = BH * full.per_head;
  for (int i = 0; i < 2; ++i) {
    chunks[i].resize(static_cast<std::size_t>(n_w));
    for (std::int64_t w = 0; w < n_w; ++w) {
      PackedChunk& ch = chunks[i][static_cast<std::size_t>(w)];
      ch.n_rows = r - (w == 0 ? skip : 0);
      ch.codes.assign(static_cast<std::size_t>(BH * st.codes_per_head(*sides[i], ch.n_rows)), 0);
      ch.lo.assign(static_cast<std::size_t>(BH * ch.n_rows * st.groups(*sides[i]) * m), 0);
      ch.scale.assign(ch.lo.size(), 0);
    }
  }
  const std::vector<float> grid = cfg.clip_grid();
  detail::ThreadPool::global().parallel_for(2 * (per_window[0] + (n_w - 1) * per_window[1]), threads, [&](std::int64_t task) {
    std::int64_t w = 0, k = task;
    if (k >= 2 * per_window[0]) {
      k -= 2 * per_window[0];
      w = 1 + k / (2 * per_window[1]);
      k %= 2 * per_window[1];
    }
    const std::int64_t pw = per_window[w == 0 ? 0 : 1];
    const int i = static_cast<int>(k / pw);
    k %= pw;
    const Side& s = *sides[i];
    PackedChunk& ch = chunks[i][static_cast<std::size_t>(w)];
    const std::int64_t nq = ch.n_rows, row0 = r - nq;  // (row0: the window's first packed row)
    const FlushTasks& ft = nq == r ? full : part;
    const std::int64_t bh = k / ft.per_head, i0 = (k % ft.per_head) * ft.rows;
    const std::int64_t n = std::min(ft.rows, nq - i0);
    const std::int64_t D = s.head_dim;
    const int g = cfg.group_size, G = st.groups(s), P = G * g;
    // The rows as float32; the quantizer gathers them permuted and padded.
    thread_local Scratch scratch;
    scratch.reserve(static_cast<std::size_t>(n * P), static_cast<std::size_t>(n * G));
    src[i].load(st, w, bh, row0 + i0, n, scratch.x.get());
    QuantParams qp;
    qp.x = scratch.x.get();
    qp.n_rows = n;
    qp.dim = static_cast<int>(D);
    qp.perm = s.perm.empty() ? nullptr : s.perm.data() + (bh % st.heads) * D;
    qp.rows_per_perm = n;
    qp.n_perms = 1;
    qp.padded_dim = P;
    qp.group_size = g;
    qp.bits = s.bits;
    qp.grid = grid.data();
    qp.n_grid = static_cast<int>(grid.size());
    qp.meta = cfg.metadata;
    qp.codes = scratch.codes.get();
    qp.lo = scratch.lo.get();
    qp.scale = scratch.scale.get();
    if (st.kernel == Kernel::reference) ref::quantize_rows(qp);
    else cpu::quantize_rows(qp);
    const std::int64_t cph = st.codes_per_head(s, nq);
    const auto pack = st.kernel == Kernel::reference ? &ref::pack_codes : &cpu::pack_codes;
    for (std::int64_t j = 0; j < n; ++j) pack(qp.codes + j * P, D, s.bits, ch.codes.data() + bh * cph, (i0 + j) * D);
    const std::int64_t e0 = (bh * nq + i0) * G;
    for (std::int64_t e = 0; e < n * G; ++e) {
      ref::meta_store(ch.lo.data() + (e0 + e) * m, cfg.metadata, qp.lo[e]);
      ref::meta_store(ch.scale.data() + (e0 + e) * m, cfg.metadata, qp.scale[e]);
    }
  });
  for (int i = 0; i < 2; ++i) {
    Side& s = *sides[i];
    const std::int64_t D = s.head_dim, es = st.esize();
    if (skip > 0) {  // sink rows stay exact, apart from the packed store
      s.sinks.assign(static_cast<std::size_t>(BH * skip * D * es), std::byte{0});
      copy_rows(src[i].rows, src[i].t0, skip, s.sinks.data(), skip, 0, 1);
    }
    for (PackedChunk& ch : chunks[i]) s.chunks.push_back(std::move(ch));
    if (!s.dense.empty()) {  // the dense view now shows the reconstruction
      for (std::int64_t w = 0; w < n_w; ++w) {
        const std::size_t c = s.chunks.size() - static_cast<std::size_t>(n_w - w);
        const std::int64_t nq = s.chunks[c].n_rows, row0 = st.q_end + w * r + (r - nq);
        detail::ThreadPool::global().parallel_for(BH, threads, [&](std::int64_t bh) {
          thread_local std::vector<float> rec;
          rec.resize(static_cast<std::size_t>(nq * D));
          st.dequantize(s, c, bh, 0, nq, rec.data());
          for (std::int64_t j = 0; j < nq; ++j) {
            cpu::store_row_f32(s.dense.data() + (bh * st.dense_cap + row0 + j) * D * es, st.dtype, D, rec.data() + j * D);
          }
        });
      }
    }
  }
  st.q_end += n_w * r;
}

void grow_dense(SkvqState& st, Side& s, std::int64_t new_cap) {
  const std::int64_t BH = st.batch * st.heads, D = s.head_dim, es = st.esize();
  std::vector<std::byte> grown(static_cast<std::size_t>(BH * new_cap * D * es), std::byte{0});
  for (std::int64_t bh = 0; bh < BH && st.offset > 0; ++bh) {
    std::memcpy(grown.data() + bh * new_cap * D * es, s.dense.data() + bh * st.dense_cap * D * es,
                static_cast<std::size_t>(st.offset * D * es));
  }
  s.dense = std::move(grown);
}

TensorView dense_view_of(const SkvqState& st, const Side& s) {
  TensorView v;
  v.data = const_cast<std::byte*>(s.dense.data());
  v.dtype = st.dtype;
  v.shape = {st.batch, st.heads, st.offset, s.head_dim};
  v.strides = {st.heads * st.dense_cap * s.head_dim, st.dense_cap * s.head_dim, s.head_dim, 1};
  return v;
}

// Every check of an append, before anything changes.
void check_append(const SkvqState& st, const TensorView& k, const TensorView& v) {
  detail::check_kv_pair(k, v);
  const Config& cfg = st.cfg;
  if (k.shape[3] != cfg.head_dim) {
    throw Error("skvq: keys head dim D=" + std::to_string(k.shape[3]) + " differs from head_dim=" +
                std::to_string(cfg.head_dim));
  }
  if (st.initialized) {
    if (k.shape[0] != st.batch || k.shape[1] != st.heads) {
      throw Error("skvq: keys shape " + shape_string(k.shape) + " changes [B, H] from the cache's [" +
                  std::to_string(st.batch) + ", " + std::to_string(st.heads) + "]");
    }
    if (v.shape[3] != st.v.head_dim) {
      throw Error("skvq: values head dim Dv=" + std::to_string(v.shape[3]) +
                  " differs from the cache's Dv=" + std::to_string(st.v.head_dim));
    }
    if (k.dtype != st.dtype) {
      throw Error("skvq: keys dtype " + std::string(dtype_name(k.dtype)) + " differs from the cache's " +
                  std::string(dtype_name(st.dtype)) + " (fixed by the first call)");
    }
  }
  const std::int64_t S = k.shape[2];
  if (cfg.max_ctx && st.offset + S > *cfg.max_ctx) {
    throw Error("skvq: context " + std::to_string(st.offset + S) + " exceeds max_ctx=" +
                std::to_string(*cfg.max_ctx));
  }
  std::string why;
  const float limit = detail::value_limit(cfg.metadata, &why);
  const int threads = cache_threads(st);
  detail::check_values(k, "keys", limit, why, threads);
  detail::check_values(v, "values", limit, why, threads);
}

void append_checked(SkvqState& st, const TensorView& k, const TensorView& v) {
  const Config& cfg = st.cfg;
  const std::int64_t r = cfg.window;
  if (!st.initialized) {
    st.initialized = true;
    st.dtype = k.dtype;
    st.batch = k.shape[0];
    st.heads = k.shape[1];
    st.k.head_dim = cfg.head_dim;
    st.k.bits = cfg.bits_key;
    st.v.head_dim = static_cast<int>(v.shape[3]);
    st.v.bits = cfg.bits_value;
    for (Side* s : {&st.k, &st.v}) {
      s->tail.assign(static_cast<std::size_t>(st.batch * st.heads * r * s->head_dim * st.esize()),
                     std::byte{0});
    }
  }
  const std::int64_t S = k.shape[2];
  if (cfg.dense_view && (st.offset + S > st.dense_cap || st.reserved > st.dense_cap)) {
    std::int64_t cap = std::max({st.offset + S, 2 * st.dense_cap, r, st.reserved});
    if (cfg.max_ctx) cap = std::min(cap, *cfg.max_ctx);
    for (Side* s : {&st.k, &st.v}) grow_dense(st, *s, cap);
    st.dense_cap = cap;
  }
  const int threads = cache_threads(st);
  for (std::int64_t t = 0; t < S;) {
    const std::int64_t live = st.offset - st.q_end;
    if (live == 0 && S - t >= r) {  // whole windows straight from the input, one job for all of them
      const std::int64_t n_w = (S - t) / r;
      if (cfg.dense_view) {
        copy_rows(k, t, n_w * r, st.k.dense.data(), st.dense_cap, st.offset, threads);
        copy_rows(v, t, n_w * r, st.v.dense.data(), st.dense_cap, st.offset, threads);
      }
      const RowSource src[2] = {{k, t}, {v, t}};
      flush_windows(st, src, n_w);
      st.offset += n_w * r;
      t += n_w * r;
      continue;
    }
    const std::int64_t n = std::min(S - t, r - live);
    copy_rows(k, t, n, st.k.tail.data(), r, live, threads);
    copy_rows(v, t, n, st.v.tail.data(), r, live, threads);
    if (cfg.dense_view) {
      copy_rows(k, t, n, st.k.dense.data(), st.dense_cap, st.offset, threads);
      copy_rows(v, t, n, st.v.dense.data(), st.dense_cap, st.offset, threads);
    }
    st.offset += n;
    t += n;
    if (st.offset - st.q_end == r) {
      const RowSource src[2] = {RowSource::tail(st, st.k), RowSource::tail(st, st.v)};
      flush_windows(st, src, 1);
    }
  }
  st.tokens_seen += S;
  st.fp16_key_bytes += st.batch * st.heads * S * st.k.head_dim * 2;
  st.fp16_value_bytes += st.batch * st.heads * S * st.v.head_dim * 2;
}

// Exact row (sink or tail) of a [B, H, rows, D] buffer into dst[b, h, t, :].
void copy_exact_row(const std::byte* src, DType sdt, const TensorView& dst, std::int64_t b,
                    std::int64_t h, std::int64_t t, std::int64_t D) {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(sdt));
  for (std::int64_t d = 0; d < D; ++d) {
    if (dst.dtype == sdt) std::memcpy(dst.ptr(b, h, t, d), src + d * es, es);
    else dst.set(b, h, t, d, load_as_f32(src + d * es, sdt));
  }
}

void fetch_side(const SkvqState& st, const Side& s, const TensorView& out) {
  const std::int64_t H = st.heads, D = s.head_dim, r = st.cfg.window, es = st.esize();
  const std::int64_t sinks = st.sinks_held();
  detail::ThreadPool::global().parallel_for(st.batch * H, cache_threads(st), [&](std::int64_t bh) {  // each (b, h) its own rows of out
    const std::int64_t b = bh / H, h = bh % H;
    thread_local std::vector<float> rec;
    for (std::int64_t t = 0; t < sinks; ++t) {
      copy_exact_row(s.sinks.data() + (bh * sinks + t) * D * es, st.dtype, out, b, h, t, D);
    }
    for (std::size_t c = 0; c < s.chunks.size(); ++c) {
      const std::int64_t first = st.first_row(c), n = s.chunks[c].n_rows;
      rec.resize(static_cast<std::size_t>(n * D));
      st.dequantize(s, c, bh, 0, n, rec.data());
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t t = static_cast<std::int64_t>(c) * r + first + i;
        const float* row = rec.data() + i * D;
        if (out.strides[3] == 1) {
          cpu::store_row_f32(out.ptr(b, h, t, 0), out.dtype, D, row);
        } else {
          for (std::int64_t d = 0; d < D; ++d) out.set(b, h, t, d, row[d]);
        }
      }
    }
    for (std::int64_t t = st.q_end; t < st.offset; ++t) {
      copy_exact_row(s.tail.data() + (bh * r + t - st.q_end) * D * es, st.dtype, out, b, h, t, D);
    }
  });
}

void check_out(const SkvqState& st, const Side& s, const TensorView& out, const char* name) {
  const Shape4 want{st.batch, st.heads, st.offset, s.head_dim};
  if (out.shape != want) {
    throw Error("skvq: fetch_into " + std::string(name) + " shape " + shape_string(out.shape) +
                " must be " + shape_string(want));
  }
  if (out.numel() > 0 && out.data == nullptr) {
    throw Error("skvq: fetch_into " + std::string(name) + " has no data (null pointer)");
  }
}

}  // namespace

SkvqCache::SkvqCache(const Config& config) {
  config.validate();
  state_ = std::make_unique<SkvqState>();
  state_->cfg = config;
}

SkvqCache::SkvqCache(const SkvqCache& other) : state_(std::make_unique<SkvqState>(*other.state_)) {}
SkvqCache& SkvqCache::operator=(const SkvqCache& other) {
  if (this != &other) state_ = std::make_unique<SkvqState>(*other.state_);
  return *this;
}
SkvqCache::SkvqCache(SkvqCache&&) noexcept = default;
SkvqCache& SkvqCache::operator=(SkvqCache&&) noexcept = default;
SkvqCache::~SkvqCache() = default;

void SkvqCache::set_kernel(Kernel k) { state_->kernel = k; }

void SkvqCache::set_num_threads(int n) {
  if (n < 0) throw Error("skvq: set_num_threads(" + std::to_string(n) + ") must be >= 0 (0: every CPU)");
  state_->threads = n;
}
int SkvqCache::num_threads() const { return state_->threads; }

void SkvqCache::reserve(std::int64_t tokens) {
  SkvqState& st = *state_;
  if (tokens < 0) throw Error("skvq: reserve(" + std::to_string(tokens) + ") must be >= 0");
  if (st.cfg.max_ctx) tokens = std::min(tokens, *st.cfg.max_ctx);
  st.reserved = std::max(st.reserved, tokens);
  if (!st.initialized || !st.cfg.dense_view || tokens <= st.dense_cap) return;
  for (Side* s : {&st.k, &st.v}) grow_dense(st, *s, tokens);
  st.dense_cap = tokens;
}

std::pair<TensorView, TensorView> SkvqCache::update_and_fetch(const TensorView& keys,
                                                              const TensorView& values) {
  if (!state_->cfg.dense_view) {
    throw Error("skvq: update_and_fetch needs dense_view=true; this cache is packed-only "
                "(use append and fetch_into)");
  }
  append(keys, values);
  return {dense_view_of(*state_, state_->k), dense_view_of(*state_, state_->v)};
}

void SkvqCache::append(const TensorView& keys, const TensorView& values) {
  check_append(*state_, keys, values);
  append_checked(*state_, keys, values);
}

void SkvqCache::fetch_into(const TensorView& keys_out, const TensorView& values_out) const {
  const SkvqState& st = *state_;
  if (!st.initialized) {
    if (keys_out.shape[2] != 0 || values_out.shape[2] != 0) {
      throw Error("skvq: fetch_into on an empty cache needs T=0 outputs, got keys " +
                  shape_string(keys_out.shape));
    }
    return;
  }
  check_out(st, st.k, keys_out, "keys");
  check_out(st, st.v, values_out, "values");
  fetch_side(st, st.k, keys_out);
  fetch_side(st, st.v, values_out);
}

std::int64_t SkvqCache::offset() const { return state_->offset; }
std::int64_t SkvqCache::q_end() const { return state_->q_end; }
const Config& SkvqCache::config() const { return state_->cfg; }

void SkvqCache::trim(std::int64_t n) {
  throw Error("skvq: trim(" + std::to_string(n) +
              ") refused: an SKVQ cache is not trimmable (flushed rows have lost their exact values)");
}

std::optional<std::vector<std::int32_t>> SkvqCache::key_perms() const {
  if (state_->k.perm.empty()) return std::nullopt;
  return state_->k.perm;
}
std::optional<std::vector<std::int32_t>> SkvqCache::value_perms() const {
  if (state_->v.perm.empty()) return std::nullopt;
  return state_->v.perm;
}

Accounting SkvqCache::accounting() const {
  const SkvqState& st = *state_;
  Accounting a;
  for (const auto& c : st.k.chunks) {
    a.compressed_key_bytes += static_cast<std::int64_t>(c.codes.size() + c.lo.size() + c.scale.size());
  }
  for (const auto& c : st.v.chunks) {
    a.compressed_value_bytes += static_cast<std::int64_t>(c.codes.size() + c.lo.size() + c.scale.size());
  }
  a.fp16_key_bytes = st.fp16_key_bytes;
  a.fp16_value_bytes = st.fp16_value_bytes;
  a.residual_fp16_bytes = (st.offset - st.q_end + st.sinks_held()) *
                          (st.k.head_dim + st.v.head_dim) * 2 * st.batch * st.heads;
  a.perm_bytes = static_cast<std::int64_t>(st.k.perm.size() + st.v.perm.size()) * 4;
  a.quantized_tokens = st.q_end;
  a.tokens_seen = st.tokens_seen;
  const std::int64_t nq = st.q_end - st.sinks_held();
  a.assigned_avg_bits = nq == 0 ? 16.0
                                : 8.0 * static_cast<double>(a.compressed_key_bytes) /
                                      static_cast<double>(nq * st.k.head_dim * st.batch * st.heads);
  return a;
}

StoredBytes SkvqCache::stored_bytes() const {
  const SkvqState& st = *state_;
  StoredBytes b;
  for (const Side* s : {&st.k, &st.v}) {
    for (const auto& c : s->chunks) {
      b.codes += static_cast<std::int64_t>(c.codes.size());
      b.metadata += static_cast<std::int64_t>(c.lo.size() + c.scale.size());
    }
    b.sinks += static_cast<std::int64_t>(s->sinks.size());
    b.tail += static_cast<std::int64_t>(s->tail.size());
    b.perms += static_cast<std::int64_t>(s->perm.size() + s->inv.size()) * 4;
    b.dense_view += static_cast<std::int64_t>(s->dense.size());
  }
  return b;
}

std::unique_ptr<LayerCache> SkvqCache::clone() const { return std::make_unique<SkvqCache>(*this); }

bool SkvqCache::same_state(const SkvqCache& other) const {
  const SkvqState& a = *state_;
  const SkvqState& b = *other.state_;
  if (!(a.cfg == b.cfg) || a.initialized != b.initialized || a.dtype != b.dtype ||
      a.batch != b.batch || a.heads != b.heads || a.offset != b.offset || a.q_end != b.q_end ||
      a.fp16_key_bytes != b.fp16_key_bytes || a.fp16_value_bytes != b.fp16_value_bytes ||
      a.tokens_seen != b.tokens_seen) {
    return false;
  }
  const std::int64_t es = a.esize(), r = a.cfg.window, live = a.offset - a.q_end;
  for (int which = 0; which < 2; ++which) {
    const Side& x = which == 0 ? a.k : a.v;
    const Side& y = which == 0 ? b.k : b.v;
    if (x.head_dim != y.head_dim || x.bits != y.bits || !(x.chunks == y.chunks) ||
        x.perm != y.perm || x.inv != y.inv || x.sinks != y.sinks) {
      return false;
    }
    const std::int64_t D = x.head_dim, row = D * es;
    for (std::int64_t bh = 0; bh < a.batch * a.heads; ++bh) {
      if (live > 0 && std::memcmp(x.tail.data() + bh * r * row, y.tail.data() + bh * r * row,
                                  static_cast<std::size_t>(live * row)) != 0) {
        return false;
      }
      if (x.dense.empty() != y.dense.empty()) return false;
      if (!x.dense.empty() && a.offset > 0 &&
          std::memcmp(x.dense.data() + bh * a.dense_cap * row, y.dense.data() + bh * b.dense_cap * row,
                      static_cast<std::size_t>(a.offset * row)) != 0) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace skvq
