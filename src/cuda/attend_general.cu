// Attention over the device cache for the shapes the tuned kernels of
// attend.cu do not take: head dims other than 128 (any multiple of 16 up to
// 256, keys and values each their own), and pairs of code widths outside
// their six. One kernel takes every token of a split (exact sinks, packed
// body, exact tail) and a combine kernel merges the splits, as attend.cu's
// general path does, with every size a run-time value.
//
// A block (128 threads) owns one (batch, kv head, token split) and up to NQ
// query rows of that kv head. Its threads form groups of a power of two of
// lanes, lane l holding channels [8 l, 8 l + 8) of a row in the side's
// permuted order (lanes past the row hold zeros); a group takes 2 or 4
// tokens at a time, every load of them issued before any is used. Eight
// channels divide every metadata group (groups are multiples of 16 channels,
// or the whole row), so a lane's channels share one lo and one scale, and its
// codes are one naturally aligned load of 8 * bits bits at 1, 2, 4 and 8 bits
// (template widths); at 3, 5, 6 and 7 bits (width 0: the side's own, read at
// run time) `bits` bytes loaded one by one (correct, not tuned).
//
// Numerics as in attend.cu's float32 paths (docs/numerics.md): scores and
// weights in float32, log2 units, ex2.approx; a packed channel is
// lot + sct * f with f = 1 + code / 2^bits taken from the code's bits, so
// that a score needs one multiply-add a channel and query row, and a value
// one more.
#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/device_state.cuh"
#include "cuda/kernels.cuh"
#include "cuda/partials.cuh"

namespace skvq::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kC = 8;  // channels a lane

// Tokens a group takes at once (their loads in flight together): fewer where more query rows hold
// registers.
template <int NQ>
constexpr int tokens_at_once() {
  return NQ >= 4 ? 2 : 4;
}

// 1 + code_c / 2^BITS: the code moved into the top of a float's mantissa.
template <int BITS>
__device__ __forceinline__ float frac(const uint4& raw, int c) {  // raw.x, raw.y: the codes (code c at bit c BITS)
  constexpr int kTop = 23 - BITS;
  const int bit = c * BITS, pos = bit % 32;
  const unsigned word = bit < 32 ? raw.x : raw.y;
  const unsigned moved = pos >= kTop ? word >> (pos - kTop) : word << (kTop - pos);
  return __uint_as_float((moved & (((1u << BITS) - 1u) << kTop)) | 0x3F800000u);
}

// The same at a run-time width (1 to 8 bits): code c from the lane's 64 bits (raw.x low, raw.y high),
// where codes may straddle the two words.
__device__ __forceinline__ float frac_at(const uint4& raw, int c, int bits) {
  const unsigned long long w = raw.x | (static_cast<unsigned long long>(raw.y) << 32);
  const unsigned code = static_cast<unsigned>(w >> (c * bits)) & ((1u << bits) - 1u);
  return __uint_as_float((code << (23 - bits)) | 0x3F800000u);
}

// A metadata value's bits as stored (META: 0 fp16, 1 fp32, 2 e4m3); meta_value (common.cuh) makes
// them a float. (The type is a template argument: as a run-time value the compiler predicated all
// three conversions, e4m3's included, for every value: twice the instructions a token.)
template <int META>
__device__ __forceinline__ unsigned load_meta_bits(const unsigned char* at) {
  if constexpr (META == 1) return __ldg(reinterpret_cast<const unsigned*>(at));
  else if constexpr (META == 0) return __ldg(reinterpret_cast<const unsigned short*>(at));
  else return __ldg(at);
}

// A packed row's channel c is lot + sct * f_c with sct = scale * 2^BITS and lot = lo - sct (the
// form of attend.cu's float paths, which docs/numerics.md bounds).
// raw: a lane's packed row as PackedLane::load gives it; f: its channels' f_c; bits: the width
// (BITS, or the run-time one where BITS is 0).
template <int BITS, int META>
__device__ __forceinline__ void packed_terms(const uint4& raw, float (&f)[kC], float& lot, float& sct, int bits) {
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    if constexpr (BITS == 0) f[c] = frac_at(raw, c, bits);
    else f[c] = frac<BITS>(raw, c);
  }
  sct = meta_value<META>(raw.w) * static_cast<float>(1 << (BITS == 0 ? bits : BITS));
  lot = meta_value<META>(raw.z) - sct;
}

// Lane `lane`'s kC channels (the side's permuted order) of an exact fp16 row, stored in the
// original order (read through `perm` when given). Lanes past the row's D channels get zeros.
__device__ __forceinline__ uint4 load_exact_lane(const __half* row, const int* perm, int D, int lane) {
  const int j0 = lane * kC;
  if (j0 >= D) return make_uint4(0u, 0u, 0u, 0u);
  if (perm == nullptr) return __ldg(reinterpret_cast<const uint4*>(row + j0));  // (rows of 16 x 2 bytes: 16-byte aligned)
  unsigned w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const unsigned short a = __half_as_ushort(row[perm[j0 + 2 * e]]), b = __half_as_ushort(row[perm[j0 + 2 * e + 1]]);
    w[e] = a | (static_cast<unsigned>(b) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// One side's packed rows as lane `lane` of (b, h) reads them: where its codes and its group's
// metadata start in window slot 0 (row 0), and the strides of slots and rows (worked out once, so
// that a token's addresses cost two multiply-adds). live: the lane holds channels of this side.
// BITS 0: the side's width, read at run time (s.bits).
template <int BITS>
struct PackedLane {
  const unsigned char *codes, *lo, *scale;
  std::int64_t slot_codes, slot_meta;
  int row_bytes, row_meta, bits;
  bool live;
  __device__ __forceinline__ PackedLane(const AttnParams& p, const DevSide& s, int D, int group, std::int64_t bh, int lane) {
    const int j0 = lane * kC;
    bits = BITS == 0 ? s.bits : BITS;
    live = s.codes != nullptr && j0 < D;  // (no packed rows: dense input)
    row_bytes = static_cast<int>(s.row_bytes);
    row_meta = s.G * p.meta_bytes;
    slot_codes = s.slot_codes, slot_meta = s.slot_meta;
    codes = lo = scale = nullptr;
    if (!live) return;
    codes = s.codes + bh * p.window * s.row_bytes + j0 * bits / 8;  // (naturally aligned at 1, 2, 4 and 8 bits)
    const std::int64_t m0 = (bh * p.window * s.G + j0 / group) * p.meta_bytes;
    lo = s.lo + m0, scale = s.scale + m0;
  }
  // The codes (x, y) and the metadata's bits (z: lo, w: scale) of row `row` of slot `slot`; zeros
  // where the lane is past the row (channels 0).
  template <int META>
  __device__ __forceinline__ uint4 load(std::int64_t slot, int row) const {
    uint4 r = make_uint4(0u, 0u, 0u, 0u);
    if (!live) return r;
    const unsigned char* c = codes + slot * slot_codes + row * row_bytes;
    if constexpr (BITS == 0) {
      unsigned long long w = 0;  // `bits` bytes (kC codes of `bits` bits)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (i < bits) w |= static_cast<unsigned long long>(__ldg(c + i)) << (8 * i);
      r.x = static_cast<unsigned>(w), r.y = static_cast<unsigned>(w >> 32);
    } else if constexpr (BITS == 8) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(c));
      r.x = v.x, r.y = v.y;
    } else if constexpr (BITS == 4) {
      r.x = __ldg(reinterpret_cast<const unsigned*>(c));
    } else if constexpr (BITS == 2) {
      r.x = __ldg(reinterpret_cast<const unsigned short*>(c));
    } else {
      r.x = __ldg(c);
    }
    const std::int64_t mo = slot * slot_meta + row * row_meta;
    r.z = load_meta_bits<META>(lo + mo);
    r.w = load_meta_bits<META>(scale + mo);
    return r;
  }
};

// The lane's kC channels of an exact row.
__device__ __forceinline__ void exact_channels(const uint4& raw, float (&x)[kC]) {
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[e]));
    x[2 * e] = f.x, x[2 * e + 1] = f.y;
  }
}

// The sum of v over the `tpt` lanes of a group (every lane of the warp takes part; the butterfly's
// sums commute, so every lane of a group gets the same bits).
__device__ __forceinline__ float lanes_sum(float v, int tpt) {
#pragma unroll
  for (int x = 16; x > 0; x >>= 1) {  // (unrolled: as a loop over tpt its counting cost as much as the shuffles)
    const float o = __shfl_xor_sync(0xffffffffu, v, x);
    if (x < tpt) v += o;
  }
  return v;
}

// One group's view of up to NQ query rows: q in the keys' permuted order (log2 units) and its sum
// over the lane's channels, the online softmax (max, sum), and the value accumulators: sum(w sct f)
// a channel and sum(w lot) (lacc) for packed rows, sum(w x) for exact ones (into acc).
template <int NQ>
struct RowsState {
  float q[NQ][kC], qs[NQ], m[NQ], l[NQ], acc[NQ][kC], lacc[NQ];
  int last[NQ];  // Sq - 1 - i: row n sees token t when t + last[n] < kv_len (causal); -1: no row
};

// The tokens [t0, t1) of the block (t0, t1 the same for all its threads), all of one kind: packed
// rows of the body (PACKED), or exact ones (the sinks, the tail, or dense input). A group takes U
// tokens at a time, every load of them first. (Kept apart so that neither kind's code runs
// predicated off for the other's tokens: with the kind a token's run-time value, both ran.)
template <int KB, int VB, int META, int NQ, bool PACKED, bool DENSE>
__device__ __forceinline__ void take_tokens(const AttnParams& p, RowsState<NQ>& st, const int* kperm, const int* vperm,
                                            std::int64_t bh, std::int64_t t0, std::int64_t t1, int lane, int grp, int n_groups,
                                            int tpt) {
  constexpr int U = tokens_at_once<NQ>();
  // (outside the loop: inside, the compiler left a division a token and side in it)
  const PackedLane<KB> kl(p, p.k, p.D, p.group, bh, lane);
  const PackedLane<VB> vl(p, p.v, p.Dv, p.group_v, bh, lane);
  std::int64_t lim[NQ];  // row n sees the tokens below lim[n] (causal, and the run's end)
#pragma unroll
  for (int n = 0; n < NQ; ++n) lim[n] = st.last[n] >= 0 ? min(t1, p.kv_len - st.last[n]) : t0;
  for (std::int64_t base = t0; base < t1; base += static_cast<std::int64_t>(n_groups) * U) {
    uint4 kr[U], vr[U];
    std::int64_t t[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      t[u] = base + u * n_groups + grp;
      const std::int64_t tt = t[u] < t1 ? t[u] : t0;
      if constexpr (PACKED) {
        const std::int64_t slot = static_cast<std::int64_t>((static_cast<unsigned long long>(tt) * p.div_magic) >> p.div_shift);
        const int row = static_cast<int>(tt - slot * p.window);
        kr[u] = kl.template load<META>(slot, row);
        vr[u] = vl.template load<META>(slot, row);
      } else if constexpr (DENSE) {
        const std::int64_t row = bh * p.kv_len + tt;
        kr[u] = load_exact_lane(p.dense_k + row * p.D, nullptr, p.D, lane);
        vr[u] = load_exact_lane(p.dense_v + row * p.Dv, nullptr, p.Dv, lane);
      } else {
        const bool sink = tt < p.sinks;
        const std::int64_t row = sink ? bh * p.sinks + tt : bh * p.window + (tt - p.q_end);
        kr[u] = load_exact_lane((sink ? p.k.sinks : p.k.tail) + row * p.D, kperm, p.D, lane);
        vr[u] = load_exact_lane((sink ? p.v.sinks : p.v.tail) + row * p.Dv, vperm, p.Dv, lane);
      }
    }
    float s[U][NQ];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float part[NQ];
      if constexpr (PACKED) {
        float f[kC], lot, sct;
        packed_terms<KB, META>(kr[u], f, lot, sct, kl.bits);
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          float d = 0.0f;
#pragma unroll
          for (int c = 0; c < kC; ++c) d = fmaf(st.q[n][c], f[c], d);
          part[n] = fmaf(sct, d, lot * st.qs[n]);
        }
      } else {
        float x[kC];
        exact_channels(kr[u], x);
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          float d = 0.0f;
#pragma unroll
          for (int c = 0; c < kC; ++c) d = fmaf(st.q[n][c], x[c], d);
          part[n] = d;
        }
      }
#pragma unroll
      for (int n = 0; n < NQ; ++n) {
        const float v = lanes_sum(part[n], tpt);
        s[u][n] = t[u] < lim[n] ? v : -INFINITY;
      }
    }
    // the online softmax over the U tokens, row by row
    float pw[U][NQ];
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      float mt = s[0][n];
#pragma unroll
      for (int u = 1; u < U; ++u) mt = fmaxf(mt, s[u][n]);
      const float mnew = fmaxf(st.m[n], mt);
      if (mnew == -INFINITY) {
#pragma unroll
        for (int u = 0; u < U; ++u) pw[u][n] = 0.0f;
        continue;
      }
      const float corr = fast_exp2(st.m[n] - mnew);
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        pw[u][n] = fast_exp2(s[u][n] - mnew);
        sum += pw[u][n];
      }
      st.l[n] = fmaf(st.l[n], corr, sum);
      if (corr != 1.0f) {
#pragma unroll
        for (int c = 0; c < kC; ++c) st.acc[n][c] *= corr;
        st.lacc[n] *= corr;
      }
      st.m[n] = mnew;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if constexpr (PACKED) {
        float f[kC], lot, sct;
        packed_terms<VB, META>(vr[u], f, lot, sct, vl.bits);
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          const float ws = pw[u][n] * sct;
          st.lacc[n] = fmaf(pw[u][n], lot, st.lacc[n]);
#pragma unroll
          for (int c = 0; c < kC; ++c) st.acc[n][c] = fmaf(ws, f[c], st.acc[n][c]);
        }
      } else {
        float y[kC];
        exact_channels(vr[u], y);
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
#pragma unroll
          for (int c = 0; c < kC; ++c) st.acc[n][c] = fmaf(pw[u][n], y[c], st.acc[n][c]);
        }
      }
    }
  }
}

// A block: one (split, kv head, batch) and up to NQ query rows; groups of 2^tpt_log2 lanes
// (kC 2^tpt_log2 >= max(D, Dv)). The split's tokens in at most three runs of one kind each: sinks,
// packed body, tail (dense input: one exact run). With exact_base >= 0 the exact tokens alone
// (the packed body goes through the tensor-core kernel, attend_tc.cu): block s takes tail tokens
// [q_end + s exact_len, ..), block 0 the sinks too, into split exact_base + s.
template <int KB, int VB, int META, int NQ, bool DENSE>
__global__ void __launch_bounds__(kThreads) general_kernel(const AttnParams p, int row0, int tpt_log2, int exact_base) {
  extern __shared__ float sm[];  // maxima [groups][NQ], sums [groups][NQ], accumulators [groups][NQ][Dv]
  const int tpt = 1 << tpt_log2, n_groups = kThreads >> tpt_log2;
  // blockIdx.z: the batch entry, then the block's group of NQ query rows after row0 (one launch
  // takes every whole group of four: launch_general_rows)
  const int split = blockIdx.x, h = blockIdx.y, b = static_cast<int>(blockIdx.z % static_cast<unsigned>(p.B));
  row0 += static_cast<int>(blockIdx.z / static_cast<unsigned>(p.B)) * NQ;
  const int lane = threadIdx.x & (tpt - 1), grp = threadIdx.x >> tpt_log2;
  const int D = p.D, Dv = p.Dv, G = p.Hq / p.Hkv, n_rows = p.query_rows();
  const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hkv + h;
  const int* kperm = (!DENSE && p.k.perm) ? p.k.perm + h * D : nullptr;
  const int* vperm = (!DENSE && p.v.perm) ? p.v.perm + h * Dv : nullptr;
  const float qsc = p.scale * 1.4426950408889634f;  // log2 units
  RowsState<NQ> st;
#pragma unroll
  for (int n = 0; n < NQ; ++n) {
    const int row = row0 + n;
    const bool valid = row < n_rows;
    const int gq = valid ? row / p.Sq : 0, i = valid ? row % p.Sq : 0;
    const float* qrow = p.q + ((static_cast<std::int64_t>(b) * p.Hq + h * G + gq) * p.Sq + i) * D;
    st.last[n] = valid ? p.Sq - 1 - i : -1;
    st.qs[n] = 0.0f;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int j = lane * kC + c;
      st.q[n][c] = (valid && j < D) ? qrow[kperm ? kperm[j] : j] * qsc : 0.0f;
      st.qs[n] += st.q[n][c];
      st.acc[n][c] = 0.0f;
    }
    st.m[n] = -INFINITY, st.l[n] = 0.0f, st.lacc[n] = 0.0f;
  }
  const std::int64_t t_begin = static_cast<std::int64_t>(split) * p.split_len;
  const std::int64_t t_end = min(p.kv_len, t_begin + p.split_len);
  if (exact_base >= 0) {
    const std::int64_t x0 = p.q_end + static_cast<std::int64_t>(split) * p.exact_len;
    if (split == 0) take_tokens<KB, VB, META, NQ, false, false>(p, st, kperm, vperm, bh, 0, p.sinks, lane, grp, n_groups, tpt);
    take_tokens<KB, VB, META, NQ, false, false>(p, st, kperm, vperm, bh, x0, min(p.kv_len, x0 + p.exact_len), lane, grp, n_groups, tpt);
  } else if constexpr (DENSE) {
    take_tokens<KB, VB, META, NQ, false, true>(p, st, kperm, vperm, bh, t_begin, t_end, lane, grp, n_groups, tpt);
  } else {
    const std::int64_t body0 = max(t_begin, p.sinks), body1 = min(t_end, p.q_end);
    take_tokens<KB, VB, META, NQ, false, false>(p, st, kperm, vperm, bh, t_begin, min(t_end, p.sinks), lane, grp, n_groups, tpt);
    take_tokens<KB, VB, META, NQ, true, false>(p, st, kperm, vperm, bh, body0, body1, lane, grp, n_groups, tpt);
    take_tokens<KB, VB, META, NQ, false, false>(p, st, kperm, vperm, bh, max(t_begin, p.q_end), t_end, lane, grp, n_groups, tpt);
  }
  // the block's groups merged in shared memory: one partial per row and split
  float* sm_m = sm;
  float* sm_l = sm + n_groups * NQ;
  float* sm_acc = sm + 2 * n_groups * NQ;
#pragma unroll
  for (int n = 0; n < NQ; ++n) {
    if (lane == 0) sm_m[grp * NQ + n] = st.m[n], sm_l[grp * NQ + n] = st.l[n];
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int j = lane * kC + c;
      if (j < Dv) sm_acc[(grp * NQ + n) * Dv + j] = st.acc[n][c] + st.lacc[n];
    }
  }
  __syncthreads();
  store_merged(p, b, h, row0, exact_base >= 0 ? exact_base + split : split, n_groups, NQ, sm_m, sm_l, sm_acc, Dv);
}

// One block per query row, a thread per value channel: the splits merged, the value permutation undone.
__global__ void __launch_bounds__(256) general_combine_kernel(const AttnParams p, const int* vperm_all, void* out) {
  const std::int64_t qrow = blockIdx.x;  // (b * Hq + hq) * Sq + i
  const int j = threadIdx.x;
  if (j >= p.Dv) return;
  const int h = static_cast<int>((qrow / p.Sq) % p.Hq) / (p.Hq / p.Hkv);
  const float* ms = p.ws_m + qrow * p.splits;
  const float* ls = p.ws_l + qrow * p.splits;
  const float* acc = p.ws_acc + qrow * p.splits * p.Dv + j;
  float M = -INFINITY;
  for (int s = 0; s < p.splits; ++s) M = fmaxf(M, ms[s]);
  float L = 0.0f, A = 0.0f;
  for (int s = 0; s < p.splits; ++s) {
    if (ms[s] == -INFINITY) continue;
    const float w = fast_exp2(ms[s] - M);
    L = fmaf(ls[s], w, L);
    A = fmaf(acc[static_cast<std::int64_t>(s) * p.Dv], w, A);
  }
  const int dst = vperm_all ? vperm_all[h * p.Dv + j] : j;
  store_out(p, out, qrow * p.Dv + dst, A / L);
}

// exact_base >= 0: the exact tokens alone, in splits [exact_base, p.splits) (general_kernel).
template <int KB, int VB, int META, bool DENSE>
void launch_general_rows(const AttnParams& p, cudaStream_t stream, int exact_base = -1) {
  const dim3 grid(exact_base >= 0 ? p.splits - exact_base : p.splits, p.Hkv, p.B);
  const int n_rows = p.query_rows();
  int tpt_log2 = 0;  // lanes a token: a power of two with kC of them covering both rows
  while ((kC << tpt_log2) < std::max(p.D, p.Dv)) ++tpt_log2;
  auto launch = [&](auto kernel, int nq, int row, int groups) {
    const int smem = (kThreads >> tpt_log2) * nq * (2 + p.Dv) * static_cast<int>(sizeof(float));
    allow_smem(kernel, smem);
    kernel<<<dim3(grid.x, grid.y, grid.z * static_cast<unsigned>(groups)), kThreads, smem, stream>>>(p, row, tpt_log2, exact_base);
    SKVQ_CUDA_LAUNCH_CHECK();
  };
  // the whole groups of four rows side by side, row_groups_a_launch(B) of them a launch; then the
  // two or one left
  const int fours = n_rows / 4;
  for_row_group_launches(fours, 4, p.B, [&](int row, int ng) { launch(general_kernel<KB, VB, META, 4, DENSE>, 4, row, ng); });
  for (int row = 4 * fours; row < n_rows;) {
    const int nq = n_rows - row >= 2 ? 2 : 1;
    if (nq == 2) launch(general_kernel<KB, VB, META, 2, DENSE>, 2, row, 1);
    else launch(general_kernel<KB, VB, META, 1, DENSE>, 1, row, 1);
    row += nq;
  }
}

// Calls f with the code widths (key, value) as integral constants (1, 2, 4 or 8 each), or with 0
// for both (the kernel reads each side's width at run time) where either is 3, 5, 6 or 7.
template <typename F>
void with_widths(int kb, int vb, F&& f) {
  const auto tuned = [](int b) { return b == 1 || b == 2 || b == 4 || b == 8; };
  if ((!tuned(kb) || !tuned(vb)) && kb >= 1 && kb <= 8 && vb >= 1 && vb <= 8) {
    f(std::integral_constant<int, 0>{}, std::integral_constant<int, 0>{});
    return;
  }
  auto by_v = [&](auto k) {
    switch (vb) {
      case 1: f(k, std::integral_constant<int, 1>{}); break;
      case 2: f(k, std::integral_constant<int, 2>{}); break;
      case 4: f(k, std::integral_constant<int, 4>{}); break;
      case 8: f(k, std::integral_constant<int, 8>{}); break;
      default: throw Error("skvq: cuda attend: bits_value=" + std::to_string(vb) + " (1 to 8)");
    }
  };
  switch (kb) {
    case 1: by_v(std::integral_constant<int, 1>{}); break;
    case 2: by_v(std::integral_constant<int, 2>{}); break;
    case 4: by_v(std::integral_constant<int, 4>{}); break;
    case 8: by_v(std::integral_constant<int, 8>{}); break;
    default: throw Error("skvq: cuda attend: bits_key=" + std::to_string(kb) + " (1 to 8)");
  }
}

}  // namespace

bool head_dim_supported(std::int64_t d) { return d >= 16 && d <= kGeneralMaxHeadDim && d % 16 == 0; }
bool general_shape_supported(std::int64_t D, std::int64_t Dv) { return head_dim_supported(D) && head_dim_supported(Dv); }

void launch_general(const AttnParams& p, bool dense, void* out, cudaStream_t stream) {
  if (!general_shape_supported(p.D, p.Dv)) {
    throw Error("skvq: cuda attend: head dims D=" + std::to_string(p.D) + ", Dv=" + std::to_string(p.Dv) +
                " must be multiples of 16 in [16, " + std::to_string(kGeneralMaxHeadDim) + "]");
  }
  if (dense) {
    launch_general_rows<8, 8, 0, true>(p, stream);  // (the widths and the metadata type unused)
  } else {
    // with the tensor-core kernel (plan_tc set body_splits) the float kernel takes the exact tokens
    const int exact_base = p.body_splits > 0 ? p.body_splits : -1;
    if (exact_base >= 0) launch_tc(p, stream);
    with_widths(p.k.bits, p.v.bits, [&](auto k, auto v) {
      constexpr int K = decltype(k)::value, V = decltype(v)::value;
      if (p.meta == 0) launch_general_rows<K, V, 0, false>(p, stream, exact_base);
      else if (p.meta == 1) launch_general_rows<K, V, 1, false>(p, stream, exact_base);
      else launch_general_rows<K, V, 2, false>(p, stream, exact_base);
    });
  }
  const int threads = (p.Dv + 31) / 32 * 32;
  const std::int64_t rows = static_cast<std::int64_t>(p.B) * p.Hq * p.Sq;
  general_combine_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(p, dense ? nullptr : p.v.perm, out);
  SKVQ_CUDA_LAUNCH_CHECK();
}

}  // namespace skvq::cuda
