// SIMD decode/prefill attention straight from the packed store.
//
// Work is split into tasks (b, group of KV heads, token range); each task
// walks its range in blocks that lie in one segment (exact sinks, one packed
// chunk, exact tail, or dense rows), every head of its group at each block
// (the store keeps a chunk's heads side by side, so the reads are long runs),
// and serves every query row of a KV head's group (grouped-query attention)
// with an online softmax kept per head (HeadRun). Packed blocks of the common
// layouts (1, 2, 4 or 8 bits, whole 32-bit words a row) take the fused path
// below: scores and value sums straight from the code words (VNNI integer dot
// products on AVX3_DL: VnniKeyScoresT and VnniValuesT, metadata applied per
// (row, group) as stored; codes as float mantissas elsewhere); other blocks
// are decoded to float32 rows first. The rows of the next (head, block) of the
// walk are asked for through a LineQueue that the kernels drain a few lines at
// a time. Packed rows stay in the permuted channel order: scores use the
// permuted query, values accumulate into a permuted accumulator that is
// inverse-permuted once at the end. Partial (max, sum, acc) of the splits are
// combined in float32.
#include "cpu/attend_simd.hpp"
#include "cpu/byte_codes.hpp"



#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/thread_pool.hpp"
#include "ref/dequantize.hpp"
#include "ref/meta.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attend_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace skvq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Tokens per block: K and V scratch of kBlock rows (D = 128: 2 x 8 KiB) stay in L1.
constexpr std::int64_t kBlock = 16;

std::int64_t RoundUp(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// D codes of `bits` (1, 2, 4 or 8) starting at byte `src` -> out[0..D) as float.
void DecodeCodes(const std::uint8_t* src, int bits, std::int64_t D, float* out) {
  const float* table = byte_codes(bits);  // 1, 2 and 4 bits
  const std::int64_t per = 8 / bits, whole = D / per;
  switch (bits) {
    case 8: {
      const DF d;
      const hn::Rebind<std::uint8_t, DF> d8;
      const hn::Rebind<std::int32_t, DF> di;
      const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
      std::int64_t j = 0;
      for (; j + L <= D; j += L) hn::StoreU(hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, src + j))), d, out + j);
      for (; j < D; ++j) out[j] = static_cast<float>(src[j]);
      return;
    }
    case 4:
      for (std::int64_t i = 0; i < whole; ++i) std::memcpy(out + 2 * i, table + src[i] * 2, 8);
      break;
    case 2:
      for (std::int64_t i = 0; i < whole; ++i) std::memcpy(out + 4 * i, table + src[i] * 4, 16);
      break;
    case 1:
      for (std::int64_t i = 0; i < whole; ++i) std::memcpy(out + 8 * i, table + src[i] * 8, 32);
      break;
  }
  for (std::int64_t j = whole * per; j < D; ++j) {
    out[j] = static_cast<float>((src[whole] >> ((j - whole * per) * bits)) & ((1 << bits) - 1));
  }
}

// n contiguous elements of dtype dt -> float.
void LoadExact(const std::byte* p, DType dt, std::int64_t n, float* out) {
  const DF d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t j = 0;
  if (dt == DType::f16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* h = reinterpret_cast<const hwy::float16_t*>(p);
    for (; j + L <= n; j += L) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, h + j)), d, out + j);
  } else if (dt == DType::bf16) {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    const auto* h = reinterpret_cast<const hwy::bfloat16_t*>(p);
    for (; j + L <= n; j += L) hn::StoreU(hn::PromoteTo(d, hn::LoadU(db, h + j)), d, out + j);
  }
  load_row_f32(p + j * static_cast<std::int64_t>(dtype_size(dt)), dt, n - j, out + j);
}

// n metadata values of lo and scale -> float.
void LoadMeta(const std::uint8_t* lo, const std::uint8_t* sc, MetaType meta, std::int64_t n, float* lo_f, float* sc_f) {
  switch (meta) {
    case MetaType::fp16:
      LoadExact(reinterpret_cast<const std::byte*>(lo), DType::f16, n, lo_f);
      LoadExact(reinterpret_cast<const std::byte*>(sc), DType::f16, n, sc_f);
      break;
    case MetaType::fp32:
      std::memcpy(lo_f, lo, static_cast<std::size_t>(n) * 4);
      std::memcpy(sc_f, sc, static_cast<std::size_t>(n) * 4);
      break;
    case MetaType::fp8_e4m3:
      for (std::int64_t e = 0; e < n; ++e) {
        lo_f[e] = ref::e4m3_decode(lo[e]);
        sc_f[e] = ref::e4m3_decode(sc[e]);
      }
      break;
  }
}

// row[j] = row[j] * scale[k] + lo[k] for permuted channel j in group k.
void Dequant(float* row, std::int64_t D, int g, const std::uint8_t* lo, const std::uint8_t* sc, MetaType meta) {
  const DF d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  const int m = meta_bytes(meta);
  for (std::int64_t k = 0, j0 = 0; j0 < D; ++k, j0 += g) {
    const float lo_f = ref::meta_load(lo + k * m, meta), sc_f = ref::meta_load(sc + k * m, meta);
    const std::int64_t j1 = std::min<std::int64_t>(D, j0 + g);
    std::int64_t j = j0;
    if (g % L == 0) {
      const VF vs = hn::Set(d, sc_f), vl = hn::Set(d, lo_f);
      for (; j + L <= j1; j += L) hn::StoreU(hn::MulAdd(hn::LoadU(d, row + j), vs, vl), d, row + j);
    }
    for (; j < j1; ++j) row[j] = row[j] * sc_f + lo_f;
  }
}

// Whether token t is a row of the packed body (not a sink, not in the tail).
bool InPackedBody(const AttendParams& p, std::int64_t t) {
  return p.st != nullptr && t >= p.st->sinks_held() && t < p.st->q_end;
}

// Token t's segment: the first token after t's segment.
std::int64_t SegmentEnd(const AttendParams& p, std::int64_t t) {
  if (p.st == nullptr) return p.kv_len;
  const detail::SkvqState& st = *p.st;
  const std::int64_t r = st.cfg.window;
  if (t < st.sinks_held()) return st.sinks_held();
  if (t < st.q_end) return std::min((t / r + 1) * r, st.q_end);
  return p.kv_len;
}

// Where packed rows of one side live: row t0 of head (b, h) is row i0 of its
// chunk; `codes` is the head's bit stream in that chunk (cph bytes), `lo` and
// `scale` point at row i0's metadata (mrow bytes a row).
struct PackedRowsAt {
  const detail::SkvqState& st;
  const detail::Side& s;
  const std::uint8_t* codes;
  std::int64_t cph, i0, mrow;
  const std::uint8_t* lo;
  const std::uint8_t* scale;
  PackedRowsAt(const AttendParams& p, int side, std::int64_t b, std::int64_t h, std::int64_t t0)
      : st(*p.st), s(side == 0 ? p.st->k : p.st->v) {
    const std::int64_t bh = b * st.heads + h, r = st.cfg.window;
    const auto c = static_cast<std::size_t>(t0 / r);
    const detail::PackedChunk& ch = s.chunks[c];
    i0 = t0 % r - st.first_row(c);
    cph = st.codes_per_head(s, ch.n_rows);
    const std::int64_t mph = st.meta_per_head(s, ch.n_rows);
    mrow = st.groups(s) * meta_bytes(st.cfg.metadata);
    codes = ch.codes.data() + bh * cph;
    lo = ch.lo.data() + bh * mph + i0 * mrow;
    scale = ch.scale.data() + bh * mph + i0 * mrow;
  }
};

// Rows [t0, t0 + n) of one side for head (b, h) into rows[n][stride]; returns
// true when the rows are in the side's permuted channel order.
bool DecodeBlock(const AttendParams& p, int side, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t n,
                 float* rows, std::int64_t stride) {
  if (p.st == nullptr) {
    const TensorView& src = side == 0 ? p.k : p.v;
    for (std::int64_t i = 0; i < n; ++i) {
      if (src.strides[3] == 1) {
        LoadExact(src.ptr(b, h, t0 + i, 0), src.dtype, src.shape[3], rows + i * stride);
      } else {
        for (std::int64_t dd = 0; dd < src.shape[3]; ++dd) rows[i * stride + dd] = src.at(b, h, t0 + i, dd);
      }
    }
    return false;
  }
  const detail::SkvqState& st = *p.st;
  const detail::Side& s = side == 0 ? st.k : st.v;
  const std::int64_t D = s.head_dim, bh = b * st.heads + h, r = st.cfg.window, es = st.esize();
  const std::int64_t sinks = st.sinks_held();
  if (t0 < sinks) {
    for (std::int64_t i = 0; i < n; ++i) LoadExact(s.sinks.data() + (bh * sinks + t0 + i) * D * es, st.dtype, D, rows + i * stride);
    return false;
  }
  if (t0 >= st.q_end) {
    for (std::int64_t i = 0; i < n; ++i) {
      LoadExact(s.tail.data() + (bh * r + t0 + i - st.q_end) * D * es, st.dtype, D, rows + i * stride);
    }
    return false;
  }
  const PackedRowsAt at(p, side, b, h, t0);
  const int g = st.cfg.group_size;
  const std::int64_t G = st.groups(s), mrow = at.mrow, cph = at.cph, i0 = at.i0;
  const std::uint8_t* stream = at.codes;
  const std::uint8_t* lo = at.lo;
  const std::uint8_t* sc = at.scale;
  const DF d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  const int bits = s.bits;
  const bool fast = (bits == 1 || bits == 2 || bits == 4 || bits == 8) && (L * bits) % 8 == 0 && D % L == 0 && g % L == 0;
  if (!fast) {
    for (std::int64_t i = 0; i < n; ++i) {
      ref::dequantize_row(stream, cph, i0 + i, static_cast<int>(D), bits, g, st.cfg.metadata, lo + i * mrow,
                          sc + i * mrow, nullptr, rows + i * stride);
    }
    return true;
  }
  // Metadata of the whole block at once: n * G values, contiguous.
  float lo_f[kBlock * 256], sc_f[kBlock * 256];
  const std::int64_t nm = n * G;
  if (nm > kBlock * 256) {  // very small groups: decode in pieces through the reference
    for (std::int64_t i = 0; i < n; ++i) {
      ref::dequantize_row(stream, cph, i0 + i, static_cast<int>(D), bits, g, st.cfg.metadata, lo + i * mrow,
                          sc + i * mrow, nullptr, rows + i * stride);
    }
    return true;
  }
  LoadMeta(lo, sc, st.cfg.metadata, nm, lo_f, sc_f);
  // Lane i of a vector of L codes takes byte (i * bits) / 8 of the vector's
  // bytes, shifted right by (i * bits) % 8 (codes never straddle bytes here).
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<std::uint8_t, DF> d8;
  std::int32_t idx_arr[64], sh_arr[64];
  for (std::int64_t i = 0; i < L; ++i) {
    idx_arr[i] = static_cast<std::int32_t>(i * bits / 8);
    sh_arr[i] = static_cast<std::int32_t>(i * bits % 8);
  }
  const auto idx = hn::SetTableIndices(du, idx_arr);
  const auto shifts = hn::BitCast(du, hn::LoadU(di, sh_arr));
  const auto mask = hn::Set(du, (1u << bits) - 1u);
  const std::int64_t row_bytes = D * bits / 8, vec_bytes = L * bits / 8;
  alignas(64) std::uint8_t buf[1024 + 64];
  for (std::int64_t i = 0; i < n; ++i) {
    // A padded copy of the row, so every vector load stays inside our buffer.
    std::memcpy(buf, stream + (i0 + i) * row_bytes, static_cast<std::size_t>(row_bytes));
    float* row = rows + i * stride;
    for (std::int64_t k = i * G, j0 = 0, b8 = 0; j0 < D; ++k, j0 += g) {
      const VF vs = hn::Set(d, sc_f[k]), vl = hn::Set(d, lo_f[k]);
      for (std::int64_t j = j0; j < std::min(j0 + g, D); j += L, b8 += vec_bytes) {
        const auto bytes = hn::PromoteTo(du, hn::LoadU(d8, buf + b8));
        const auto codes = hn::And(hn::Shr(hn::TableLookupLanes(bytes, idx), shifts), mask);
        hn::Store(hn::MulAdd(hn::ConvertTo(d, hn::BitCast(di, codes)), vs, vl), d, row + j);
      }
    }
  }
  return true;
}

float Dot(const float* a, const float* b, std::int64_t n) {  // n: a multiple of the lane count
  const DF d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  VF s0 = hn::Zero(d), s1 = hn::Zero(d);
  std::int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    s0 = hn::MulAdd(hn::Load(d, a + j), hn::Load(d, b + j), s0);
    s1 = hn::MulAdd(hn::Load(d, a + j + L), hn::Load(d, b + j + L), s1);
  }
  for (; j < n; j += L) s0 = hn::MulAdd(hn::Load(d, a + j), hn::Load(d, b + j), s0);
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
}

struct Partial {  // per (KV head, split) and query row
  float* m;      // [nq]
  float* l;      // [nq]
  float* acc_o;  // [nq][Dvp] original channel order
  float* acc_p;  // [nq][Dvp] values' permuted order
};

// ---------------------------------------------------------------------------
// Fused packed path: scores and value sums straight from the code words, no
// float rows. A 32-bit word of the stream holds cpl = 32/bits codes of one
// row (rows are whole words: D * bits % 32 == 0), so a vector of N words is
// N/R rows (R = words per row) or 1/P of one (P = R/N phases). Code k of
// every word is moved to the top of a float mantissa under exponent 0 (one
// shift, one and-or): f = 1 + c / 2^bits, so x = lo + scale * c = lot + sct * f
// with sct = scale * 2^bits and lot = lo - sct. Then, per word,
//   q . x = sct * (q . f) + lot * sum(q)          (one FMA per N codes)
//   sum_t p_t x_t = sum_t (p_t sct_t) f_t + sum_t p_t lot_t
// Scores sum a row's words; value sums are folded into channels at the end.
// ---------------------------------------------------------------------------

// Tokens per block of the fused path.
constexpr std::int64_t kFused = 128;

using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;

struct FusedPlan {
  bool ok = false;
  int bits = 0;
  std::int64_t cpl = 0;  // codes per 32-bit word
  std::int64_t R = 0;    // words per row
  std::int64_t lpg = 0;  // words per group
  std::int64_t G = 0;    // groups per row
  std::int64_t P = 1;    // vectors per row when R >= N
  std::int64_t Lp = 0;   // lanes of the per-group value accumulator: max(N, G)
  std::int64_t slots() const { return cpl * P; }
};

bool Nested(std::int64_t a, std::int64_t b) { return a % b == 0 || b % a == 0; }

FusedPlan PlanFused(const AttendParams& p, int side, std::int64_t N) {
  FusedPlan f;
  if (p.st == nullptr) return f;
  const detail::Side& s = side == 0 ? p.st->k : p.st->v;
  const std::int64_t D = s.head_dim, g = p.st->cfg.group_size;
  f.bits = s.bits;
  if (f.bits != 1 && f.bits != 2 && f.bits != 4 && f.bits != 8) return f;
  if ((D * f.bits) % 32 != 0) return f;
  f.cpl = 32 / f.bits;
  f.R = D * f.bits / 32;
  if (g % f.cpl != 0 || D % g != 0) return f;
  f.lpg = g / f.cpl;
  f.G = D / g;
  if (!Nested(f.R, N) || !Nested(f.lpg, N) || !Nested(f.G, N)) return f;
  f.P = f.R >= N ? f.R / N : 1;
  f.Lp = std::max(N, f.G);
  f.ok = true;
  return f;
}

// Calls f.template operator()<B>() with B = bits (1, 2, 4 or 8, the fused
// layouts' code widths) as a compile-time constant.
template <typename F>
HWY_INLINE void ByBits(int bits, F&& f) {
  switch (bits) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 4: return f.template operator()<4>();
    default: return f.template operator()<8>();
  }
}

// Code K of every word of w as 1 + c / 2^BITS.
template <int BITS, int K>
HWY_INLINE VF CodeAsMantissa(VU w) {
  const DU du;
  constexpr int kTop = 23 - BITS, kShift = K * BITS - kTop;
  VU x;
  if constexpr (kShift >= 0) {
    x = hn::ShiftRight<kShift>(w);
  } else {
    x = hn::ShiftLeft<-kShift>(w);
  }
#if HWY_TARGET <= HWY_AVX3
  // (x & mask) | one with x as the destination (OrAnd would overwrite, hence copy, a constant)
  return hn::BitCast(DF(), VU{_mm512_ternarylogic_epi32(x.raw, hn::Set(du, ((1u << BITS) - 1u) << kTop).raw,
                                                        hn::Set(du, 0x3F800000u).raw, 0xEA)});
#else
  return hn::BitCast(DF(), hn::OrAnd(hn::Set(du, 0x3F800000u), x, hn::Set(du, ((1u << BITS) - 1u) << kTop)));
#endif
}

// sum over k of qp[k * kstride + lane] * f_k(w)
template <int BITS, std::size_t... K>
HWY_INLINE VF WordDot(VU w, const float* qp, std::int64_t kstride, std::index_sequence<K...>) {
  const DF d;
  VF a[2] = {hn::Zero(d), hn::Zero(d)};
  ((a[K % 2] = hn::MulAdd(hn::Load(d, qp + static_cast<std::int64_t>(K) * kstride), CodeAsMantissa<BITS, K>(w), a[K % 2])), ...);
  return hn::Add(a[0], a[1]);
}

// acc[k] += wt * f_k(w)
template <int BITS, std::size_t... K>
HWY_INLINE void WordAxpy(VU w, VF wt, VF* acc, std::index_sequence<K...>) {
  ((acc[K] = hn::MulAdd(wt, CodeAsMantissa<BITS, K>(w), acc[K])), ...);
}

// Lane l of vector v of a stream in which every source element covers `per`
// lanes: src[(v * N + l) / per]. per divides N or N divides per; src is
// readable N elements past the last one used.
struct Expander {
  std::int64_t per = 1;
  int shift = -1;  // log2(per) when per is a power of two (always when per <= N)
  hn::Vec<hn::RebindToSigned<DF>> idx;
  Expander() = default;
  Expander(std::int64_t per_lanes, std::int64_t N) : per(per_lanes) {
    const hn::RebindToSigned<DF> di;
    if ((per & (per - 1)) == 0) shift = std::countr_zero(static_cast<std::uint64_t>(per));
    std::int32_t tmp[64] = {};
    for (std::int64_t l = 0; l < N && per < N; ++l) tmp[l] = static_cast<std::int32_t>(l >> shift);
    idx = hn::LoadU(di, tmp);
  }
  HWY_INLINE std::int64_t First(std::int64_t v, std::int64_t N) const { return shift >= 0 ? (v * N) >> shift : v * N / per; }
  HWY_INLINE VF operator()(const float* src, std::int64_t v) const {
    const DF d;
    const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
    if (per >= N) return hn::Set(d, src[First(v, N)]);
    if (per == 1) return hn::LoadU(d, src + v * N);
    return hn::TableLookupLanes(hn::LoadU(d, src + First(v, N)), hn::IndicesFromVec(d, idx));
  }
};

// Block of packed rows as whole vectors of words; the last, partial vector
// is read from a zero-padded copy.
class WordBlock {
 public:
  WordBlock(const std::uint8_t* codes, std::int64_t n_words, std::int64_t N)
      : words_(reinterpret_cast<const std::uint32_t*>(codes)), full_(n_words / N), nvec_((n_words + N - 1) / N) {
    std::memset(last_, 0, sizeof(last_));
    if (full_ < nvec_) std::memcpy(last_, words_ + full_ * N, static_cast<std::size_t>((n_words - full_ * N) * 4));
  }
  std::int64_t nvec() const { return nvec_; }
  HWY_INLINE VU operator[](std::int64_t v) const {
    const DU du;
    return v < full_ ? hn::LoadU(du, words_ + v * static_cast<std::int64_t>(hn::Lanes(du))) : hn::Load(du, last_);
  }

 private:
  const std::uint32_t* words_;
  std::int64_t full_, nvec_;
  alignas(64) std::uint32_t last_[64];
};

// Per-block inputs of one side of the fused path.
struct FusedBlock {
  const WordBlock& wb;
  std::int64_t n;    // rows
  const float* lot;  // [n * G] (+ N zeros)
  const float* sct;  // [n * G] (+ N zeros)
};

#if HWY_TARGET == HWY_AVX3_DL
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif
// AVX2 has no VNNI, but the same integer formulation runs on its 16-bit
// products: vpmaddubsw (unsigned byte x signed byte, adjacent pairs summed
// to int16) for the keys and vpmaddwd (int16 x int16, pairs summed to int32)
// for the values.
#if HWY_TARGET == HWY_AVX2
constexpr bool kAvx2Int = true;
#else
constexpr bool kAvx2Int = false;
#endif

// The query of the VNNI path (AVX3_DL): q rounded to qi = round(q / s) with
// |qi| <= 127 * 256, split into qi = 256 * hi + lo with hi, lo int8, laid out
// per byte of a vector of words: hi/lo[(m * P + ph) * 4N + byte] multiplies
// code (byte % 4) * (8 / bits) + m of the word in lane byte / 4 at phase ph.
struct VnniQuery {
  const std::int8_t* hi = nullptr;
  const std::int8_t* lo = nullptr;
  float step = 0;  // s / 2^bits
};

// Builds the VNNI query for permuted, scaled q[0..D) into hi/lo buffers of
// 2 * (8 / bits) * P * 4N bytes' room; returns s.
float BuildVnniQuery(const FusedPlan& fp, const float* q, std::int64_t D, std::int64_t N, std::int8_t* hi, std::int8_t* lo) {
  float qmax = 0.0f;
  for (std::int64_t j = 0; j < D; ++j) qmax = std::max(qmax, std::fabs(q[j]));
  const float s = qmax > 0.0f ? qmax / 32512.0f : 1.0f;
  // each channel's two bytes once (a division a channel), then laid out (a
  // channel appears in several lanes' bytes when a row has fewer words than lanes)
  thread_local std::vector<std::int8_t> bytes;
  bytes.resize(static_cast<std::size_t>(2 * D));
  std::int8_t* chi = bytes.data();
  std::int8_t* clo = chi + D;
  for (std::int64_t j = 0; j < D; ++j) {
    const float r = std::nearbyint(q[j] / s);
    const auto qi = static_cast<std::int32_t>(std::clamp(r, -32512.0f, 32512.0f));
    const std::int32_t h = (qi + 128) >> 8;  // floor division: lo in [-128, 127]
    chi[j] = static_cast<std::int8_t>(h);
    clo[j] = static_cast<std::int8_t>(qi - 256 * h);
  }
  const std::int64_t per_byte = 8 / fp.bits;
  for (std::int64_t ph = 0; ph < fp.P; ++ph)
    for (std::int64_t lane = 0; lane < N; ++lane) {
      const std::int64_t j0 = (ph * N + lane) % fp.R * fp.cpl;  // the lane's word's first channel
      for (std::int64_t m = 0; m < per_byte; ++m)
        for (std::int64_t b = 0; b < 4; ++b) {  // byte b of the lane's word: its code b * per_byte + m
          const std::int64_t at = (m * fp.P + ph) * 4 * N + 4 * lane + b, j = j0 + b * per_byte + m;
          hi[at] = chi[j];
          lo[at] = clo[j];
        }
    }
  return s;
}

#if HWY_TARGET == HWY_AVX3_DL
// acc += dot products of 4 unsigned bytes of x with 4 signed bytes of q per
// 32-bit lane (AVX512-VNNI; Highway 1.0's AVX3_DL target checks the CPU for it
// but does not enable it for the compiler, hence the instruction by hand).
HWY_INLINE __m512i Dpbusd(__m512i acc, __m512i x, __m512i q) {
  asm("vpdpbusd %[q], %[x], %[acc]" : [acc] "+v"(acc) : [x] "v"(x), [q] "v"(q));
  return acc;
}

// sum over the word's codes of q * f as in WordDot, from integer dot products:
// (256 * sum(hi * c) + sum(lo * c)) * s / 2^bits + sum(q)
template <int BITS>
HWY_INLINE VF VnniWordDot(VU w, const VnniQuery& vq, std::int64_t ph, std::int64_t mstride, VF qls) {
  constexpr int kPerByte = 8 / BITS;
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << BITS) - 1));
  __m512i ah = _mm512_setzero_si512(), al = _mm512_setzero_si512();
  const std::int8_t* h = vq.hi + ph * 64;
  const std::int8_t* l = vq.lo + ph * 64;
  for (int m = 0; m < kPerByte; ++m) {
    __m512i x = m == 0 ? w.raw : _mm512_srli_epi32(w.raw, static_cast<unsigned>(m * BITS));
    if constexpr (BITS < 8) x = _mm512_and_si512(x, mask);
    ah = Dpbusd(ah, x, _mm512_load_si512(h + m * mstride));
    al = Dpbusd(al, x, _mm512_load_si512(l + m * mstride));
  }
  const DF d;
  const VF fh{_mm512_cvtepi32_ps(ah)}, fl{_mm512_cvtepi32_ps(al)};
  return hn::MulAdd(fh, hn::Set(d, 256.0f * vq.step), hn::MulAdd(fl, hn::Set(d, vq.step), qls));
}
#endif

// Cache lines asked for ahead of use, issued a few at a time from inside the
// kernels so that the requests spread over the computation instead of
// arriving in a burst the core's miss buffers cannot hold. The lines are
// asked into L2 (`prefetcht1`), not L1: on an Intel Xeon (2 vCPUs) that read
// 128k-token steps 6-9% faster than `prefetcht0` (docs/performance.md,
// session 19); not measured on AMD's Zen cores since (no such machine in
// session 19), whose optimization guide treats the T0-T2 hints alike.
class LineQueue {
 public:
  HWY_INLINE static void ask(const void* p) { __builtin_prefetch(p, 0, 2); }
  // The lines of [p, p + bytes).
  void push(const void* p, std::int64_t bytes) {
    const char* c = static_cast<const char*>(p);
    if (n_ == kCap) {  // full: ask now
      for (std::int64_t o = 0; o < bytes; o += 64) ask(c + o);
      return;
    }
    r_[n_++] = {c, c + bytes};
  }
  // Asks for the next k lines (k: a constant at the call sites, so the common
  // case is k prefetches at fixed offsets and one compare).
  HWY_INLINE void issue(int k) {
    if (end_ - cur_ >= 64 * k) {  // (no offset from an empty queue's null pointers)
      for (int j = 0; j < k; ++j) ask(cur_ + 64 * j);
      cur_ += 64 * k;
      return;
    }
    IssueAcross(k);
  }
  void drain() {
    IssueAcross(1 << 30);
    n_ = i_ = 0;
  }

 private:
  // The lines left in the current range, then the next ranges'.
  HWY_NOINLINE void IssueAcross(int k) {
    for (;;) {
      for (; k > 0 && cur_ < end_; --k, cur_ += 64) ask(cur_);
      if (k == 0 || i_ == n_) return;
      cur_ = r_[i_].p;
      end_ = r_[i_].end;
      ++i_;
    }
  }

  static constexpr int kCap = 64;
  struct Range {
    const char* p;
    const char* end;
  };
  Range r_[kCap];
  int n_ = 0, i_ = 0;          // ranges queued; the next one to start
  const char* cur_ = nullptr;  // the range being issued: [cur_, end_)
  const char* end_ = nullptr;
};

#if HWY_TARGET == HWY_AVX3_DL
// ---------------------------------------------------------------------------
// Keys through VNNI for rows of at most one vector (16, 32 or 64 bytes of
// 1, 2, 4 or 8-bit codes: 16 / R rows a vector): 16 rows at a time, each
// vector's 32-bit lanes get their word's exact integer dot product
// 256 sum(hi c) + sum(lo c) (the query of BuildVnniQuery at one phase); adjacent
// lanes are summed in integers up to one lane per (row, group) (ConcatEven +
// ConcatOdd keep the order), the group's metadata is applied there in float,
//   score(row, group) = (scale s) I + lo sum_group(q),
// and the groups of a row are summed. The metadata arrays are as stored,
// [row][group], so lanes meet them without any rearranging.
// ---------------------------------------------------------------------------
// Lanes [e, e + 16) of a metadata array (fp16 as stored, or float), lanes
// from `valid` on zero and not read.
template <bool kHalf>
HWY_INLINE __m512 MetaLoad(const void* p, std::int64_t e, std::int64_t valid) {
  const __mmask16 k = valid >= 16 ? static_cast<__mmask16>(0xFFFF)
                                  : static_cast<__mmask16>((1u << static_cast<unsigned>(std::max<std::int64_t>(valid, 0))) - 1u);
  if constexpr (kHalf) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, static_cast<const std::uint16_t*>(p) + e));
  } else {
    return _mm512_maskz_loadu_ps(k, static_cast<const float*>(p) + e);
  }
}

HWY_INLINE __m512i PairSumEpi32(__m512i a, __m512i b) {
  const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_add_epi32(_mm512_permutex2var_epi32(a, ev, b), _mm512_permutex2var_epi32(a, od, b));
}
HWY_INLINE __m512 PairSumPs(__m512 a, __m512 b) {
  const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_add_ps(_mm512_permutex2var_ps(a, ev, b), _mm512_permutex2var_ps(a, od, b));
}

// BITS: code width; R: words a row (1..16, a power of two); LPG: words a group.
// lo, sc: [row][group] metadata, fp16 as stored (kHalf) or float; qg[l]: the sum of q over group l % G's channels; s: the
// query's rounding step (q ~ s qi).
template <int BITS, int R, int LPG, bool kHalf>
void VnniKeyScoresT(const std::uint8_t* codes, std::int64_t n, const void* lo, const void* sc, const VnniQuery& vq,
                    float s, const float* qg, float* scores, LineQueue& lq) {
  constexpr int kPerByte = 8 / BITS, kRB = 4 * R, kV = R, kG = R / LPG;  // kV vectors per 16 rows
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << BITS) - 1));
  __m512i qh[kPerByte], ql[kPerByte];
  for (int m = 0; m < kPerByte; ++m) {
    qh[m] = _mm512_load_si512(vq.hi + m * 64);
    ql[m] = _mm512_load_si512(vq.lo + m * 64);
  }
  const __m512 vs = _mm512_set1_ps(s), vqg = _mm512_loadu_ps(qg);
  alignas(64) std::uint8_t pad[16 * kRB];
  for (std::int64_t t0 = 0; t0 < n; t0 += 16) {
    const std::uint8_t* src = codes + t0 * kRB;
    if (t0 + 16 > n) {  // last, partial batch: zero rows
      std::memset(pad, 0, sizeof(pad));
      std::memcpy(pad, src, static_cast<std::size_t>((n - t0) * kRB));
      src = pad;
    }
    lq.issue(12);
    __m512i y[kV];
    for (int v = 0; v < kV; ++v) {
      const __m512i w = _mm512_loadu_si512(src + 64 * v);
      __m512i ah = _mm512_setzero_si512(), al = _mm512_setzero_si512();
      for (int m = 0; m < kPerByte; ++m) {
        __m512i x = m == 0 ? w : _mm512_srli_epi32(w, static_cast<unsigned>(m * BITS));
        if constexpr (BITS < 8) x = _mm512_and_si512(x, mask);
        ah = Dpbusd(ah, x, qh[m]);
        al = Dpbusd(al, x, ql[m]);
      }
      y[v] = _mm512_add_epi32(_mm512_slli_epi32(ah, 8), al);
    }
    int cnt = kV;
    for (int lpg = LPG; lpg > 1; lpg /= 2, cnt /= 2)
      for (int j = 0; j < cnt / 2; ++j) y[j] = PairSumEpi32(y[2 * j], y[2 * j + 1]);
    __m512 z[kV / LPG];
    for (int i = 0; i < cnt; ++i) {
      const std::int64_t e = t0 * kG + 16 * i;
      const std::int64_t valid = n * kG - e;
      z[i] = _mm512_fmadd_ps(_mm512_mul_ps(MetaLoad<kHalf>(sc, e, valid), vs), _mm512_cvtepi32_ps(y[i]),
                             _mm512_mul_ps(MetaLoad<kHalf>(lo, e, valid), vqg));
    }
    for (int g = kG; g > 1; g /= 2, cnt /= 2)
      for (int j = 0; j < cnt / 2; ++j) z[j] = PairSumPs(z[2 * j], z[2 * j + 1]);
    _mm512_storeu_ps(scores + t0, z[0]);  // scores has 16 floats of room past the block
  }
}
#endif

#if HWY_TARGET == HWY_AVX2
// ---------------------------------------------------------------------------
// The same integer paths on AVX2 (8 lanes of 32 bits). Keys: 8 rows at a time
// (R vectors of words, a row spanning P = R / 8 vectors when R > 8), each
// word's exact 256 sum(hi c) + sum(lo c) from vpmaddubsw (codes unsigned,
// query bytes signed; a pair's sum is at most 2 * 15 * 128 in magnitude and
// the 8 / bits slices of a word add up to at most 8 * 3 * 128 = 3072 (2
// bits), 7680 (4 bits), 2048 (1 bit), so int16 holds them without
// saturating; 8-bit codes would not fit and keep the float path), widened by
// vpmaddwd; then, as on AVX3_DL, adjacent lanes summed up to one lane per
// (row, group), the metadata applied in float, the groups of a row summed.
// The integer sums and the float operations are those of VnniKeyScoresT, so
// the scores are the same bit for bit.
// ---------------------------------------------------------------------------
// [a0+a1, a2+a3, a4+a5, a6+a7, b0+b1, ..., b6+b7]
HWY_INLINE __m256i PairSum8Epi32(__m256i a, __m256i b) { return _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xD8); }
HWY_INLINE __m256 PairSum8Ps(__m256 a, __m256 b) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_hadd_ps(a, b)), 0xD8));
}

// Lanes [e, e + 8) of a metadata array (fp16 as stored, or float), lanes
// from `valid` on zero and not read.
template <bool kHalf>
using MetaT = std::conditional_t<kHalf, std::uint16_t, float>;
// Lanes [e, e + 8), all readable.
template <bool kHalf>
HWY_INLINE __m256 MetaLoad8Full(const void* p, std::int64_t e) {
  if constexpr (kHalf) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const MetaT<kHalf>*>(p) + e)));
  } else {
    return _mm256_loadu_ps(static_cast<const MetaT<kHalf>*>(p) + e);
  }
}
template <bool kHalf>
HWY_NOINLINE __m256 MetaLoad8Part(const void* p, std::int64_t e, std::int64_t valid) {
  alignas(32) MetaT<kHalf> buf[8] = {};
  std::memcpy(buf, static_cast<const MetaT<kHalf>*>(p) + e,
              static_cast<std::size_t>(std::max<std::int64_t>(valid, 0)) * sizeof(MetaT<kHalf>));
  return MetaLoad8Full<kHalf>(buf, 0);
}
template <bool kHalf>
HWY_INLINE __m256 MetaLoad8(const void* p, std::int64_t e, std::int64_t valid) {
  return HWY_LIKELY(valid >= 8) ? MetaLoad8Full<kHalf>(p, e) : MetaLoad8Part<kHalf>(p, e, valid);
}

// BITS: code width (1, 2 or 4); R: words a row (1..16, a power of two); LPG:
// words a group (R / LPG <= 8 groups a row). Arguments as VnniKeyScoresT's.
template <int BITS, int R, int LPG, bool kHalf>
void Avx2KeyScoresT(const std::uint8_t* codes, std::int64_t n, const void* lo, const void* sc, const VnniQuery& vq,
                    float s, const float* qg, float* scores, LineQueue& lq) {
  constexpr int kPerByte = 8 / BITS, kRB = 4 * R, kV = R, kG = R / LPG, kP = R > 8 ? R / 8 : 1;
  static_assert(BITS <= 4 && kG <= 8);
  const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << BITS) - 1));
  const __m256i k256 = _mm256_set1_epi16(256), k1 = _mm256_set1_epi16(1);
  __m256i qh[kPerByte][kP], ql[kPerByte][kP];
  for (int m = 0; m < kPerByte; ++m)
    for (int ph = 0; ph < kP; ++ph) {
      qh[m][ph] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vq.hi + (m * kP + ph) * 32));
      ql[m][ph] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vq.lo + (m * kP + ph) * 32));
    }
  const __m256 vs = _mm256_set1_ps(s), vqg = _mm256_loadu_ps(qg);
  alignas(32) std::uint8_t pad[8 * kRB];
  for (std::int64_t t0 = 0; t0 < n; t0 += 8) {
    const std::uint8_t* src = codes + t0 * kRB;
    if (t0 + 8 > n) {  // last, partial batch: zero rows
      std::memset(pad, 0, sizeof(pad));
      std::memcpy(pad, src, static_cast<std::size_t>((n - t0) * kRB));
      src = pad;
    }
    lq.issue(6);
    // (the first level of lane sums as each pair of vectors is done: fewer live registers)
    __m256i y[kV], prev = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int v = 0; v < kV; ++v) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * v));
      __m256i ah = _mm256_setzero_si256(), al = _mm256_setzero_si256();
      for (int m = 0; m < kPerByte; ++m) {
        const __m256i x = _mm256_and_si256(m == 0 ? w : _mm256_srli_epi16(w, m * BITS), mask);
        ah = _mm256_add_epi16(ah, _mm256_maddubs_epi16(x, qh[m][v % kP]));
        al = _mm256_add_epi16(al, _mm256_maddubs_epi16(x, ql[m][v % kP]));
      }
      const __m256i yv = _mm256_add_epi32(_mm256_madd_epi16(ah, k256), _mm256_madd_epi16(al, k1));
      if constexpr (LPG == 1) {
        y[v] = yv;
      } else if (v % 2 == 0) {
        prev = yv;
      } else {
        y[v / 2] = PairSum8Epi32(prev, yv);
      }
    }
    int cnt = LPG == 1 ? kV : kV / 2;
    for (int lpg = LPG / 2; lpg > 1; lpg /= 2, cnt /= 2)
      for (int j = 0; j < cnt / 2; ++j) y[j] = PairSum8Epi32(y[2 * j], y[2 * j + 1]);
    __m256 z[kG];
    for (int i = 0; i < cnt; ++i) {
      const std::int64_t e = t0 * kG + 8 * i;
      const std::int64_t valid = n * kG - e;
      z[i] = _mm256_fmadd_ps(_mm256_mul_ps(MetaLoad8<kHalf>(sc, e, valid), vs), _mm256_cvtepi32_ps(y[i]),
                             _mm256_mul_ps(MetaLoad8<kHalf>(lo, e, valid), vqg));
    }
    for (int g = kG; g > 1; g /= 2, cnt /= 2)
      for (int j = 0; j < cnt / 2; ++j) z[j] = PairSum8Ps(z[2 * j], z[2 * j + 1]);
    _mm256_storeu_ps(scores + t0, z[0]);  // scores has 8 floats of room past the block
  }
}
#endif

// The integer key paths apply: on AVX3_DL rows of 1..16 whole words, a power
// of two; on AVX2 the same at 1, 2 or 4 bits with at most 8 groups a row.
bool VnniKeysOk(const FusedPlan& fk) {
  const bool rows = fk.ok && fk.R <= 16 && (fk.R & (fk.R - 1)) == 0 && fk.lpg >= 1 && fk.lpg <= fk.R;
  if (kVnni) return rows;
  return kAvx2Int && rows && fk.bits <= 4 && fk.R / fk.lpg <= 8;
}

// go.template operator()<BITS, R, LPG>() for the key plan's code width, words a
// row (R) and words a metadata group (lpg), each a power of two up to 16; go
// leaves out the combinations its kernel does not take.
template <typename Go>
void ByKeyShape(const FusedPlan& fk, Go&& go) {
  auto by_lpg = [&]<int BITS, int R>() HWY_ATTR {
    switch (fk.lpg) {
      case 1: return go.template operator()<BITS, R, 1>();
      case 2: return go.template operator()<BITS, R, 2>();
      case 4: return go.template operator()<BITS, R, 4>();
      case 8: return go.template operator()<BITS, R, 8>();
      default: return go.template operator()<BITS, R, 16>();
    }
  };
  auto by_r = [&]<int BITS>() HWY_ATTR {
    switch (fk.R) {
      case 1: return by_lpg.template operator()<BITS, 1>();
      case 2: return by_lpg.template operator()<BITS, 2>();
      case 4: return by_lpg.template operator()<BITS, 4>();
      case 8: return by_lpg.template operator()<BITS, 8>();
      default: return by_lpg.template operator()<BITS, 16>();
    }
  };
  ByBits(fk.bits, by_r);
}

void VnniKeyScores(const FusedPlan& fk, const std::uint8_t* codes, std::int64_t n, const void* lo, const void* sc, bool half,
                   const VnniQuery& vq, float s, const float* qg, float* scores, LineQueue& lq) {
#if HWY_TARGET == HWY_AVX3_DL
  ByKeyShape(fk, [&]<int BITS, int R, int LPG>() HWY_ATTR {  // lpg <= R
    if constexpr (LPG <= R) {
      if (half) return VnniKeyScoresT<BITS, R, LPG, true>(codes, n, lo, sc, vq, s, qg, scores, lq);
      return VnniKeyScoresT<BITS, R, LPG, false>(codes, n, lo, sc, vq, s, qg, scores, lq);
    }
  });
#elif HWY_TARGET == HWY_AVX2
  ByKeyShape(fk, [&]<int BITS, int R, int LPG>() HWY_ATTR {  // bits <= 4, lpg <= R, R / lpg <= 8
    if constexpr (BITS <= 4 && LPG <= R && R / LPG <= 8) {
      if (half) return Avx2KeyScoresT<BITS, R, LPG, true>(codes, n, lo, sc, vq, s, qg, scores, lq);
      return Avx2KeyScoresT<BITS, R, LPG, false>(codes, n, lo, sc, vq, s, qg, scores, lq);
    }
  });
#else
  (void)fk, (void)codes, (void)n, (void)lo, (void)sc, (void)half, (void)vq, (void)s, (void)qg, (void)scores, (void)lq;
#endif
}

// scores[t] = q . x_t for the block's rows. qpat[(k * P + ph) * N + lane]:
// q of the channel that code k of the word in `lane` at phase ph holds; qls
// [ph * N + lane]: the sum of q over that word's channels. With vq (AVX3_DL)
// the codes' products come from VNNI integer dot products instead.
template <int BITS>
void FusedScores(const FusedPlan& fp, const FusedBlock& blk, const float* qpat, const float* qls, const VnniQuery* vq,
                 float* scores) {
  const DF d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  constexpr auto kCodes = std::make_index_sequence<32 / BITS>();
  const Expander meta(fp.lpg, N);
  // q . f summed per word (lane) of vector v at phase ph
  auto lane_dot = [&](std::int64_t v, std::int64_t ph) HWY_ATTR -> VF {
#if HWY_TARGET == HWY_AVX3_DL
    if (vq != nullptr) return VnniWordDot<BITS>(blk.wb[v], *vq, ph, fp.P * 64, hn::Load(d, qls + ph * N));
#endif
    (void)vq;
    return WordDot<BITS>(blk.wb[v], qpat + ph * N, fp.P * N, kCodes);
  };
  // per word: sct * (q . f) + lot * sum(q)
  auto lane_score = [&](std::int64_t v, std::int64_t ph, VF acc) HWY_ATTR -> VF {
    return hn::MulAdd(meta(blk.sct, v), acc, hn::Mul(meta(blk.lot, v), hn::Load(d, qls + ph * N)));
  };
  // Per vector of words: rows that share it (R < N) or one row's sum over its
  // P vectors (R >= N): `seg` lanes per row. seg such vectors at a time, sum
  // adjacent lanes pairwise (ConcatEven + ConcatOdd keep the rows in order)
  // until one lane is one row.
  const std::int64_t seg = std::min(fp.R, N), rows_per_vec = N / seg;
  const std::int64_t nv = (blk.n + rows_per_vec - 1) / rows_per_vec;  // vectors of seg-lane rows
  auto row_vec = [&](std::int64_t u) HWY_ATTR -> VF {
    if (u >= nv) return hn::Zero(d);
    if (fp.P == 1) return lane_score(u, 0, lane_dot(u, 0));
    VF z = hn::Zero(d);
    for (std::int64_t ph = 0; ph < fp.P; ++ph) z = hn::Add(z, lane_score(u * fp.P + ph, ph, lane_dot(u * fp.P + ph, ph)));
    return z;
  };
  VF y[64];
  for (std::int64_t j = 0; j < seg; ++j) y[j] = hn::Zero(d);
  for (std::int64_t u0 = 0; u0 < nv; u0 += seg) {
    for (std::int64_t j = 0; j < seg; ++j) y[j] = row_vec(u0 + j);
    for (std::int64_t m = seg; m > 1; m /= 2) {
#if HWY_TARGET != HWY_SCALAR  // (one lane: seg is 1)
      for (std::int64_t j = 0; j < m / 2; ++j) {
        y[j] = hn::Add(hn::ConcatEven(d, y[2 * j + 1], y[2 * j]), hn::ConcatOdd(d, y[2 * j + 1], y[2 * j]));
      }
#endif
    }
    hn::StoreU(y[0], d, scores + u0 / seg * N);  // scores has N floats of room past the block
  }
}

// accx[(k * P + ph) * N + lane] += sum over rows of w_t * sct * f_k and
// lov[lane] (lane -> group lane % G, or phase when G > N) += w_t * lot, for
// weights w[0..n) (zero from n on, N readable past n).
template <int BITS>
void FusedValues(const FusedPlan& fp, const FusedBlock& blk, const float* w, float* accx, float* lov) {
  const DF d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  constexpr int kCpl = 32 / BITS;
  constexpr auto kCodes = std::make_index_sequence<kCpl>();
  const Expander meta(fp.lpg, N), rows(fp.R, N);
  for (std::int64_t ph = 0; ph < fp.P; ++ph) {
    VF acc[kCpl];
    for (int k = 0; k < kCpl; ++k) acc[k] = hn::Load(d, accx + (k * fp.P + ph) * N);
    for (std::int64_t v = ph; v < blk.wb.nvec(); v += fp.P) {
      WordAxpy<BITS>(blk.wb[v], hn::Mul(rows(w, v), meta(blk.sct, v)), acc, kCodes);
    }
    for (int k = 0; k < kCpl; ++k) hn::Store(acc[k], d, accx + (k * fp.P + ph) * N);
  }
  const Expander per_group(fp.G, N);
  const std::int64_t entries = blk.n * fp.G;
  if (fp.Lp == N) {  // one accumulator: keep it in a register
    VF lo = hn::Load(d, lov);
    for (std::int64_t u = 0; u * N < entries; ++u) lo = hn::MulAdd(per_group(w, u), hn::LoadU(d, blk.lot + u * N), lo);
    hn::Store(lo, d, lov);
    return;
  }
  for (std::int64_t u = 0; u * N < entries; ++u) {
    float* lo = lov + (u * N) % fp.Lp;
    hn::Store(hn::MulAdd(per_group(w, u), hn::LoadU(d, blk.lot + u * N), hn::Load(d, lo)), d, lo);
  }
}

void Scores(const FusedPlan& fp, const FusedBlock& blk, const float* qpat, const float* qls, const VnniQuery* vq,
            float* scores) {
  ByBits(fp.bits, [&]<int B>() HWY_ATTR { FusedScores<B>(fp, blk, qpat, qls, vq, scores); });
}

void Values(const FusedPlan& fp, const FusedBlock& blk, const float* w, float* accx, float* lov) {
  ByBits(fp.bits, [&]<int B>() HWY_ATTR { FusedValues<B>(fp, blk, w, accx, lov); });
}

// ---------------------------------------------------------------------------
// Values through VNNI (AVX3_DL; 1, 2, 4 or 8 bits, 16-64 bytes a row, at most
// 4 groups a row): per block, the weights u = p * scale of every (row, group)
// are rounded to 16 bits against the block's largest, u ~ sw * (256 hi + lo)
// (hi, lo int8), and the rows are taken 4 at a time: `vpermi2b` puts byte
// `pos` of the 4 rows side by side in one 32-bit lane, a mask leaves code m of
// every byte in place (c * 2^(m bits) <= 255), and `vpdpbusd` adds the 4 rows'
// codes times their weights. Integer sums live for one block (at most
// 32 * 4 * 255 * 128 per lane), then go, scaled back by 2^-(m bits), to float
// slots [J][8 / bits][16] (J = row bytes / 16; lane l of slot (j, m) is code m
// of byte pos[j][l] of a row, chosen so that a lane meets the same group in
// every j: one spread of a quad's weights serves all J). A quad's J slices
// are done together, its rows and weights loaded once.
// Error: |u - sw q| <= umax / 64000 per (row, group) (rounding to nearest of
// u times a reciprocal within an ulp), so a block moves sum(p x) by at most
// n * umax * (2^b - 1) / 64000 <= 128 (2^b - 1) max(scale) / 64000 of the sum
// of weights (docs/numerics.md).
// ---------------------------------------------------------------------------
struct VnniValuePlan {
  bool ok = false;
  std::int64_t J = 0, per_byte = 0, nslots = 0;
  // vpermb indices from a quad's 4G weights as int32 lanes (row t, group g at
  // lane t G + g) to byte t of lane l = row t's weight of lane l's group
  alignas(64) std::uint8_t wix[64] = {};
  // vpermi2b indices: byte 4 l + t of output j is byte pos[j][l] of row t of a quad
  alignas(64) std::uint8_t ix[4][64] = {};
  // AVX2 (Avx2ValuesT): vpshufb indices from a pair's 2G int16 weights (row 0
  // at 0..G-1, row 1 at G..2G-1) to lane k of pass (j, vi): (row 0's, row 1's
  // weight of that lane's group)
  alignas(32) std::uint8_t widx[2][2][32] = {};
  // the (permuted) channel that each float slot of the value sums adds to
  std::int16_t chan[512] = {};
  std::int64_t slots() const { return nslots; }
};

VnniValuePlan PlanVnniValues(const FusedPlan& fv) {
  VnniValuePlan v;
  const std::int64_t RB = fv.R * 4;
  if (!fv.ok || fv.G > 4 || 4 % fv.G != 0) return v;
  if (kVnni && (RB == 16 || RB == 32 || RB == 64)) {
    v.ok = true;
    v.J = RB / 16;
    v.per_byte = 8 / fv.bits;
    v.nslots = v.J * v.per_byte * 16;
    const std::int64_t LG = 16 / fv.G, BG = RB / fv.G;  // lanes of a group in one output; bytes of a group
    for (std::int64_t l = 0; l < 16; ++l)  // lane l meets group l / LG in every output
      for (std::int64_t t = 0; t < 4; ++t) v.wix[4 * l + t] = static_cast<std::uint8_t>(4 * (t * fv.G + l / LG));
    for (std::int64_t j = 0; j < v.J; ++j)
      for (std::int64_t l = 0; l < 16; ++l) {
        const std::int64_t pos = (l / LG) * BG + j * LG + l % LG;  // byte of the row
        for (std::int64_t m = 0; m < v.per_byte; ++m)  // slot (j, m) lane l: code m of byte pos
          v.chan[(j * v.per_byte + m) * 16 + l] = static_cast<std::int16_t>(pos * v.per_byte + m);
        for (std::int64_t t = 0; t < 4; ++t) {  // two source vectors: rows 0-1 and 2-3 when a row is 64 bytes
          v.ix[j][4 * l + t] = static_cast<std::uint8_t>(RB == 64 ? (t % 2) * 64 + pos : t * RB + pos);
        }
      }
  }
  if (kAvx2Int && (RB == 32 || RB == 64)) {
    v.ok = true;
    v.J = RB / 32;
    v.per_byte = 8 / fv.bits;
    v.nslots = v.J * 2 * 2 * v.per_byte * 8;
    const std::int64_t words = RB / 2;  // 16-bit words a row
    for (std::int64_t j = 0; j < v.J; ++j)
      for (std::int64_t vi = 0; vi < 2; ++vi)
        for (std::int64_t k = 0; k < 8; ++k) {
          // vpunpck{l,h}wd of 32 bytes: lanes 0-3 hold words 4 vi + 0..3, lanes 4-7 words 8 + 4 vi + 0..3
          const std::int64_t word = 16 * j + 4 * vi + (k < 4 ? k : k + 4);
          const std::int64_t grp = word * fv.G / words;
          for (std::int64_t b = 0; b < 2; ++b) {
            v.widx[j][vi][4 * k + b] = static_cast<std::uint8_t>(2 * grp + b);
            v.widx[j][vi][4 * k + 2 + b] = static_cast<std::uint8_t>(2 * (fv.G + grp) + b);
          }
          for (std::int64_t half = 0; half < 2; ++half)
            for (std::int64_t m = 0; m < v.per_byte; ++m)
              v.chan[(((j * 2 + vi) * 2 + half) * v.per_byte + m) * 8 + k] =
                  static_cast<std::int16_t>((2 * word + half) * v.per_byte + m);
        }
  }
  return v;
}

#if HWY_TARGET == HWY_AVX3_DL
template <int BITS, int J, bool kHalf>  // J: row bytes / 16 (compile-time: the accumulators stay in registers)
void VnniValuesT(const FusedPlan& fp, const VnniValuePlan& vp, const std::uint8_t* codes, std::int64_t n, const float* w,
                 const void* lo, const void* sc, float* accv, float* lov, LineQueue& lq) {
  constexpr int kPerByte = 8 / BITS;
  constexpr std::int64_t RB = 16 * J;
  const std::int64_t G = fp.G;
  const DF d;
  // weights u[t * G + g] for t < n (rows from n on: 0)
  alignas(64) float u[kFused * 4 + 64];
  const std::int64_t n4 = (n + 3) / 4 * 4, entries = n4 * G;
  const Expander per_row(G, 16);
  const std::int64_t end = (entries + 15) / 16 * 16, valid = n * G;
  // One pass over the (row, group) entries: u = p scale, and lov (lane l:
  // group l % G) += p lo, as FusedValues sums it.
  VF vmax = hn::Zero(d), lacc = hn::Load(d, lov);
  const auto entry = [&](std::int64_t e, VF s, VF l) HWY_ATTR {
    const VF x = per_row(w, e / 16);
    const VF ue = hn::Mul(x, s);
    hn::Store(ue, d, u + e);
    vmax = hn::Max(vmax, ue);
    lacc = hn::MulAdd(x, l, lacc);
  };
  std::int64_t e0 = 0;
  for (; e0 + 16 <= valid; e0 += 16) entry(e0, VF{MetaLoad<kHalf>(sc, e0, 16)}, VF{MetaLoad<kHalf>(lo, e0, 16)});
  for (; e0 < end; e0 += 16) {  // metadata past the block's rows read as 0 (their weights are 0 too)
    entry(e0, VF{MetaLoad<kHalf>(sc, e0, valid - e0)}, VF{MetaLoad<kHalf>(lo, e0, valid - e0)});
  }
  hn::Store(lacc, d, lov);
  const float umax = hn::GetLane(hn::MaxOfLanes(d, vmax));
  if (!(umax > 0.0f)) return;  // every scale 0 (or every weight): the block's values are their lo
  const float sw = umax / 32512.0f;
  hn::Store(hn::Zero(d), d, u + end);  // a quad's 16-lane load past the last entries reads zeros
  const std::int64_t nq4 = n4 / 4;
  // The last, partial quad from a zero-padded copy (its weights are zero too).
  alignas(64) std::uint8_t pad[256] = {};
  const std::int64_t full = n / 4;
  if (full < nq4) std::memcpy(pad, codes + full * 4 * RB, static_cast<std::size_t>((n - full * 4) * RB));
  // Slice m of a byte is masked in place (code * 2^(m bits), at most 255) and
  // its sums scaled back by 2^-(m bits) at the end: no shifts.
  const VF s_hi = hn::Set(d, 256.0f * sw), s_lo = hn::Set(d, sw);
  // All J slices of a quad together: its rows and weights are loaded once
  // (D = 128: J * kPerByte = 8, so 16 accumulators at every code width).
  const __m512i wix = _mm512_load_si512(vp.wix), c128 = _mm512_set1_epi32(128);
  const __m512 vinv = _mm512_set1_ps(1.0f / sw);  // u / sw to within an ulp: |q| <= 32512 still (it rounds to nearest)
  __m512i idx[J], ah[J][kPerByte], al[J][kPerByte];
  for (int j = 0; j < J; ++j) {
    idx[j] = _mm512_load_si512(vp.ix[j]);
    for (int m = 0; m < kPerByte; ++m) ah[j][m] = al[j][m] = _mm512_setzero_si512();
  }
  for (std::int64_t k = 0; k < nq4; ++k) {
    lq.issue(2 * J);
    const std::uint8_t* src = k < full ? codes + k * 4 * RB : pad;
    const __m512i x0 = _mm512_loadu_si512(src);
    __m512i x1 = x0, x2 = x0, x3 = x0;
    if constexpr (RB >= 32) x1 = _mm512_loadu_si512(src + 64);
    if constexpr (RB == 64) {
      x2 = _mm512_loadu_si512(src + 128);
      x3 = _mm512_loadu_si512(src + 192);
    }
    // The quad's weights to 16 bits, q = 256 hi + lo (hi, lo int8; |u / sw| <=
    // 32512, so the conversion rounds to nearest without saturating), then
    // byte t of lane l = row t's weight of lane l's group.
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(u + 4 * G * k), vinv));
    const __m512i qhi = _mm512_srai_epi32(_mm512_add_epi32(q, c128), 8);
    const __m512i qlo = _mm512_sub_epi32(q, _mm512_slli_epi32(qhi, 8));
    const __m512i wh = _mm512_permutexvar_epi8(wix, qhi), wl = _mm512_permutexvar_epi8(wix, qlo);
    for (int j = 0; j < J; ++j) {
      __m512i y;
      if constexpr (RB == 64) {  // rows 0, 1 from x0, x1 and rows 2, 3 from x2, x3
        const __m512i y01 = _mm512_permutex2var_epi8(x0, idx[j], x1), y23 = _mm512_permutex2var_epi8(x2, idx[j], x3);
        y = _mm512_mask_blend_epi8(static_cast<__mmask64>(0xCCCCCCCCCCCCCCCCull), y01, y23);
      } else if constexpr (RB == 32) {
        y = _mm512_permutex2var_epi8(x0, idx[j], x1);
      } else {
        y = _mm512_permutexvar_epi8(idx[j], x0);
      }
      for (int m = 0; m < kPerByte; ++m) {
        __m512i c = y;
        if constexpr (BITS < 8) c = _mm512_and_si512(y, _mm512_set1_epi8(static_cast<char>(((1 << BITS) - 1) << (m * BITS))));
        ah[j][m] = Dpbusd(ah[j][m], c, wh);
        al[j][m] = Dpbusd(al[j][m], c, wl);
      }
    }
  }
  for (int j = 0; j < J; ++j) {
    for (int m = 0; m < kPerByte; ++m) {
      float* slot = accv + (j * kPerByte + m) * 16;
      const VF down = hn::Set(d, 1.0f / static_cast<float>(1u << (m * BITS)));
      const VF fh{_mm512_cvtepi32_ps(ah[j][m])}, fl{_mm512_cvtepi32_ps(al[j][m])};
      hn::Store(hn::MulAdd(hn::Mul(fh, down), s_hi, hn::MulAdd(hn::Mul(fl, down), s_lo, hn::Load(d, slot))), d, slot);
    }
  }
}
#endif

#if HWY_TARGET == HWY_AVX2
// Values on AVX2: per block the weights u = p * scale of every (row, group)
// rounded to 16 bits against the block's largest as on AVX3_DL (u ~ sw q,
// 0 <= q <= 32512), and the rows taken two at a time: vpunpck{l,h}wd puts a
// 16-bit word of row 0 and the same word of row 1 side by side in one 32-bit
// lane, a mask leaves code m of the word's low (or, after a shift by 8, high)
// byte in place (c * 2^(m bits) <= 255), and vpmaddwd adds both rows' codes
// times their weights (q of the word's group, by vpshufb from the pair's 2G
// weights) into int32: a pair adds at most 2 * 255 * 32512, a block of 128
// rows at most 1.06e9. One pass a (j, vi) output (8 / bits * 2 accumulators);
// the sums go, scaled back by sw 2^-(m bits), to float slots
// [j][vi][half][m][8] (channels in VnniValuePlan::chan). Error as on AVX3_DL.
template <int BITS, int J, bool kHalf>
void Avx2ValuesT(const FusedPlan& fp, const VnniValuePlan& vp, const std::uint8_t* codes, std::int64_t n, const float* w,
                 const void* lo, const void* sc, float* accv, float* lov, LineQueue& lq) {
  constexpr int kPerByte = 8 / BITS;
  constexpr std::int64_t RB = 32 * J;
  const std::int64_t G = fp.G;
  const DF d;
  // weights u[t * G + g] for t < n (rows from n on: 0)
  alignas(32) float u[kFused * 4 + 16];
  const std::int64_t n2 = (n + 1) / 2 * 2, entries = n2 * G;
  const std::int64_t end = (entries + 7) / 8 * 8, valid = n * G;
  // One pass over the (row, group) entries: u = p scale, and lov (lane l:
  // group l % G) += p lo, as FusedValues sums it. Entry e's weight is
  // w[e / G] (G = 1, 2 or 4): lanes [e, e + 8) from w[e / G] on by vpermps.
  const int gshift = G == 1 ? 0 : G == 2 ? 1 : 2;
  const __m256i ridx = _mm256_srlv_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(gshift));
  __m256 vmax0 = _mm256_setzero_ps(), vmax1 = _mm256_setzero_ps(), lacc = _mm256_load_ps(lov);
  const auto entry = [&](std::int64_t e, __m256 s, __m256 l, __m256& vmax) HWY_ATTR {
    const __m256 x = _mm256_permutevar8x32_ps(_mm256_loadu_ps(w + (e >> gshift)), ridx);
    const __m256 ue = _mm256_mul_ps(x, s);
    _mm256_store_ps(u + e, ue);
    vmax = _mm256_max_ps(vmax, ue);
    lacc = _mm256_fmadd_ps(x, l, lacc);
  };
  std::int64_t e0 = 0;
  for (; e0 + 16 <= valid; e0 += 16) {
    entry(e0, MetaLoad8Full<kHalf>(sc, e0), MetaLoad8Full<kHalf>(lo, e0), vmax0);
    entry(e0 + 8, MetaLoad8Full<kHalf>(sc, e0 + 8), MetaLoad8Full<kHalf>(lo, e0 + 8), vmax1);
  }
  for (; e0 < end; e0 += 8) {  // metadata past the block's rows read as 0 (their weights are 0 too)
    entry(e0, MetaLoad8<kHalf>(sc, e0, valid - e0), MetaLoad8<kHalf>(lo, e0, valid - e0), vmax0);
  }
  _mm256_store_ps(lov, lacc);
  const float umax = hn::GetLane(hn::MaxOfLanes(d, VF{_mm256_max_ps(vmax0, vmax1)}));
  if (!(umax > 0.0f)) return;  // every scale 0 (or every weight): the block's values are their lo
  const float sw = umax / 32512.0f;
  // q = u / sw rounded to nearest (to within an ulp: q <= 32512 still), as
  // int16; a pair's 16-byte load past the last entries reads zeros
  alignas(32) std::int16_t qw[kFused * 4 + 16];
  std::memset(qw + end, 0, 16 * sizeof(std::int16_t));
  const __m256 vinv = _mm256_set1_ps(1.0f / sw);
  for (std::int64_t e0 = 0; e0 < end; e0 += 8) {
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(u + e0), vinv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qw + e0),
                     _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
  }
  // The last, partial pair from a zero-padded copy (its weights are zero too).
  alignas(32) std::uint8_t pad[2 * RB] = {};
  const std::int64_t full = n / 2, np = n2 / 2;
  if (full < np) std::memcpy(pad, codes + full * 2 * RB, static_cast<std::size_t>((n - full * 2) * RB));
  __m256i mk[kPerByte];
  for (int m = 0; m < kPerByte; ++m) mk[m] = _mm256_set1_epi16(static_cast<std::int16_t>(((1 << BITS) - 1) << (m * BITS)));
  // One pass a (j, vi) output (vi a compile-time constant: the unpack is fixed
  // in the loop); the full pairs, then the last from the padded copy.
  const auto pass = [&]<int VI>(int j) HWY_ATTR {
    const __m256i widx = _mm256_load_si256(reinterpret_cast<const __m256i*>(vp.widx[j][VI]));
    __m256i acc[2][kPerByte];
    for (int m = 0; m < kPerByte; ++m) acc[0][m] = acc[1][m] = _mm256_setzero_si256();
    const auto pair = [&](const std::uint8_t* src, std::int64_t k) HWY_ATTR {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * j));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + RB + 32 * j));
      const __m256i x = VI == 0 ? _mm256_unpacklo_epi16(a, b) : _mm256_unpackhi_epi16(a, b);
      const __m256i wq = _mm256_shuffle_epi8(
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qw + 2 * G * k))), widx);
      const __m256i xh = _mm256_srli_epi16(x, 8);
      for (int m = 0; m < kPerByte; ++m) {
        acc[0][m] = _mm256_add_epi32(acc[0][m], _mm256_madd_epi16(_mm256_and_si256(x, mk[m]), wq));
        acc[1][m] = _mm256_add_epi32(acc[1][m], _mm256_madd_epi16(_mm256_and_si256(xh, mk[m]), wq));
      }
    };
    std::int64_t k = 0;
    for (; k + 2 <= full; k += 2) {
      lq.issue(2);
      pair(codes + k * 2 * RB, k);
      pair(codes + (k + 1) * 2 * RB, k + 1);
    }
    for (; k < np; ++k) pair(k < full ? codes + k * 2 * RB : pad, k);
    for (int half = 0; half < 2; ++half)
      for (int m = 0; m < kPerByte; ++m) {
        float* slot = accv + (((j * 2 + VI) * 2 + half) * kPerByte + m) * 8;
        const __m256 down = _mm256_set1_ps(sw / static_cast<float>(1u << (m * BITS)));
        _mm256_store_ps(slot, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[half][m]), down, _mm256_load_ps(slot)));
      }
  };
  for (int j = 0; j < J; ++j) {
    pass.template operator()<0>(j);
    pass.template operator()<1>(j);
  }
}
#endif

void VnniValues(const FusedPlan& fp, const VnniValuePlan& vp, const std::uint8_t* codes, std::int64_t n, const float* w,
                const void* lo, const void* sc, bool half, float* accv, float* lov, LineQueue& lq) {
#if HWY_TARGET == HWY_AVX2
  auto go = [&]<int BITS, int J>() {
    if (half) return Avx2ValuesT<BITS, J, true>(fp, vp, codes, n, w, lo, sc, accv, lov, lq);
    return Avx2ValuesT<BITS, J, false>(fp, vp, codes, n, w, lo, sc, accv, lov, lq);
  };
  ByBits(fp.bits, [&]<int BITS>() HWY_ATTR {
    if (vp.J == 1) return go.template operator()<BITS, 1>();
    return go.template operator()<BITS, 2>();
  });
#elif HWY_TARGET == HWY_AVX3_DL
  auto go = [&]<int BITS, int J>() {
    if (half) return VnniValuesT<BITS, J, true>(fp, vp, codes, n, w, lo, sc, accv, lov, lq);
    return VnniValuesT<BITS, J, false>(fp, vp, codes, n, w, lo, sc, accv, lov, lq);
  };
  auto by_j = [&]<int BITS>() HWY_ATTR {
    if (vp.J == 1) return go.template operator()<BITS, 1>();
    if (vp.J == 2) return go.template operator()<BITS, 2>();
    return go.template operator()<BITS, 4>();
  };
  ByBits(fp.bits, by_j);
#else
  (void)fp, (void)vp, (void)codes, (void)n, (void)w, (void)lo, (void)sc, (void)half, (void)accv, (void)lov, (void)lq;
#endif
}

// Queues the code words and metadata of packed rows [t0, t0 + n) of one side:
// the hardware prefetchers alone lose the streams at page and chunk boundaries.
void PrefetchRows(const AttendParams& p, int side, const FusedPlan& fp, std::int64_t b, std::int64_t h, std::int64_t t0,
                  std::int64_t n, LineQueue& lq) {
  const PackedRowsAt at(p, side, b, h, t0);
  const std::uint8_t* codes = at.codes + at.i0 * fp.R * 4;
  lq.push(codes, n * fp.R * 4);
  lq.push(at.lo, n * at.mrow);
  lq.push(at.scale, n * at.mrow);
}

// The packed rows [t0, t0 + n) of one side: where their code words start, and
// their (lot, sct) metadata.
const std::uint8_t* FusedRows(const AttendParams& p, int side, const FusedPlan& fp, std::int64_t b, std::int64_t h,
                              std::int64_t t0, std::int64_t n, float* lot, float* sct) {
  const PackedRowsAt at(p, side, b, h, t0);
  const detail::SkvqState& st = at.st;
  const std::uint8_t* lo = at.lo;
  const std::uint8_t* sc = at.scale;
  const std::uint8_t* codes = at.codes + at.i0 * fp.R * 4;
  const DF d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d)), m = n * fp.G;
  const VF two_b = hn::Set(d, static_cast<float>(1 << fp.bits));
  std::int64_t e = 0;
  if (st.cfg.metadata == MetaType::fp16) {  // one pass: convert and transform
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* lh = reinterpret_cast<const hwy::float16_t*>(lo);
    const auto* sh = reinterpret_cast<const hwy::float16_t*>(sc);
    for (; e + N <= m; e += N) {
      const VF s = hn::Mul(hn::PromoteTo(d, hn::LoadU(dh, sh + e)), two_b);
      hn::StoreU(s, d, sct + e);
      hn::StoreU(hn::Sub(hn::PromoteTo(d, hn::LoadU(dh, lh + e)), s), d, lot + e);
    }
  }
  LoadMeta(lo + e * meta_bytes(st.cfg.metadata), sc + e * meta_bytes(st.cfg.metadata), st.cfg.metadata, m - e, lot + e,
           sct + e);
  for (; e + N <= m; e += N) {
    const VF s = hn::Mul(hn::LoadU(d, sct + e), two_b);
    hn::StoreU(s, d, sct + e);
    hn::StoreU(hn::Sub(hn::LoadU(d, lot + e), s), d, lot + e);
  }
  for (; e < m; ++e) {
    sct[e] *= static_cast<float>(1 << fp.bits);
    lot[e] -= sct[e];
  }
  // The kernels read whole vectors: the N entries past the rows' are zero
  // (scratch reused from earlier calls may hold anything, NaN included, and
  // a zero weight times NaN is NaN).
  std::fill(lot + m, lot + m + N, 0.0f);
  std::fill(sct + m, sct + m + N, 0.0f);
  return codes;
}

// The packed rows [t0, t0 + n) of one side for the integer paths: their code
// words, and their metadata as stored when it is fp16 (read in place) or as
// float in lo_f / sc_f otherwise.
struct RawRows {
  const std::uint8_t* codes;
  const void* lo;
  const void* sc;
  bool half;
};
RawRows RawFusedRows(const AttendParams& p, int side, const FusedPlan& fp, std::int64_t b, std::int64_t h, std::int64_t t0,
                     std::int64_t n, float* lo_f, float* sc_f) {
  const PackedRowsAt at(p, side, b, h, t0);
  const std::uint8_t* codes = at.codes + at.i0 * fp.R * 4;
  if (at.st.cfg.metadata == MetaType::fp16) return {codes, at.lo, at.scale, true};
  LoadMeta(at.lo, at.scale, at.st.cfg.metadata, n * fp.G, lo_f, sc_f);
  return {codes, lo_f, sc_f, false};
}

// Float storage reused from call to call by the thread that holds it (grows,
// never shrinks): per-call allocations cost page faults and zeroing that a
// short context notices.
class Reused {
 public:
  // n floats (at least one), 64-byte aligned; the previous contents are lost.
  float* get(std::int64_t n) {
    const auto m = static_cast<std::size_t>(std::max<std::int64_t>(n, 1));
    if (m > cap_) {
      buf_ = hwy::AllocateAligned<float>(m);
      cap_ = m;
    }
#if defined(__SANITIZE_ADDRESS__)
    // Sanitizer builds (CI) poison the storage with NaN on every call, so a
    // kernel that reads stale scratch shows NaN in the tests' outputs
    // instead of passing on whatever the last call left.
    std::fill(buf_.get(), buf_.get() + m, std::numeric_limits<float>::quiet_NaN());
#endif
    return buf_.get();
  }

 private:
  hwy::AlignedFreeUniquePtr<float[]> buf_;
  std::size_t cap_ = 0;
};

// Offsets of 64-byte aligned pieces of one float buffer.
class Carve {
 public:
  std::int64_t take(std::int64_t n) {
    const std::int64_t at = size_;
    size_ += RoundUp(std::max<std::int64_t>(n, 1), 16);
    return at;
  }
  std::int64_t size() const { return size_; }

 private:
  std::int64_t size_ = 0;
};

// Shapes and kernel plans shared by every head of a call, and where each
// head's and each (head, split)'s data lie in the call's buffers.
struct Plan {
  std::int64_t L, Gq, nq, D, Dv, Dp, Dvp, g;
  FusedPlan fk, fv;
  VnniValuePlan vv;
  bool vnni, vkeys;
  // strides of the per query row arrays (0 where the kernels in use need none)
  std::int64_t qstride, lstride, xstride, sstride, vbytes;
  // a head's query layouts (HeadQuery), in floats
  std::int64_t q_o, q_p, qpat, qls, qg, qstep, vq_bytes, per_query;
  // a (head, split)'s running state (HeadRun), in floats
  std::int64_t m, l, acc_o, acc_p, lov, accv, accx, per_part;
  // a task's scratch, in floats
  std::int64_t krows, vrows, S, klo, ksc, vlo, vsc, row, per_task;
  explicit Plan(const AttendParams& p)
      : L(static_cast<std::int64_t>(hn::Lanes(DF()))),
        Gq(p.num_q_heads / p.num_kv_heads),
        nq(Gq * p.sq),
        D(p.head_dim),
        Dv(p.v_head_dim),
        Dp(RoundUp(D, L)),
        Dvp(RoundUp(Dv, L)),
        g(p.st ? p.st->cfg.group_size : 1),
        fk(PlanFused(p, 0, L)),
        fv(PlanFused(p, 1, L)),
        vv(PlanVnniValues(fv)),
        vnni((kVnni && fk.ok) || (kAvx2Int && VnniKeysOk(fk))),
        vkeys(vnni && VnniKeysOk(fk)),
        qstride(fk.ok && !vkeys ? fk.slots() * L : 0),
        lstride(fk.ok && !vkeys ? fk.P * L : 0),
        xstride(fv.ok && !vv.ok ? fv.slots() * L : 0),
        sstride(kFused + L),
        vbytes(vnni ? (8 / fk.bits) * fk.P * 4 * L : 0) {
    Carve q;
    q_o = q.take(nq * Dp);
    q_p = q.take(nq * Dp);
    qpat = q.take(nq * qstride);
    qls = q.take(nq * lstride);
    qg = q.take(nq * L);
    qstep = q.take(nq);
    vq_bytes = q.take((2 * nq * vbytes + 3) / 4);
    per_query = q.size();
    Carve r;
    m = r.take(nq);
    l = r.take(nq);
    acc_o = r.take(nq * Dvp);
    acc_p = r.take(nq * Dvp);
    lov = r.take(fv.ok ? nq * fv.Lp : 0);
    accv = r.take(nq * vv.slots());
    accx = r.take(nq * xstride);
    per_part = r.size();
    Carve t;
    krows = t.take(kFused * Dp);
    vrows = t.take(kFused * Dvp);
    S = t.take(nq * sstride);
    klo = t.take(kFused * fk.G + L);
    ksc = t.take(kFused * fk.G + L);
    vlo = t.take(kFused * fv.G + L);
    vsc = t.take(kFused * fv.G + L);
    row = t.take(2 * Dv);
    per_task = t.size();
  }
  // The end of the block that starts at token t (at most t_end): one segment,
  // kFused rows on the fused path, kBlock otherwise.
  std::int64_t BlockEnd(const AttendParams& p, std::int64_t t, std::int64_t t_end) const {
    const std::int64_t n = InPackedBody(p, t) && (fk.ok || fv.ok) ? kFused : kBlock;
    return std::min({t + n, SegmentEnd(p, t), t_end});
  }
};

// Scratch of one task, reused by every head and block it walks (the worker
// thread's own storage).
struct Scratch {
  float *krows, *vrows, *S, *klo, *ksc, *vlo, *vsc, *row;
  explicit Scratch(const Plan& pl) {
    thread_local Reused mem;
    float* base = mem.get(pl.per_task);
    krows = base + pl.krows;
    vrows = base + pl.vrows;
    S = base + pl.S;
    klo = base + pl.klo;
    ksc = base + pl.ksc;
    vlo = base + pl.vlo;
    vsc = base + pl.vsc;
    row = base + pl.row;
    // Rows are decoded D channels wide and dotted Dp wide: the padding stays 0.
    if (pl.Dp != pl.D) std::fill(krows, krows + kFused * pl.Dp, 0.0f);
    if (pl.Dvp != pl.Dv) std::fill(vrows, vrows + kFused * pl.Dvp, 0.0f);
  }
};

// One KV head's query rows in the layouts of the kernels (per_query floats at
// `base`; built once per call and shared by the head's splits).
struct HeadQuery {
  const float *q_o, *q_p, *qpat, *qls, *qg, *qstep;
  const VnniQuery* vq;  // nq of them
};

HeadQuery BuildHeadQuery(const AttendParams& p, const Plan& pl, std::int64_t b, std::int64_t h, float* base, VnniQuery* vq) {
  const FusedPlan& fk = pl.fk;
  const std::int64_t L = pl.L, D = pl.D, Dp = pl.Dp;
  std::fill(base, base + pl.per_query, 0.0f);
  float *q_o = base + pl.q_o, *q_p = base + pl.q_p, *qpat = base + pl.qpat, *qls = base + pl.qls, *qg = base + pl.qg;
  float* qstep = base + pl.qstep;
  auto* vnni_q = reinterpret_cast<std::int8_t*>(base + pl.vq_bytes);
  const std::int32_t* kperm = (p.st && !p.st->k.perm.empty()) ? p.st->k.perm.data() + h * D : nullptr;
  for (std::int64_t qi = 0; qi < pl.nq; ++qi) {
    const std::int64_t hq = h * pl.Gq + qi / p.sq, i = qi % p.sq;
    float* qo = q_o + qi * Dp;
    for (std::int64_t dd = 0; dd < D; ++dd) qo[dd] = p.q.at(b, hq, i, dd) * p.scale;
    float* qp = q_p + qi * Dp;
    for (std::int64_t j = 0; j < D; ++j) qp[j] = kperm ? qo[kperm[j]] : qo[j];
    if (!fk.ok) continue;
    if (!pl.vkeys) {  // the per-word patterns of FusedScores
      for (std::int64_t k = 0; k < fk.cpl; ++k)
        for (std::int64_t ph = 0; ph < fk.P; ++ph)
          for (std::int64_t lane = 0; lane < L; ++lane) {
            const float qv = qp[((ph * L + lane) % fk.R) * fk.cpl + k];
            qpat[qi * pl.qstride + (k * fk.P + ph) * L + lane] = qv;
            qls[qi * pl.lstride + ph * L + lane] += qv;
          }
    }
    if (pl.vnni) {
      VnniQuery& v = vq[qi];
      std::int8_t* hi = vnni_q + 2 * qi * pl.vbytes;
      v.hi = hi;
      v.lo = hi + pl.vbytes;
      const float sq = BuildVnniQuery(fk, qp, D, L, hi, hi + pl.vbytes);
      v.step = sq / static_cast<float>(1 << fk.bits);
      qstep[qi] = sq;
      for (std::int64_t l = 0; l < L; ++l) {
        const std::int64_t grp = l % fk.G;
        float sum = 0.0f;
        for (std::int64_t j = grp * pl.g; j < (grp + 1) * pl.g; ++j) sum += qp[j];
        qg[qi * L + l] = sum;
      }
    }
  }
  return {q_o, q_p, qpat, qls, qg, qstep, vq};
}

// One KV head's online softmax over the blocks of one split, in token order:
// running max, sum and accumulators (per_part floats at `base`).
class HeadRun {
 public:
  HeadRun(const AttendParams& p, const Plan& pl, std::int64_t b, std::int64_t h, const HeadQuery& q, float* base);
  // Tokens [t, t + n): one block (Plan::BlockEnd). Its kernels issue the
  // lines queued in lq a few at a time and drain the rest.
  void Block(std::int64_t t, std::int64_t n, const Scratch& s, LineQueue& lq);
  // Queues the packed rows [t, t + n) of both sides (one block) in lq.
  void Request(std::int64_t t, std::int64_t n, LineQueue& lq) const;
  // Folds the fused value sums into the permuted accumulator.
  void Finish();

 private:
  const AttendParams& p_;
  const Plan& pl_;
  std::int64_t b_, h_;
  HeadQuery q_;
  float *m_, *l_, *acc_o_, *acc_p_, *lov_, *accv_, *accx_;
};

HeadRun::HeadRun(const AttendParams& p, const Plan& pl, std::int64_t b, std::int64_t h, const HeadQuery& q, float* base)
    : p_(p),
      pl_(pl),
      b_(b),
      h_(h),
      q_(q),
      m_(base + pl.m),
      l_(base + pl.l),
      acc_o_(base + pl.acc_o),
      acc_p_(base + pl.acc_p),
      lov_(base + pl.lov),
      accv_(base + pl.accv),
      accx_(base + pl.accx) {
  std::fill(base, base + pl.per_part, 0.0f);
  std::fill(m_, m_ + pl.nq, -INFINITY);
}

void HeadRun::Request(std::int64_t t, std::int64_t n, LineQueue& lq) const {
  if (!InPackedBody(p_, t)) return;
  if (pl_.fk.ok) PrefetchRows(p_, 0, pl_.fk, b_, h_, t, n, lq);
  if (pl_.fv.ok) PrefetchRows(p_, 1, pl_.fv, b_, h_, t, n, lq);
}

void HeadRun::Block(std::int64_t t, std::int64_t n, const Scratch& s, LineQueue& lq) {
  const AttendParams& p = p_;
  const Plan& pl = pl_;
  const FusedPlan &fk = pl.fk, &fv = pl.fv;
  const VnniValuePlan& vv = pl.vv;
  const DF d;
  const std::int64_t L = pl.L, nq = pl.nq, Dp = pl.Dp, Dvp = pl.Dvp, sstride = pl.sstride, xstride = pl.xstride;
  const std::int64_t b = b_, h = h_;
  const bool packed = InPackedBody(p, t);
  const bool use_k = packed && fk.ok, use_v = packed && fv.ok;
  float* S = s.S;
  // Scores of every query row: S[qi][0..n).
  if (use_k && pl.vkeys) {
    const RawRows kr = RawFusedRows(p, 0, fk, b, h, t, n, s.klo, s.ksc);
    for (std::int64_t qi = 0; qi < nq; ++qi) {
      VnniKeyScores(fk, kr.codes, n, kr.lo, kr.sc, kr.half, q_.vq[qi],
                    q_.qstep[qi], q_.qg + qi * L, S + qi * sstride, lq);
    }
  } else if (use_k) {
    const WordBlock wb(FusedRows(p, 0, fk, b, h, t, n, s.klo, s.ksc), n * fk.R, L);
    const FusedBlock blk{wb, n, s.klo, s.ksc};
    for (std::int64_t qi = 0; qi < nq; ++qi) {
      Scores(fk, blk, q_.qpat + qi * pl.qstride, q_.qls + qi * pl.lstride,
             pl.vnni ? &q_.vq[qi] : nullptr, S + qi * sstride);
    }
  } else {
    const bool kp = DecodeBlock(p, 0, b, h, t, n, s.krows, Dp);
    for (std::int64_t qi = 0; qi < nq; ++qi) {
      const float* qv = (kp ? q_.q_p : q_.q_o) + qi * Dp;
      for (std::int64_t tt = 0; tt < n; ++tt) S[qi * sstride + tt] = Dot(qv, s.krows + tt * Dp, Dp);
    }
  }
  // Online softmax: S becomes the weights exp(s - m) (zero where causally hidden).
  for (std::int64_t qi = 0; qi < nq; ++qi) {
    const std::int64_t i = qi % p.sq;
    const std::int64_t vis = std::min(n, p.kv_len - p.sq + i + 1 - t);  // causal
    float* sr = S + qi * sstride;
    std::fill(sr + n, sr + n + L, 0.0f);
    if (vis <= 0) continue;
    VF vmax = hn::Set(d, -INFINITY);
    std::int64_t tm = 0;
    for (; tm + L <= vis; tm += L) vmax = hn::Max(vmax, hn::LoadU(d, sr + tm));
    if (tm < vis) vmax = hn::Max(vmax, hn::IfThenElse(hn::FirstN(d, static_cast<std::size_t>(vis - tm)), hn::LoadU(d, sr + tm), vmax));
    const float m_blk = hn::GetLane(hn::MaxOfLanes(d, vmax));
    const float m_new = std::max(m_[qi], m_blk);
    const float corr = std::exp(m_[qi] - m_new);
    const VF vm = hn::Set(d, m_new);
    VF vsum = hn::Zero(d);
    std::int64_t tt = 0;
    for (; tt + L <= vis; tt += L) {
      const VF e = hn::Exp(d, hn::Sub(hn::LoadU(d, sr + tt), vm));
      hn::StoreU(e, d, sr + tt);
      vsum = hn::Add(vsum, e);
    }
    float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
    for (; tt < vis; ++tt) {
      sr[tt] = std::exp(sr[tt] - m_new);
      sum += sr[tt];
    }
    std::fill(sr + vis, sr + n, 0.0f);
    l_[qi] = l_[qi] * corr + sum;
    if (corr != 1.0f) {
      const VF vc = hn::Set(d, corr);
      float* ao = acc_o_ + qi * Dvp;
      float* ap = acc_p_ + qi * Dvp;
      for (std::int64_t j = 0; j < Dvp; j += L) {
        hn::Store(hn::Mul(hn::Load(d, ao + j), vc), d, ao + j);
        hn::Store(hn::Mul(hn::Load(d, ap + j), vc), d, ap + j);
      }
      float* ax = accx_ + qi * xstride;
      for (std::int64_t j = 0; j < xstride; j += L) hn::Store(hn::Mul(hn::Load(d, ax + j), vc), d, ax + j);
      float* av = accv_ + qi * vv.slots();
      for (std::int64_t j = 0; j < vv.slots(); j += L) hn::Store(hn::Mul(hn::Load(d, av + j), vc), d, av + j);
      float* lo = lov_ + qi * fv.Lp;
      for (std::int64_t j = 0; j < fv.Lp; j += L) hn::Store(hn::Mul(hn::Load(d, lo + j), vc), d, lo + j);
    }
    m_[qi] = m_new;
  }
  // Values.
  if (use_v && vv.ok) {
    const RawRows vr = RawFusedRows(p, 1, fv, b, h, t, n, s.vlo, s.vsc);
    for (std::int64_t qi = 0; qi < nq; ++qi) {
      if (std::min(n, p.kv_len - p.sq + qi % p.sq + 1 - t) <= 0) continue;
      VnniValues(fv, vv, vr.codes, n, S + qi * sstride, vr.lo, vr.sc, vr.half, accv_ + qi * vv.slots(),
                 lov_ + qi * fv.Lp, lq);
    }
  } else if (use_v) {
    const WordBlock wb(FusedRows(p, 1, fv, b, h, t, n, s.vlo, s.vsc), n * fv.R, L);
    const FusedBlock blk{wb, n, s.vlo, s.vsc};
    for (std::int64_t qi = 0; qi < nq; ++qi) {
      if (std::min(n, p.kv_len - p.sq + qi % p.sq + 1 - t) <= 0) continue;
      Values(fv, blk, S + qi * sstride, accx_ + qi * xstride, lov_ + qi * fv.Lp);
    }
  } else {
    const bool vp = DecodeBlock(p, 1, b, h, t, n, s.vrows, Dvp);
    for (std::int64_t qi = 0; qi < nq; ++qi) {
      const std::int64_t vis = std::min(n, p.kv_len - p.sq + qi % p.sq + 1 - t);
      if (vis <= 0) continue;
      const float* sr = S + qi * sstride;
      float* acc = (vp ? acc_p_ : acc_o_) + qi * Dvp;
      for (std::int64_t j = 0; j < Dvp; j += L) {
        VF a = hn::Load(d, acc + j);
        for (std::int64_t u = 0; u < vis; ++u) a = hn::MulAdd(hn::Set(d, sr[u]), hn::Load(d, s.vrows + u * Dvp + j), a);
        hn::Store(a, d, acc + j);
      }
    }
  }
  lq.drain();  // whatever the kernels did not issue
}

void HeadRun::Finish() {
  const Plan& pl = pl_;
  const FusedPlan& fv = pl.fv;
  const VnniValuePlan& vv = pl.vv;
  const std::int64_t L = pl.L;
  if (!fv.ok) return;
  for (std::int64_t qi = 0; qi < pl.nq; ++qi) {
    float* ap = acc_p_ + qi * pl.Dvp;
    const float* ax = accx_ + qi * pl.xstride;
    for (std::int64_t k = 0; k < fv.cpl && pl.xstride > 0; ++k)
      for (std::int64_t ph = 0; ph < fv.P; ++ph)
        for (std::int64_t lane = 0; lane < L; ++lane) {
          ap[((ph * L + lane) % fv.R) * fv.cpl + k] += ax[(k * fv.P + ph) * L + lane];
        }
    const float* av = accv_ + qi * vv.slots();
    for (std::int64_t sl = 0; sl < vv.slots(); ++sl) ap[vv.chan[sl]] += av[sl];
    const float* lo = lov_ + qi * fv.Lp;  // lane l: group l % G
    for (std::int64_t grp = 0; grp < fv.G; ++grp) {
      float sum = 0.0f;
      for (std::int64_t l = grp; l < fv.Lp; l += fv.G) sum += lo[l];
      for (std::int64_t j = grp * pl.g; j < (grp + 1) * pl.g; ++j) ap[j] += sum;
    }
  }
}

void AttendSimd(const AttendParams& p) {
  const Plan pl(p);
  const std::int64_t nq = pl.nq, Dv = pl.Dv, Dvp = pl.Dvp;
  const std::int64_t heads = p.batch * p.num_kv_heads;
  const int threads = std::max(1, p.num_threads);
  // A task walks a group of hpt KV heads of one batch row over one split of
  // the sequence block by block, every head of the group at each block: the
  // store holds a chunk's heads next to each other, so the task reads runs of
  // hpt heads' rows of each array. About two tasks a thread, from groups of
  // at least kGroupHeads heads first (fewer splits: less to combine), then
  // from splits of the sequence. Groups hold at most kGroupRows query rows
  // (the heads' query layouts and accumulators stay small); dense views keep
  // a head's rows together, so there a task walks one head (as everywhere
  // with SKVQ_CPU_WALK=head, for measuring the difference).
  constexpr std::int64_t kGroupHeads = 8, kGroupRows = 256;
  const std::int64_t want = 2 * threads;
  const char* walk = std::getenv("SKVQ_CPU_WALK");
  const bool head_major = p.st == nullptr || (walk != nullptr && std::strcmp(walk, "head") == 0);
  std::int64_t hpt = std::max((heads + want - 1) / want, std::min(p.num_kv_heads, kGroupHeads));
  hpt = head_major ? 1 : std::clamp<std::int64_t>(hpt, 1, std::min(p.num_kv_heads, std::max<std::int64_t>(1, kGroupRows / nq)));
  const std::int64_t groups = (p.num_kv_heads + hpt - 1) / hpt;
  // Splits of the sequence none shorter than 4 blocks.
  const std::int64_t units = p.batch * groups;
  std::int64_t splits = std::max<std::int64_t>(1, (want + units - 1) / units);
  splits = std::min(splits, std::max<std::int64_t>(1, p.kv_len / (4 * kBlock)));
  const std::int64_t span = RoundUp((p.kv_len + splits - 1) / splits, kBlock);
  splits = (p.kv_len + span - 1) / span;
  const std::int64_t tasks = p.batch * groups * splits;
  // The call's buffer (the calling thread's, reused): each (head, split)'s
  // running state, then each head's query layouts, built by the first task
  // that needs them.
  thread_local Reused mem;
  const std::int64_t parts = heads * splits;
  float* const buf = mem.get(parts * pl.per_part + heads * pl.per_query);
  float* const queries = buf + parts * pl.per_part;
  std::vector<VnniQuery> vq(static_cast<std::size_t>(heads * nq));
  std::vector<HeadQuery> hq(static_cast<std::size_t>(heads));
  const auto built = std::make_unique<std::once_flag[]>(static_cast<std::size_t>(heads));
  auto query = [&](std::int64_t head) -> const HeadQuery& {
    const auto i = static_cast<std::size_t>(head);
    std::call_once(built[i], [&] {
      hq[i] = BuildHeadQuery(p, pl, head / p.num_kv_heads, head % p.num_kv_heads, queries + head * pl.per_query,
                             vq.data() + head * nq);
    });
    return hq[i];
  };
  // The output rows of one KV head: its splits' results combined (row: Dv floats of scratch).
  auto combine = [&](std::int64_t head, float* row) {
    const std::int64_t b = head / p.num_kv_heads, h = head % p.num_kv_heads;
    const std::int32_t* vperm = (p.st && !p.st->v.perm.empty()) ? p.st->v.perm.data() + h * Dv : nullptr;
    auto partial = [&](std::int64_t sp) {
      float* base = buf + (head * splits + sp) * pl.per_part;
      return Partial{base + pl.m, base + pl.l, base + pl.acc_o, base + pl.acc_p};
    };
    // The splits' sums in both orders side by side (contiguous, vectorised),
    // then the permuted one scattered into the output order once a row.
    float* __restrict__ ro = row;
    float* __restrict__ rp = row + Dv;
    for (std::int64_t qi = 0; qi < nq; ++qi) {
      float M = -INFINITY;
      for (std::int64_t sp = 0; sp < splits; ++sp) M = std::max(M, partial(sp).m[qi]);
      float Lsum = 0.0f;
      std::fill(ro, ro + 2 * Dv, 0.0f);
      for (std::int64_t sp = 0; sp < splits; ++sp) {
        const Partial pt = partial(sp);
        if (pt.m[qi] == -INFINITY) continue;
        const float w = std::exp(pt.m[qi] - M);
        Lsum += pt.l[qi] * w;
        const float* __restrict__ ao = pt.acc_o + qi * Dvp;
        const float* __restrict__ ap = pt.acc_p + qi * Dvp;
        for (std::int64_t j = 0; j < Dv; ++j) {
          ro[j] += w * ao[j];
          rp[j] += w * ap[j];
        }
      }
      if (vperm) {
        for (std::int64_t j = 0; j < Dv; ++j) ro[vperm[j]] += rp[j];
      } else {
        for (std::int64_t j = 0; j < Dv; ++j) ro[j] += rp[j];
      }
      const std::int64_t hq = h * pl.Gq + qi / p.sq, i = qi % p.sq;
      if (p.out.dtype == DType::f32 && p.out.strides[3] == 1) {
        float* o = reinterpret_cast<float*>(p.out.ptr(b, hq, i, 0));
        for (std::int64_t j = 0; j < Dv; ++j) o[j] = ro[j] / Lsum;
      } else {
        for (std::int64_t j = 0; j < Dv; ++j) p.out.set(b, hq, i, j, ro[j] / Lsum);
      }
    }
  };
  detail::ThreadPool::global().parallel_for(tasks, threads, [&](std::int64_t task) {
    const std::int64_t sp = task % splits, grp = task / splits % groups, b = task / splits / groups;
    const std::int64_t h0 = grp * hpt, h1 = std::min(p.num_kv_heads, h0 + hpt);
    const std::int64_t t0 = sp * span, t1 = std::min(p.kv_len, t0 + span);
    const Scratch scratch(pl);
    LineQueue lq;
    std::vector<HeadRun> runs;
    runs.reserve(static_cast<std::size_t>(h1 - h0));
    for (std::int64_t h = h0; h < h1; ++h) {
      const std::int64_t head = b * p.num_kv_heads + h;
      runs.emplace_back(p, pl, b, h, query(head), buf + (head * splits + sp) * pl.per_part);
    }
    // While a head's block is computed, the next (head, block) of the walk
    // is asked for (a few lines at a time, from inside the kernels).
    runs[0].Request(t0, pl.BlockEnd(p, t0, t1) - t0, lq);
    for (std::int64_t t = t0; t < t1;) {
      const std::int64_t te = pl.BlockEnd(p, t, t1);
      for (std::size_t i = 0; i < runs.size(); ++i) {
        if (i + 1 < runs.size()) {
          runs[i + 1].Request(t, te - t, lq);
        } else if (te < t1) {
          runs[0].Request(te, pl.BlockEnd(p, te, t1) - te, lq);
        }
        runs[i].Block(t, te - t, scratch, lq);
      }
      t = te;
    }
    for (HeadRun& r : runs) r.Finish();
    if (splits == 1) {
      for (std::int64_t h = h0; h < h1; ++h) combine(b * p.num_kv_heads + h, scratch.row);
    }
  });
  if (splits > 1) {
    detail::ThreadPool::global().parallel_for(heads, threads, [&](std::int64_t head) {
      const Scratch scratch(pl);
      combine(head, scratch.row);
    });
  }
}

}  // namespace skvq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace skvq::cpu {

HWY_EXPORT(AttendSimd);

void attend(const AttendParams& p) { HWY_DYNAMIC_DISPATCH(AttendSimd)(p); }

}  // namespace skvq::cpu
#endif  // HWY_ONCE
