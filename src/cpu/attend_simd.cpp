// SIMD decode/prefill attention straight from the packed store.
//
// Work is split into tasks (b, kv head, token range); each task walks its
// range in blocks of up to kBlock tokens that lie in one segment (exact sinks,
// one packed chunk, exact tail, or dense rows), decodes the block's K and V
// rows to float32 scratch once, and serves every query row of the KV head's
// group (grouped-query attention) with an online softmax. Packed rows stay in
// the permuted channel order: scores use the permuted query, values
// accumulate into a permuted accumulator that is inverse-permuted once at the
// end. Partial (max, sum, acc) of the splits are combined in float32.
#include "cpu/attend_simd.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// byte -> its 8/bits codes as floats, lowest code first
struct CodeLut {
  float t1[256 * 8], t2[256 * 4], t4[256 * 2];
  CodeLut() {
    for (int b = 0; b < 256; ++b) {
      for (int k = 0; k < 8; ++k) t1[b * 8 + k] = static_cast<float>((b >> k) & 1);
      for (int k = 0; k < 4; ++k) t2[b * 4 + k] = static_cast<float>((b >> (2 * k)) & 3);
      for (int k = 0; k < 2; ++k) t4[b * 2 + k] = static_cast<float>((b >> (4 * k)) & 15);
    }
  }
};

const CodeLut& Lut() {
  static const CodeLut lut;
  return lut;
}

// D codes of `bits` (1, 2, 4 or 8) starting at byte `src` -> out[0..D) as float.
void DecodeCodes(const std::uint8_t* src, int bits, std::int64_t D, float* out) {
  const CodeLut& lut = Lut();
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
      for (std::int64_t i = 0; i < whole; ++i) std::memcpy(out + 2 * i, lut.t4 + src[i] * 2, 8);
      break;
    case 2:
      for (std::int64_t i = 0; i < whole; ++i) std::memcpy(out + 4 * i, lut.t2 + src[i] * 4, 16);
      break;
    case 1:
      for (std::int64_t i = 0; i < whole; ++i) std::memcpy(out + 8 * i, lut.t1 + src[i] * 8, 32);
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

// Token t's segment: the first token after t's segment.
std::int64_t SegmentEnd(const AttendParams& p, std::int64_t t) {
  if (p.st == nullptr) return p.kv_len;
  const detail::SkvqState& st = *p.st;
  const std::int64_t r = st.cfg.window;
  if (t < st.sinks_held()) return st.sinks_held();
  if (t < st.q_end) return std::min((t / r + 1) * r, st.q_end);
  return p.kv_len;
}

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
  const auto c = static_cast<std::size_t>(t0 / r);
  const detail::PackedChunk& ch = s.chunks[c];
  const std::int64_t i0 = t0 % r - st.first_row(c);
  const std::int64_t cph = st.codes_per_head(s, ch.n_rows), mph = st.meta_per_head(s, ch.n_rows);
  const int g = st.cfg.group_size;
  const std::int64_t G = st.groups(s), mrow = G * meta_bytes(st.cfg.metadata);
  const std::uint8_t* stream = ch.codes.data() + bh * cph;
  const std::uint8_t* lo = ch.lo.data() + bh * mph + i0 * mrow;
  const std::uint8_t* sc = ch.scale.data() + bh * mph + i0 * mrow;
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
  switch (st.cfg.metadata) {
    case MetaType::fp16:
      LoadExact(reinterpret_cast<const std::byte*>(lo), DType::f16, nm, lo_f);
      LoadExact(reinterpret_cast<const std::byte*>(sc), DType::f16, nm, sc_f);
      break;
    case MetaType::fp32:
      std::memcpy(lo_f, lo, static_cast<std::size_t>(nm) * 4);
      std::memcpy(sc_f, sc, static_cast<std::size_t>(nm) * 4);
      break;
    case MetaType::fp8_e4m3:
      for (std::int64_t e = 0; e < nm; ++e) {
        lo_f[e] = ref::e4m3_decode(lo[e]);
        sc_f[e] = ref::e4m3_decode(sc[e]);
      }
      break;
  }
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

struct Partial {  // per task and query row
  float* m;      // [nq]
  float* l;      // [nq]
  float* acc_o;  // [nq][Dvp] original channel order
  float* acc_p;  // [nq][Dvp] values' permuted order
};

void AttendRange(const AttendParams& p, std::int64_t b, std::int64_t h, std::int64_t t_begin, std::int64_t t_end,
                 const Partial& out) {
  const DF d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t G = p.num_q_heads / p.num_kv_heads, nq = G * p.sq;
  const std::int64_t D = p.head_dim, Dv = p.v_head_dim, Dp = RoundUp(D, L), Dvp = RoundUp(Dv, L);
  auto q_o = hwy::AllocateAligned<float>(static_cast<std::size_t>(nq * Dp));
  auto q_p = hwy::AllocateAligned<float>(static_cast<std::size_t>(nq * Dp));
  auto krows = hwy::AllocateAligned<float>(static_cast<std::size_t>(kBlock * Dp));
  auto vrows = hwy::AllocateAligned<float>(static_cast<std::size_t>(kBlock * Dvp));
  auto s = hwy::AllocateAligned<float>(static_cast<std::size_t>(kBlock));
  std::fill(q_o.get(), q_o.get() + nq * Dp, 0.0f);
  std::fill(q_p.get(), q_p.get() + nq * Dp, 0.0f);
  std::fill(krows.get(), krows.get() + kBlock * Dp, 0.0f);
  std::fill(vrows.get(), vrows.get() + kBlock * Dvp, 0.0f);
  const std::int32_t* kperm = (p.st && !p.st->k.perm.empty()) ? p.st->k.perm.data() + h * D : nullptr;
  for (std::int64_t qi = 0; qi < nq; ++qi) {
    const std::int64_t hq = h * G + qi / p.sq, i = qi % p.sq;
    float* qo = q_o.get() + qi * Dp;
    for (std::int64_t dd = 0; dd < D; ++dd) qo[dd] = p.q.at(b, hq, i, dd) * p.scale;
    float* qp = q_p.get() + qi * Dp;
    for (std::int64_t j = 0; j < D; ++j) qp[j] = kperm ? qo[kperm[j]] : qo[j];
    out.m[qi] = -INFINITY;
    out.l[qi] = 0.0f;
    std::fill(out.acc_o + qi * Dvp, out.acc_o + (qi + 1) * Dvp, 0.0f);
    std::fill(out.acc_p + qi * Dvp, out.acc_p + (qi + 1) * Dvp, 0.0f);
  }
  for (std::int64_t t = t_begin; t < t_end;) {
    const std::int64_t n = std::min({kBlock, SegmentEnd(p, t) - t, t_end - t});
    const bool kp = DecodeBlock(p, 0, b, h, t, n, krows.get(), Dp);
    const bool vp = DecodeBlock(p, 1, b, h, t, n, vrows.get(), Dvp);
    for (std::int64_t qi = 0; qi < nq; ++qi) {
      const std::int64_t i = qi % p.sq;
      const std::int64_t vis = std::min(n, p.kv_len - p.sq + i + 1 - t);  // causal
      if (vis <= 0) continue;
      const float* qv = (kp ? q_p.get() : q_o.get()) + qi * Dp;
      float m_blk = -INFINITY;
      for (std::int64_t tt = 0; tt < vis; ++tt) {
        s[tt] = Dot(qv, krows.get() + tt * Dp, Dp);
        m_blk = std::max(m_blk, s[tt]);
      }
      const float m_new = std::max(out.m[qi], m_blk);
      const float corr = std::exp(out.m[qi] - m_new);
      const VF vm = hn::Set(d, m_new);
      float sum = 0.0f;
      std::int64_t tt = 0;
      for (; tt + L <= vis; tt += L) {
        const VF e = hn::Exp(d, hn::Sub(hn::Load(d, s.get() + tt), vm));
        hn::Store(e, d, s.get() + tt);
        sum += hn::GetLane(hn::SumOfLanes(d, e));
      }
      for (; tt < vis; ++tt) {
        s[tt] = std::exp(s[tt] - m_new);
        sum += s[tt];
      }
      out.l[qi] = out.l[qi] * corr + sum;
      float* ao = out.acc_o + qi * Dvp;
      float* ap = out.acc_p + qi * Dvp;
      if (corr != 1.0f) {
        const VF vc = hn::Set(d, corr);
        for (std::int64_t j = 0; j < Dvp; j += L) {
          hn::Store(hn::Mul(hn::Load(d, ao + j), vc), d, ao + j);
          hn::Store(hn::Mul(hn::Load(d, ap + j), vc), d, ap + j);
        }
      }
      float* acc = vp ? ap : ao;
      for (std::int64_t j = 0; j < Dvp; j += L) {
        VF a = hn::Load(d, acc + j);
        for (std::int64_t u = 0; u < vis; ++u) a = hn::MulAdd(hn::Set(d, s[u]), hn::Load(d, vrows.get() + u * Dvp + j), a);
        hn::Store(a, d, acc + j);
      }
      out.m[qi] = m_new;
    }
    t += n;
  }
}

void AttendSimd(const AttendParams& p) {
  const DF d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t G = p.num_q_heads / p.num_kv_heads, nq = G * p.sq;
  const std::int64_t Dv = p.v_head_dim, Dvp = RoundUp(Dv, L);
  const std::int64_t heads = p.batch * p.num_kv_heads;
  const int threads = std::max(1, p.num_threads);
  // Enough splits of the sequence for every thread to have work, none shorter than 4 blocks.
  std::int64_t splits = std::max<std::int64_t>(1, (2 * threads + heads - 1) / heads);
  splits = std::min(splits, std::max<std::int64_t>(1, p.kv_len / (4 * kBlock)));
  const std::int64_t span = RoundUp((p.kv_len + splits - 1) / splits, kBlock);
  splits = (p.kv_len + span - 1) / span;
  const std::int64_t tasks = heads * splits;
  // Per task: m and l, padded so that the accumulators stay vector-aligned.
  const std::int64_t acc_off = RoundUp(2 * nq, L), per_task = acc_off + 2 * nq * Dvp;
  auto buf = hwy::AllocateAligned<float>(static_cast<std::size_t>(tasks * per_task));
  auto partial = [&](std::int64_t task) {
    float* base = buf.get() + task * per_task;
    return Partial{base, base + nq, base + acc_off, base + acc_off + nq * Dvp};
  };
  detail::ThreadPool::global().parallel_for(tasks, threads, [&](std::int64_t task) {
    const std::int64_t head = task / splits, sp = task % splits;
    const std::int64_t t0 = sp * span, t1 = std::min(p.kv_len, t0 + span);
    AttendRange(p, head / p.num_kv_heads, head % p.num_kv_heads, t0, t1, partial(task));
  });
  std::vector<float> row(static_cast<std::size_t>(Dv));
  for (std::int64_t head = 0; head < heads; ++head) {
    const std::int64_t b = head / p.num_kv_heads, h = head % p.num_kv_heads;
    const std::int32_t* vperm = (p.st && !p.st->v.perm.empty()) ? p.st->v.perm.data() + h * Dv : nullptr;
    for (std::int64_t qi = 0; qi < nq; ++qi) {
      float M = -INFINITY;
      for (std::int64_t sp = 0; sp < splits; ++sp) M = std::max(M, partial(head * splits + sp).m[qi]);
      float Lsum = 0.0f;
      std::fill(row.begin(), row.end(), 0.0f);
      for (std::int64_t sp = 0; sp < splits; ++sp) {
        const Partial pt = partial(head * splits + sp);
        if (pt.m[qi] == -INFINITY) continue;
        const float w = std::exp(pt.m[qi] - M);
        Lsum += pt.l[qi] * w;
        for (std::int64_t j = 0; j < Dv; ++j) {
          row[static_cast<std::size_t>(j)] += w * pt.acc_o[qi * Dvp + j];
          row[static_cast<std::size_t>(vperm ? vperm[j] : j)] += w * pt.acc_p[qi * Dvp + j];
        }
      }
      const std::int64_t hq = h * G + qi / p.sq, i = qi % p.sq;
      for (std::int64_t j = 0; j < Dv; ++j) p.out.set(b, hq, i, j, row[static_cast<std::size_t>(j)] / Lsum);
    }
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
