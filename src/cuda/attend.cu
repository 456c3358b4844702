// Fused split-K attention over the device cache: [exact sinks | packed body |
// exact tail], grouped-query attention, causal prefill, and a combine step.
// The packed body goes through a pipelined kernel (128-token tiles in a
// cp.async ring): attn_rs_kernel / attn_fast_kernel (dp4a, below) for one or
// two query rows per KV head, attn_tmma_kernel (int8 tensor cores, tokens as
// MMA rows) for three or four, attn_imma_kernel (int8 tensor cores, query
// rows as MMA rows) for more, the chunk kernel (attend_chunk.cu: 64 rows a
// block over tiles unpacked once a block) from 64; the exact sinks and tail in the combine
// kernel, which starts beside the pipelined one (programmatic dependent
// launch) and merges everything. Caches whose window is not a multiple of
// 64 (and the dense fp16 path) go through the general kernel, attn_kernel.
// Head dims other than 128, and pairs of code widths outside with_bits' six,
// go through the general-shape path of attend_general.cu.
//
// A block (128 threads) owns one (batch, kv head, token split) and up to NQ
// query rows of that kv head. Its threads form 16 groups of 8 lanes; a group
// takes one token at a time, lane l holding channels [16 l, 16 l + 16) of the
// row in the side's permuted order: 16 codes = 2 * bits bytes, one load. Each
// group keeps its own online softmax (max, sum, accumulators); the block
// merges its 16 groups in shared memory and writes one partial per split,
// and the combine kernel merges the splits and undoes the value permutation.
// (attn_tmma_kernel's blocks with 8 tiles or more take their own split's
// first chunk, then claim chunks of the head's tiles while they run:
// ClaimedTiles. A partial then covers whatever tiles its block took.)
#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/split_rule.hpp"
#include "cuda/device_state.cuh"
#include "cuda/kernels.cuh"
#include "cuda/partials.cuh"
#include "cuda/pipeline.cuh"
#include "cuda/trace.hpp"
#include "cuda/widen.hpp"

namespace skvq::cuda {

namespace {

constexpr int kGroups = kThreads / kLanes;  // 16 tokens in flight per block
constexpr int kTile = 4;                    // tokens per group per step (2 when NQ = 4: registers)

template <int BITS>
struct LaneCodes {
  static constexpr int kBytes = kCPL * BITS / 8;
  static constexpr int kWords = (kBytes + 3) / 4;
  unsigned w[kWords];
  __device__ __forceinline__ void load(const unsigned char* p) {
    if constexpr (kBytes == 16) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (kBytes == 8) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
      w[0] = v.x, w[1] = v.y;
    } else if constexpr (kBytes == 4) {
      w[0] = __ldg(reinterpret_cast<const unsigned*>(p));
    } else {
      w[0] = __ldg(reinterpret_cast<const unsigned short*>(p));
    }
  }
  __device__ __forceinline__ void load_shared(const unsigned char* p) {
    if constexpr (kBytes == 16) {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (kBytes == 8) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      w[0] = v.x, w[1] = v.y;
    } else if constexpr (kBytes == 4) {
      w[0] = *reinterpret_cast<const unsigned*>(p);
    } else {
      w[0] = *reinterpret_cast<const unsigned short*>(p);
    }
  }
  // 1 + code_i / 2^BITS: the code moved into the top of a float's mantissa
  // (one shift and one LOP3). Sums of these are decoded as
  // sum(q c) = (sum(q f) - sum(q)) * 2^BITS.
  // `one` must hold 0x3F800000 in a register the compiler cannot see through:
  // with both constants as immediates ptxas splits the and-or into two LOP3s
  // (one immediate per LOP3), a third integer operation per code.
  __device__ __forceinline__ float frac(int i, unsigned one) const {
    constexpr int kTop = 23 - BITS;
    const int bit = i * BITS, pos = bit % 32;
    const unsigned word = w[bit / 32];
    const unsigned moved = pos >= kTop ? word >> (pos - kTop) : word << (kTop - pos);
    return __uint_as_float((moved & (((1u << BITS) - 1u) << kTop)) | one);
  }
};

// 2^-k, exact (0 <= k < 127): the place value of a code slice k bits up.
__device__ __forceinline__ float pow2_neg(int k) { return pow2(-k); }

// ---- per-block timestamps (cuda/trace.hpp; empty unless SKVQ_CUDA_TRACE) ----
#ifdef SKVQ_CUDA_TRACE
__device__ trace::Record g_trace[trace::kCapacity];  // body block l at l, combine block l at kCapacity / 2 + l
#endif
__device__ __forceinline__ std::uint64_t trace_now() {
#ifdef SKVQ_CUDA_TRACE
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return 0;
#endif
}
#ifdef SKVQ_CUDA_TRACE
constexpr bool kTrace = true;
#else
constexpr bool kTrace = false;
#endif
__device__ __forceinline__ void trace_block([[maybe_unused]] std::uint32_t kind, [[maybe_unused]] std::uint64_t t0,
                                           [[maybe_unused]] std::uint64_t t1, [[maybe_unused]] std::uint64_t tq = 0,
                                           [[maybe_unused]] std::uint64_t tf = 0, [[maybe_unused]] unsigned tiles = 0) {
#ifdef SKVQ_CUDA_TRACE
  if (threadIdx.x != 0) return;
  // a slot per block, no shared counter: an atomic on one counter, taken by hundreds of blocks
  // ending together, had put its round trip into every block's end and into the body's
  // completion (sessions 26-31)
  const std::uint64_t t2 = trace_now();
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned i = (kind == trace::kCombine ? trace::kCapacity / 2 : 0u) + block;
  if (block < trace::kCapacity / 2) g_trace[i] = trace::Record{t0, t1, t2, tq, tf, kind, sm, block, tiles};
#endif
}

// 16 fp16 channels of an exact row, in `perm` order when given.
__device__ __forceinline__ void load_exact(const __half* row, const int* perm, int lane, float* x) {
  if (perm == nullptr) {
    const uint4* p = reinterpret_cast<const uint4*>(row + lane * kCPL);
    const uint4 a = __ldg(p), b = __ldg(p + 1);
    const __half2* ha = reinterpret_cast<const __half2*>(&a);
    const __half2* hb = reinterpret_cast<const __half2*>(&b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 fa = __half22float2(ha[i]), fb = __half22float2(hb[i]);
      x[2 * i] = fa.x, x[2 * i + 1] = fa.y, x[8 + 2 * i] = fb.x, x[8 + 2 * i + 1] = fb.y;
    }
  } else {
#pragma unroll
    for (int c = 0; c < kCPL; ++c) x[c] = __half2float(row[perm[lane * kCPL + c]]);
  }
}

struct Where {
  int kind;  // 0 exact, 1 packed
  const __half* krow;
  const __half* vrow;
  std::int64_t slot, row;
};

template <bool DENSE>
__device__ __forceinline__ Where locate(const AttnParams& p, std::int64_t bh, std::int64_t t) {
  Where w{};
  if constexpr (DENSE) {
    w.kind = 0;
    w.krow = p.dense_k + (bh * p.kv_len + t) * kD;
    w.vrow = p.dense_v + (bh * p.kv_len + t) * kD;
  } else if (t < p.sinks) {
    w.kind = 0;
    w.krow = p.k.sinks + (bh * p.sinks + t) * kD;
    w.vrow = p.v.sinks + (bh * p.sinks + t) * kD;
  } else if (t < p.q_end) {
    w.kind = 1;
    // t / window by a multiply-shift (exact for t < 2^32): no 64-bit division
    w.slot = static_cast<std::int64_t>((static_cast<unsigned long long>(t) * p.div_magic) >> p.div_shift);
    w.row = t - w.slot * p.window;
  } else {
    w.kind = 0;
    w.krow = p.k.tail + (bh * p.window + (t - p.q_end)) * kD;
    w.vrow = p.v.tail + (bh * p.window + (t - p.q_end)) * kD;
  }
  return w;
}

// One 8-lane group's view of up to NQ query rows: the queries (in the keys'
// permuted order, scaled to log2 units), the online softmax (max, sum) and the
// value accumulators. acc holds sum(w f) over the values' frac codes, wsum
// sum(w) and lacc sum(p lo), so the output is (acc - wsum) * 2^VB + lacc;
// exact rows enter acc scaled by 2^-VB.
template <int NQ, int VB>
struct GroupState {
  float q[NQ][kCPL], qs[NQ];
  std::int64_t limit[NQ];  // last visible token of each row (causal)
  float m[NQ], l[NQ], acc[NQ][kCPL], lacc[NQ], wsum[NQ];
  unsigned one;  // 0x3F800000 (see LaneCodes::frac)

  __device__ __forceinline__ void init(const AttnParams& p, int b, int h, int row0, int lane, const int* kperm) {
    const int G = p.Hq / p.Hkv, n_rows = p.query_rows();
    one = 0x3F800000u | static_cast<unsigned>(p.Sq <= 0);  // Sq >= 1: the constant, opaque to ptxas
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      const int row = row0 + n;
      const bool valid = row < n_rows;
      const int gq = valid ? row / p.Sq : 0, i = valid ? row % p.Sq : 0;
      const float* qrow = p.q + ((static_cast<std::int64_t>(b) * p.Hq + h * G + gq) * p.Sq + i) * kD;
      limit[n] = valid ? p.kv_len - p.Sq + i : -1;
#pragma unroll
      for (int c = 0; c < kCPL; ++c) {
        const int j = lane * kCPL + c;
        q[n][c] = valid ? qrow[kperm ? kperm[j] : j] : 0.0f;  // raw: scaled by init_int
      }
      m[n] = -INFINITY, l[n] = 0.0f, lacc[n] = 0.0f, wsum[n] = 0.0f;
#pragma unroll
      for (int c = 0; c < kCPL; ++c) acc[n][c] = 0.0f;
    }
  }
  // Packed keys take q rounded to 16 bits, qi = round(q / qstep) with
  // |qi| <= 127 * 256, split as qi = 256 hi + lo (hi, lo int8) and laid out as
  // 4-byte patterns matching the code bytes (qh, ql: [pattern]; pattern
  // wi * kPerByte + m multiplies byte b of (word wi >> m * KB), code
  // (32 wi + 8 b + m KB) / KB of the lane): sum(q c) from 2 dp4a per 4 codes
  // instead of 3 float operations per code (docs/numerics.md bounds the error).
  int qh[NQ][8], ql[NQ][8];
  float qstep[NQ];
  // init_int first brings q (init only issues its loads, so that a kernel can
  // start its tile copies in between) to log2 units and sums it.
  template <int KB>
  __device__ __forceinline__ void init_int(const AttnParams& p) {
    constexpr int kPerByte = 8 / KB, kWords = LaneCodes<KB>::kWords;
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      qs[n] = 0.0f;
#pragma unroll
      for (int c = 0; c < kCPL; ++c) {
        q[n][c] *= p.scale * 1.4426950408889634f;
        qs[n] += q[n][c];
      }
      float qmax = 0.0f;
#pragma unroll
      for (int c = 0; c < kCPL; ++c) qmax = fmaxf(qmax, fabsf(q[n][c]));
      qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 1));
      qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 2));
      qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 4));
      qstep[n] = q16_step(qmax);
#pragma unroll
      for (int wi = 0; wi < kWords; ++wi)
#pragma unroll
        for (int m = 0; m < kPerByte; ++m) {
          unsigned hp = 0, lp = 0;
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const int c = (32 * wi + 8 * b + m * KB) / KB;
            if (c >= kCPL) continue;
            int hi, lo;
            q16_split(q[n][c], qstep[n], hi, lo);
            hp |= static_cast<unsigned>(hi & 0xFF) << (8 * b);
            lp |= static_cast<unsigned>(lo & 0xFF) << (8 * b);
          }
          qh[n][wi * kPerByte + m] = static_cast<int>(hp);
          ql[n][wi * kPerByte + m] = static_cast<int>(lp);
        }
    }
  }
  // This lane's part of row n's score for a packed key in integer form: sum
  // over its channels of qi c (packed_score below scales it: q (kl + ks c)).
  template <int KB>
  __device__ __forceinline__ int packed_dot(const LaneCodes<KB>& kc, int n) const {
    constexpr int kPerByte = 8 / KB, kWords = LaneCodes<KB>::kWords;
    constexpr unsigned kMask = ((1u << KB) - 1u) * 0x01010101u;
    int ah = 0, al = 0;
#pragma unroll
    for (int wi = 0; wi < kWords; ++wi)
#pragma unroll
      for (int m = 0; m < kPerByte; ++m) {
        const unsigned x = KB == 8 ? kc.w[wi] : (kc.w[wi] >> (m * KB)) & kMask;
        asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(ah) : "r"(x), "r"(qh[n][wi * kPerByte + m]));
        asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(al) : "r"(x), "r"(ql[n][wi * kPerByte + m]));
      }
    return ah * 256 + al;
  }
  template <int KB>
  __device__ __forceinline__ float packed_score(const LaneCodes<KB>& kc, float ks, float kl, int n) const {
    return fmaf(ks * qstep[n], static_cast<float>(packed_dot<KB>(kc, n)), kl * qs[n]);
  }
  __device__ __forceinline__ float exact_score(const float* x, int n) const {
    float d = 0.0f;
#pragma unroll
    for (int c = 0; c < kCPL; ++c) d = fmaf(q[n][c], x[c], d);
    return d;
  }
  // Online softmax over T scores per row (-inf: masked); weights into pw.
  template <int T>
  __device__ __forceinline__ void softmax(const float (&s)[T][NQ], float (&pw)[T][NQ]) {
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      float mt = s[0][n];
#pragma unroll
      for (int u = 1; u < T; ++u) mt = fmaxf(mt, s[u][n]);
      const float mnew = fmaxf(m[n], mt);
      if (mnew == -INFINITY) {
#pragma unroll
        for (int u = 0; u < T; ++u) pw[u][n] = 0.0f;
        continue;
      }
      const float corr = fast_exp2(m[n] - mnew);
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < T; ++u) {
        pw[u][n] = fast_exp2(s[u][n] - mnew);
        sum += pw[u][n];
      }
      l[n] = l[n] * corr + sum;
      if (corr != 1.0f) {
#pragma unroll
        for (int c = 0; c < kCPL; ++c) acc[n][c] *= corr;
        lacc[n] *= corr;
        wsum[n] *= corr;
      }
      m[n] = mnew;
    }
  }
  template <int T>
  __device__ __forceinline__ void add_packed_value(const LaneCodes<VB>& vc, float vs, float vl, const float (&pw)[T][NQ], int u) {
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      const float w = pw[u][n] * vs;
#pragma unroll
      for (int c = 0; c < kCPL; ++c) acc[n][c] = fmaf(w, vc.frac(c, one), acc[n][c]);
      wsum[n] += w;
      lacc[n] = fmaf(pw[u][n], vl, lacc[n]);
    }
  }
  // Values of T packed tokens (T a multiple of 4) by dp4a: per row n the
  // weights u = p * scale are rounded to 16 unsigned bits against their
  // maximum over the T tokens (sw = max u / 65535; docs/numerics.md bounds
  // the error), each 4 tokens' codes are transposed so that one 32-bit word
  // holds one channel slice of the 4 tokens (byte j: token j), and
  // sum(u c) over the 4 tokens is 2 dp4a (high and low weight bytes) per
  // channel instead of 3 float operations per code. The integer sums of a
  // channel are exact and enter acc once per T tokens, in the frac units of
  // add_packed_value (scaled by 2^-VB).
  template <int T>
  __device__ __forceinline__ void add_packed_values(const LaneCodes<VB> (&vc)[T], const float (&vs)[T], const float (&vl)[T],
                                                    const float (&pw)[T][NQ]) {
    static_assert(T % 4 == 0, "tokens in fours");
    constexpr int kQ = T / 4, kW = LaneCodes<VB>::kWords, kPerByte = 8 / VB;
    constexpr unsigned kMask = ((1u << VB) - 1u) * 0x01010101u;
    unsigned x[kQ][kW][4];  // [quad][word][byte b]: byte j = byte b of token 4 quad + j
#pragma unroll
    for (int qd = 0; qd < kQ; ++qd)
#pragma unroll
      for (int w = 0; w < kW; ++w) {
        transpose_bytes4x4(vc[4 * qd].w[w], vc[4 * qd + 1].w[w], vc[4 * qd + 2].w[w], vc[4 * qd + 3].w[w], x[qd][w]);
      }
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      float umax = 0.0f;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        umax = fmaxf(umax, pw[t][n] * vs[t]);
        lacc[n] = fmaf(pw[t][n], vl[t], lacc[n]);
      }
      const W16 w16 = w16_fast(umax);
      const float sw = w16.step;
      unsigned wl[kQ], wh[kQ];  // low and high bytes of the 4 tokens' 16-bit weights
#pragma unroll
      for (int qd = 0; qd < kQ; ++qd) {
        unsigned r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) r[j] = w16.round_low16(pw[4 * qd + j][n] * vs[4 * qd + j]);
        const unsigned r01 = __byte_perm(r[0], r[1], 0x5140), r23 = __byte_perm(r[2], r[3], 0x5140);
        wl[qd] = __byte_perm(r01, r23, 0x5410), wh[qd] = __byte_perm(r01, r23, 0x7632);
      }
#pragma unroll
      for (int c = 0; c < kCPL; ++c) {
        const int bit = c * VB, w = bit / 32, byte = (bit % 32) / 8, m = (bit % 8) / VB;
        unsigned ah = 0, al = 0;
#pragma unroll
        for (int qd = 0; qd < kQ; ++qd) {
          const unsigned xm = kPerByte == 1 ? x[qd][w][byte] : x[qd][w][byte] & (kMask << (m * VB));
          asm("dp4a.u32.u32 %0, %1, %2, %0;" : "+r"(ah) : "r"(xm), "r"(wh[qd]));
          asm("dp4a.u32.u32 %0, %1, %2, %0;" : "+r"(al) : "r"(xm), "r"(wl[qd]));
        }
        // codes sit m * VB bits up in their byte: the sum carries 2^(m VB); frac units carry 2^-VB
        const float unit = sw * pow2_neg(VB + m * VB);
        acc[n][c] = fmaf(unit, __uint2float_rn(ah * 256u + al), acc[n][c]);
      }
    }
  }
  template <int T>
  __device__ __forceinline__ void add_exact_value(const float* x, const float (&pw)[T][NQ], int u) {
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      const float w = pw[u][n] * (1.0f / static_cast<float>(1 << VB));
#pragma unroll
      for (int c = 0; c < kCPL; ++c) acc[n][c] = fmaf(w, x[c], acc[n][c]);
    }
  }
};


__device__ __forceinline__ float group_sum(float v) {  // over the 8 lanes of a group
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}

// Merges the block's 16 groups (each its own max, sum, accumulators) in
// shared memory and writes one partial (max, sum, acc in the values' permuted
// order) per query row to the workspace.
template <int NQ, int VB>
__device__ __forceinline__ void write_partial(const AttnParams& p, int row0, int out_split, int b, int h, int lane, int grp,
                                              const GroupState<NQ, VB>& st) {
  __shared__ float sm_m[kGroups][NQ], sm_l[kGroups][NQ];
  __shared__ float sm_acc[kGroups][NQ][kD];
#pragma unroll
  for (int n = 0; n < NQ; ++n) {
    if (lane == 0) sm_m[grp][n] = st.m[n], sm_l[grp][n] = st.l[n];
#pragma unroll
    for (int c = 0; c < kCPL; ++c) {
      sm_acc[grp][n][lane * kCPL + c] = (st.acc[n][c] - st.wsum[n]) * static_cast<float>(1 << VB) + st.lacc[n];
    }
  }
  __syncthreads();
  store_merged(p, b, h, row0, out_split, kGroups, NQ, &sm_m[0][0], &sm_l[0][0], &sm_acc[0][0][0], kD);
}

template <int KB, int VB, int NQ, bool DENSE>
__global__ void __launch_bounds__(kThreads) attn_kernel(const AttnParams p, int row0) {
  constexpr int kTileN = NQ >= 4 ? 2 : kTile;
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x % kLanes, grp = threadIdx.x / kLanes;
  const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hkv + h;
  const int* kperm = (!DENSE && p.k.perm) ? p.k.perm + h * kD : nullptr;
  const int* vperm = (!DENSE && p.v.perm) ? p.v.perm + h * kD : nullptr;
  GroupState<NQ, VB> st;
  st.init(p, b, h, row0, lane, kperm);
  st.template init_int<KB>(p);
  const int mb = p.meta_bytes;
  const int kgrp = (lane * kCPL) / p.group;  // one metadata group per lane
  const std::int64_t t_begin = static_cast<std::int64_t>(split) * p.split_len;
  const std::int64_t t_end = min(p.kv_len, t_begin + p.split_len);

  for (std::int64_t base = t_begin; base < t_end; base += kGroups * kTileN) {
    float s[kTileN][NQ];
    Where where[kTileN];
#pragma unroll
    for (int u = 0; u < kTileN; ++u) {
      const std::int64_t t = base + u * kGroups + grp;
      const bool in = t < t_end;
      where[u] = locate<DENSE>(p, bh, in ? t : t_begin);
      float part[NQ];
      if (!DENSE && where[u].kind == 1) {
        LaneCodes<KB> kc;
        const std::int64_t rowi = bh * p.window + where[u].row;
        kc.load(p.k.codes + where[u].slot * p.k.slot_codes + rowi * p.k.row_bytes + lane * LaneCodes<KB>::kBytes);
        const std::int64_t mo = where[u].slot * p.k.slot_meta + (rowi * p.k.G + kgrp) * mb;
        const float ks = load_meta(p.k.scale + mo, p.meta), kl = load_meta(p.k.lo + mo, p.meta);
#pragma unroll
        for (int n = 0; n < NQ; ++n) part[n] = st.packed_score(kc, ks, kl, n);
      } else {
        float x[kCPL];
        load_exact(where[u].krow, kperm, lane, x);
#pragma unroll
        for (int n = 0; n < NQ; ++n) part[n] = st.exact_score(x, n);
      }
#pragma unroll
      for (int n = 0; n < NQ; ++n) {
        const float v = group_sum(part[n]);
        s[u][n] = (in && t <= st.limit[n]) ? v : -INFINITY;
      }
    }
    float pw[kTileN][NQ];
    st.softmax(s, pw);
#pragma unroll
    for (int u = 0; u < kTileN; ++u) {
      if (!DENSE && where[u].kind == 1) {
        LaneCodes<VB> vc;
        const std::int64_t rowi = bh * p.window + where[u].row;
        vc.load(p.v.codes + where[u].slot * p.v.slot_codes + rowi * p.v.row_bytes + lane * LaneCodes<VB>::kBytes);
        const std::int64_t mo = where[u].slot * p.v.slot_meta + (rowi * p.v.G + kgrp) * mb;
        st.add_packed_value(vc, load_meta(p.v.scale + mo, p.meta), load_meta(p.v.lo + mo, p.meta), pw, u);
      } else {
        float x[kCPL];
        load_exact(where[u].vrow, vperm, lane, x);
        st.add_exact_value(x, pw, u);
      }
    }
  }
  write_partial<NQ, VB>(p, row0, split, b, h, lane, grp, st);
}


// The tiles of one block when a KV head's tiles are shared out while the
// step runs (AttnParams::claims): the head's tiles [0, T) in chunks of C =
// chunk_tiles; the block's own chunk `split` first, then chunks claimed one
// at a time from the head's counter (chunk splits + the counter's old
// value), until a claim comes back past the last chunk. Blocks that stream
// faster (earlier on their SM, on a faster SM) so take more chunks, and the
// step's blocks end together instead of with the slowest (docs/performance.md).
// Tile indices are the head's (t_begin = 0), so a kernel's masks work on
// them unchanged. Thread 0 claims a chunk as the block starts on the one
// before it, keeps the answer in a register and writes it to shared memory at
// the next acquire, before that acquire's barrier; every thread reads it when
// the block starts on that chunk, at least one barrier later (C >= the
// copies' lead, so not before the next acquire); the two slots alternate, so
// a write never meets a read of the previous chunk. next() returns the tiles
// in order, -1 once there are none.
__shared__ int g_claimed[2];  // ClaimedTiles: the claimed chunks (two slots, alternating)
template <int TILE, int KB, int VB, int META_ROW = 0, int STAGES = kStages>
struct ClaimedTiles : TileStream<TILE, KB, VB, META_ROW, STAGES> {
  using Base = TileStream<TILE, KB, VB, META_ROW, STAGES>;
  // the copies' lead: two tiles (the fifo below holds both), one with a ring of two stages (f1 alone)
  static constexpr int kAhead = STAGES == 2 ? 1 : 2;
  // (the chunk size and counts are read from the kernel's parameters where used: no registers)
  mutable int next_tile, left, seq = 0;  // the next tile to issue, tiles left in its chunk, chunks begun
  mutable int f0 = -1, f1 = -1;          // tiles issued and not yet returned, oldest first
  mutable unsigned pending = 0;          // thread 0: a claim's answer not yet written
  mutable bool outstanding = false;      // thread 0: `pending` is for slot (seq + 1) & 1

  __device__ ClaimedTiles(const AttnParams& p_, const FastLayout<TILE>& lay_, unsigned char* ring_, std::int64_t bh_, int split)
      : Base(p_, lay_, ring_, bh_, 0, p_.q_end) {
    next_tile = split * p_.chunk_tiles;
    left = min(p_.chunk_tiles, p_.head_tiles - next_tile);
    claim();
  }
  __device__ void claim() const {  // for the chunk after the one just begun
    if (this->p.balance && threadIdx.x == 0) {
      pending = atomicAdd(this->p.claims + this->bh, 1u);
      outstanding = true;
    }
  }
  __device__ int advance() const {
    if (left == 0) {
      if (next_tile < 0) return -1;
      ++seq;
      const int c = this->p.balance ? this->p.splits + g_claimed[seq & 1] : this->p.head_chunks;
      if (c >= this->p.head_chunks) {
        next_tile = -1;
        return -1;
      }
      const bool big = c < this->p.big_chunks;
      next_tile = big ? c * this->p.chunk_tiles : c * this->p.small_tiles + this->p.small_base;
      left = min(big ? this->p.chunk_tiles : this->p.small_tiles, this->p.head_tiles - next_tile);
      claim();
    }
    --left;
    return next_tile++;
  }
  __device__ void issue_next(int stage_index) const {
    const int x = advance();
    if (x >= 0) {
      if (this->aligned) this->seek_tile(x);  // (tile indices are the head's: t_begin = 0)
      this->issue(x, stage_index);
    }
    f0 = f1, f1 = x;
  }
  __device__ void start() const {
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      issue_next(s);
      cp_async_commit();
    }
  }
  // Waits for the next tile, starts the copy of the one two ahead, returns its stage and (in `tile`)
  // its index in the head, -1 when the block's tiles are done.
  __device__ const unsigned char* next(int& tile) const {
    if (outstanding) {  // thread 0 only (the slot: seq is still the chunk the claim was made on)
      g_claimed[(seq + 1) & 1] = static_cast<int>(min(pending, 1u << 30));
      outstanding = false;
    }
    cp_async_wait_stages<kAhead>();
    __syncthreads();
    const int acq = this->acq;
    tile = kAhead == 2 ? f0 : f1;
    issue_next(acq + kAhead >= STAGES ? acq + kAhead - STAGES : acq + kAhead);
    cp_async_commit();
    this->acq = acq == STAGES - 1 ? 0 : acq + 1;
    return this->ring + acq * this->lay.stage;
  }
};

template <int KB, int VB, int NQ, int META>
__global__ void __launch_bounds__(kThreads, NQ >= 4 ? 3 : 1) attn_fast_kernel(const AttnParams p, int row0) {
  start_body();
  extern __shared__ __align__(16) unsigned char ring[];
  // Tokens per group per softmax step, a multiple of 4 (value quads): 8 (the
  // group's whole share of a tile) measured 3-10% faster than 4 with one or two
  // query rows; 4 with four rows (registers).
  constexpr int kSub = NQ >= 4 ? 4 : 8;
  const FastLayout<kFastTile> lay(p);
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x % kLanes, grp = threadIdx.x / kLanes;
  constexpr int mb = meta_bytes<META>();  // metadata bytes
  const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hkv + h;
  // The query loads go out first, then the first tiles' copies, then the
  // query setup that waits for the loads (it overlaps the copies).
  GroupState<NQ, VB> st;
  st.init(p, b, h, row0, lane, p.k.perm ? p.k.perm + h * kD : nullptr);
  const TileStream<kFastTile, KB, VB> tiles(p, lay, ring, bh, split);
  tiles.start();
  st.template init_int<KB>(p);
  const int kgrp = (lane * kCPL) / p.group;
  for (int tile = 0; tile < tiles.n_tiles; ++tile) {
    const unsigned char* stage = tiles.acquire(tile);
    const std::int64_t t0 = tiles.first_token(tile);
    const int live = tiles.live_rows(tile);  // rows past it hold stale bytes: masked, values zeroed
    // Visible tokens of the tile, relative to its first: [lo, hi[n]] (32-bit compares per token).
    auto rel = [t0](std::int64_t t) { return static_cast<int>(t < t0 ? -1 : t - t0 > kFastTile ? kFastTile : t - t0); };
    const int lo = rel(p.sinks);
    int hi[NQ];
#pragma unroll
    for (int n = 0; n < NQ; ++n) hi[n] = min(rel(st.limit[n]), live - 1);
#pragma unroll 1
    for (int u0 = 0; u0 < kFastTile / kGroups; u0 += kSub) {
      float s[kSub][NQ];
#pragma unroll
      for (int u = 0; u < kSub; ++u) {
        const int local = (u0 + u) * kGroups + grp;
        LaneCodes<KB> kc;
        kc.load_shared(stage + lay.kc + local * (kLanes * LaneCodes<KB>::kBytes) + lane * LaneCodes<KB>::kBytes);
        const int mo = (local * p.k.G + kgrp) * mb;
        const float ks = load_meta(stage + lay.ksc + mo, META), kl = load_meta(stage + lay.klo + mo, META);
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          const float v = group_sum(st.packed_score(kc, ks, kl, n));
          s[u][n] = (local >= lo && local <= hi[n]) ? v : -INFINITY;
        }
      }
      float pw[kSub][NQ];
      st.softmax(s, pw);
      LaneCodes<VB> vc[kSub];
      float vs[kSub], vl[kSub];
#pragma unroll
      for (int u = 0; u < kSub; ++u) {
        const int local = (u0 + u) * kGroups + grp;
        vc[u].load_shared(stage + lay.vc + local * (kLanes * LaneCodes<VB>::kBytes) + lane * LaneCodes<VB>::kBytes);
        const int mo = (local * p.v.G + kgrp) * mb;
        const bool ok = local < live;  // weight 0 either way, but stale metadata could be NaN
        vs[u] = ok ? load_meta(stage + lay.vsc + mo, META) : 0.0f;
        vl[u] = ok ? load_meta(stage + lay.vlo + mo, META) : 0.0f;
      }
      st.add_packed_values(vc, vs, vl, pw);
    }
  }
  write_partial<NQ, VB>(p, row0, split, b, h, lane, grp, st);
}

// Reduce-scatter over the 8 lanes of a group (distance 4, 2, 1: 7 shuffles
// and 7 adds): lane j of the group returns the group's sum of x[j].
template <typename T>
__device__ __forceinline__ T reduce_scatter8(const T (&x)[8], int lane) {
  const bool b4 = lane & 4, b2 = lane & 2, b1 = lane & 1;
  T r4[4], r2[2];
#pragma unroll
  for (int k = 0; k < 4; ++k) r4[k] = (b4 ? x[k + 4] : x[k]) + __shfl_xor_sync(0xffffffffu, b4 ? x[k] : x[k + 4], 4);
#pragma unroll
  for (int k = 0; k < 2; ++k) r2[k] = (b2 ? r4[k + 2] : r4[k]) + __shfl_xor_sync(0xffffffffu, b2 ? r4[k] : r4[k + 2], 2);
  return (b1 ? r2[1] : r2[0]) + __shfl_xor_sync(0xffffffffu, b1 ? r2[0] : r2[1], 1);
}

// ---- the dp4a kernel with one token per lane for the scalar work ----
//
// attn_fast_kernel's layout (8 lanes per token, 16 channels a lane, 8 tokens
// per group and tile), for metadata groups of 32, 64 or 128 channels (whole
// lanes). Each lane's 8 partial scores are summed over the group's 8 lanes by
// a reduce-scatter (distance 4, 2, 1: 7 shuffles and 7 adds instead of 24 and
// 24), after which lane j holds the whole score of the group's token j and
// does that token's scalar work alone: score, mask, exponential. With one
// metadata group a row (128) the partial sums are integers, scaled once by
// the token's scale and minimum, and lane j also forms its token's value
// weight and its 16-bit rounding; the 8 rounded weights come back to every
// lane by an all-gather (4 shuffles). With smaller groups each lane scales
// its partial sums by its own group's key scale and minimum before the
// (float) reduce-scatter, and gets the 8 exponentials back (8 shuffles) to
// form and round the weights with its own group's value scales. The dp4a
// value sums are those of attn_fast_kernel. The softmax sum l stays per lane
// (its own tokens) and is summed over the group at the end, as is the value
// minima's sum lacc at group 128 (smaller groups: each lane's own).
// Every shuffle runs on all 32 lanes: nothing that precedes one branches.
template <int KB, int VB, int NQ, int META, int GS>
__global__ void __launch_bounds__(kThreads) attn_rs_kernel(const AttnParams p, int row0) {
  start_body();
  const std::uint64_t trace_t0 = trace_now();
  extern __shared__ __align__(16) unsigned char ring[];
  static_assert(NQ == 1 || NQ == 2, "one or two query rows");
  constexpr int kSub = kFastTile / kGroups;  // 8 tokens per group and tile: one per lane
  static_assert(kSub == kLanes, "one token per lane");
  const FastLayout<kFastTile> lay(p);
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x % kLanes, grp = threadIdx.x / kLanes;
  constexpr int mb = meta_bytes<META>();  // metadata bytes
  static_assert(GS == 32 || GS == 64 || GS == 128, "metadata groups of whole lanes");
  constexpr int kG = kD / GS;  // metadata groups a row
  const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hkv + h;
  // The query loads go out first, then the first tiles' copies, then the
  // query setup that waits for the loads (it overlaps the copies).
  GroupState<NQ, VB> st;
  st.init(p, b, h, row0, lane, p.k.perm ? p.k.perm + h * kD : nullptr);
  const TileStream<kFastTile, KB, VB> tiles(p, lay, ring, bh, split);
  tiles.start();
  st.template init_int<KB>(p);
  float qsum[NQ];  // the whole row's sum of q (times the key minimum: one group)
#pragma unroll
  for (int n = 0; n < NQ; ++n) qsum[n] = group_sum(st.qs[n]);
  const bool b4 = lane & 4, b2 = lane & 2, b1 = lane & 1;
  for (int tile = 0; tile < tiles.n_tiles; ++tile) {
    const unsigned char* stage = tiles.acquire(tile);
    const std::int64_t t0 = tiles.first_token(tile);
    const int live = tiles.live_rows(tile);
    auto rel = [t0](std::int64_t t) { return static_cast<int>(t < t0 ? -1 : t - t0 > kFastTile ? kFastTile : t - t0); };
    const int lo = rel(p.sinks);
    const int mine = lane * kGroups + grp;  // the token this lane scores (local row of the tile)
    const int kgrp = (lane * kCPL) / GS;    // this lane's metadata group (GS < 128)

    // integer partial scores of the group's 8 tokens over this lane's channels
    int part[NQ][kSub];
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      LaneCodes<KB> kc;
      kc.load_shared(stage + lay.kc + (u * kGroups + grp) * (kLanes * LaneCodes<KB>::kBytes) + lane * LaneCodes<KB>::kBytes);
#pragma unroll
      for (int n = 0; n < NQ; ++n) part[n][u] = st.template packed_dot<KB>(kc, n);  // 8 of them: |sum| < 2^31
    }
    // Reduce-scatter over the group: lane j ends with token j's whole score.
    // One metadata group a row (GS 128): the integer sums first, then token
    // j's scale; smaller groups: each lane scales its own partial sums by its
    // group's scale and minimum first and the floats are summed.
    const float ksc = GS == 128 ? load_meta(stage + lay.ksc + mine * mb, META) : 0.0f;
    const float klo = GS == 128 ? load_meta(stage + lay.klo + mine * mb, META) : 0.0f;
    const bool ok = mine < live;  // rows past it hold stale bytes (weight 0; metadata could be NaN)
    const float vsc = GS == 128 && ok ? load_meta(stage + lay.vsc + mine * mb, META) : 0.0f;
    const float vlo = GS == 128 && ok ? load_meta(stage + lay.vlo + mine * mb, META) : 0.0f;
    float kscale[kSub], kmin[kSub];  // GS < 128: this lane's group, each of the 8 tokens
    if constexpr (GS < 128) {
#pragma unroll
      for (int u = 0; u < kSub; ++u) {
        const int mo = ((u * kGroups + grp) * kG + kgrp) * mb;
        kscale[u] = load_meta(stage + lay.ksc + mo, META), kmin[u] = load_meta(stage + lay.klo + mo, META);
      }
    }
    unsigned wl[NQ][2], wh[NQ][2];
    float sw[NQ];
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      float sc;
      if constexpr (GS == 128) {
        const int total = reduce_scatter8(part[n], lane);
        sc = fmaf(ksc * st.qstep[n], static_cast<float>(total), klo * qsum[n]);
      } else {
        float f[kSub];
#pragma unroll
        for (int u = 0; u < kSub; ++u) f[u] = fmaf(kscale[u] * st.qstep[n], static_cast<float>(part[n][u]), kmin[u] * st.qs[n]);
        sc = reduce_scatter8(f, lane);
      }
      const bool visible = mine >= lo && mine <= min(rel(st.limit[n]), live - 1);
      const float s = visible ? sc : -INFINITY;

      // online softmax of the group (max over its 8 lanes)
      float mt = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, 1));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 4));
      const float mnew = fmaxf(st.m[n], mt);
      const bool none = mnew == -INFINITY;
      const float corr = none ? 1.0f : fast_exp2(st.m[n] - mnew);
      const float pw = none ? 0.0f : fast_exp2(s - mnew);
      st.m[n] = mnew;
      st.l[n] = fmaf(st.l[n], corr, pw);
      if constexpr (GS == 128) st.lacc[n] = fmaf(st.lacc[n], corr, pw * vlo);
      if (corr != 1.0f) {
#pragma unroll
        for (int c = 0; c < kCPL; ++c) st.acc[n][c] *= corr;
      }

      if constexpr (GS == 128) {
        // this token's weight rounded to 16 bits against the group's maximum,
        // then all 8 weights to every lane: quad q's low / high bytes in wl / wh
        const float u = pw * vsc;
        float umax = fmaxf(u, __shfl_xor_sync(0xffffffffu, u, 1));
        umax = fmaxf(umax, __shfl_xor_sync(0xffffffffu, umax, 2));
        umax = fmaxf(umax, __shfl_xor_sync(0xffffffffu, umax, 4));
        const W16 w16 = w16_of(umax);
        sw[n] = w16.step;
        const unsigned r = w16.round(u);
        const unsigned r1 = __shfl_xor_sync(0xffffffffu, r, 1);
        const unsigned pair = b1 ? __byte_perm(r1, r, 0x5410) : __byte_perm(r, r1, 0x5410);  // tokens 2k, 2k + 1
        const unsigned pair2 = __shfl_xor_sync(0xffffffffu, pair, 2);
        const unsigned qa = b2 ? pair2 : pair, qb = b2 ? pair : pair2;  // tokens 4j..4j+1, 4j+2..4j+3
        const unsigned ya = __shfl_xor_sync(0xffffffffu, qa, 4), yb = __shfl_xor_sync(0xffffffffu, qb, 4);
        const unsigned q0a = b4 ? ya : qa, q0b = b4 ? yb : qb, q1a = b4 ? qa : ya, q1b = b4 ? qb : yb;
        wl[n][0] = __byte_perm(q0a, q0b, 0x6420), wh[n][0] = __byte_perm(q0a, q0b, 0x7531);
        wl[n][1] = __byte_perm(q1a, q1b, 0x6420), wh[n][1] = __byte_perm(q1a, q1b, 0x7531);
      } else {
        // the 8 tokens' weights to every lane (token u is lane u's), then per
        // lane its value group's scales: weights rounded to 16 bits against
        // this lane's maximum, and its own sum of p * minimum
        float pws[kSub], uu[kSub], umax = 0.0f, lsum = 0.0f;
        const int base = (threadIdx.x % 32) & ~(kLanes - 1);
#pragma unroll
        for (int u = 0; u < kSub; ++u) pws[u] = __shfl_sync(0xffffffffu, pw, base + u);
#pragma unroll
        for (int u = 0; u < kSub; ++u) {
          const int local = u * kGroups + grp, mo = (local * kG + kgrp) * mb;
          const bool live_u = local < live;  // stale rows: weight 0, metadata could be NaN
          const float vs = live_u ? load_meta(stage + lay.vsc + mo, META) : 0.0f;
          const float vl = live_u ? load_meta(stage + lay.vlo + mo, META) : 0.0f;
          uu[u] = pws[u] * vs;
          umax = fmaxf(umax, uu[u]);
          lsum = fmaf(pws[u], vl, lsum);
        }
        st.lacc[n] = fmaf(st.lacc[n], corr, lsum);
        const W16 w16 = w16_fast(umax);
        sw[n] = w16.step;
#pragma unroll
        for (int qd = 0; qd < 2; ++qd) {
          const unsigned p01 = __byte_perm(w16.round_low16(uu[4 * qd]), w16.round_low16(uu[4 * qd + 1]), 0x5410);
          const unsigned p23 = __byte_perm(w16.round_low16(uu[4 * qd + 2]), w16.round_low16(uu[4 * qd + 3]), 0x5410);
          wl[n][qd] = __byte_perm(p01, p23, 0x6420), wh[n][qd] = __byte_perm(p01, p23, 0x7531);
        }
      }
    }

    // values: the group's 8 tokens transposed four at a time (attn_fast_kernel's dp4a sums)
    constexpr int kQ = kSub / 4, kW = LaneCodes<VB>::kWords, kVPerByte = 8 / VB;
    constexpr unsigned kVMask = ((1u << VB) - 1u) * 0x01010101u;
    unsigned x[kQ][kW][4];
#pragma unroll
    for (int qd = 0; qd < kQ; ++qd) {
      LaneCodes<VB> vc[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        vc[j].load_shared(stage + lay.vc + ((4 * qd + j) * kGroups + grp) * (kLanes * LaneCodes<VB>::kBytes) +
                          lane * LaneCodes<VB>::kBytes);
#pragma unroll
      for (int w = 0; w < kW; ++w) transpose_bytes4x4(vc[0].w[w], vc[1].w[w], vc[2].w[w], vc[3].w[w], x[qd][w]);
    }
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
      for (int c = 0; c < kCPL; ++c) {
        const int bit = c * VB, w = bit / 32, byte = (bit % 32) / 8, m = (bit % 8) / VB;
        unsigned ah = 0, al = 0;
#pragma unroll
        for (int qd = 0; qd < kQ; ++qd) {
          const unsigned xm = kVPerByte == 1 ? x[qd][w][byte] : x[qd][w][byte] & (kVMask << (m * VB));
          asm("dp4a.u32.u32 %0, %1, %2, %0;" : "+r"(ah) : "r"(xm), "r"(wh[n][qd]));
          asm("dp4a.u32.u32 %0, %1, %2, %0;" : "+r"(al) : "r"(xm), "r"(wl[n][qd]));
        }
        const float unit = sw[n] * pow2_neg(VB + m * VB);
        st.acc[n][c] = fmaf(unit, __uint2float_rn(ah * 256u + al), st.acc[n][c]);
      }
  }
#pragma unroll
  for (int n = 0; n < NQ; ++n) {
    st.l[n] = group_sum(st.l[n]);
    if (GS == 128) st.lacc[n] = group_sum(st.lacc[n]);  // smaller groups: each lane's own group already
  }
  const std::uint64_t trace_t1 = trace_now();
  write_partial<NQ, VB>(p, row0, split, b, h, lane, grp, st);
  trace_block(trace::kBody, trace_t0, trace_t1);
}

// ---- integer tensor-core kernel for the packed body ----
//
// Same 128-token tiles and cp.async ring as attn_fast_kernel; each of the 4
// warps takes 32 tokens of a tile for up to 8 query rows of the KV head and
// runs both products on the tensor cores as int8 MMAs (mma.sync m16n8k32,
// exact int32 sums):
//   scores  A = q rounded to 16 bits as in the dp4a path (rows 0-7: the
//           high bytes of the query rows, rows 8-15: their low bytes),
//           B = key codes, one byte each, masked out of the packed bytes;
//   values  A = weights p * scale rounded to 16 unsigned bits per 32 tokens
//           and metadata group (rows 0-7 high bytes, rows 8-15 low bytes),
//           B = value codes of 4 tokens gathered into one register per lane.
// So the high and low halves of a row's sum land in the same lane (C rows g
// and g + 8), and the integer forms are those of the dp4a paths: the error
// bound is the same with blocks of 32 tokens for the value weights
// (docs/numerics.md). The k order of a product is free and the value
// channels of an n-tile may be any 8: both are chosen so that every lane
// builds its fragments from bytes it loads itself, with no shuffles, and so
// that an n-tile of values lies inside one metadata group (groups of 32, 64
// or 128 channels; values of 2, 4 or 8 bits).
constexpr int kImmaRows = 8;     // query rows per launch (A rows 0-7)
constexpr int kImmaTokens = 32;  // tokens per warp per tile

// Byte `sel` (a __byte_perm selector picking byte k of two words: k | (4 + k) << 4)
// of each of four words, packed low to high.
__device__ __forceinline__ unsigned pick_bytes4(unsigned w0, unsigned w1, unsigned w2, unsigned w3, unsigned sel) {
  return __byte_perm(__byte_perm(w0, w1, sel), __byte_perm(w2, w3, sel), 0x5410);
}
// The same byte of four packed rows, at byte offsets 0, o1, o2, o3 from p.
__device__ __forceinline__ unsigned gather_bytes4(const unsigned char* p, int o1, int o2, int o3, unsigned sel) {
  const auto w = [p](int o) { return *reinterpret_cast<const unsigned*>(p + o); };
  return pick_bytes4(w(0), w(o1), w(o2), w(o3), sel);
}

// Key k-steps are 32 channels. Lane (g, t) supplies B rows (k) 4t..4t+3 from
// slice register 2t and 16+4t..16+4t+3 from slice register 2t+1; slice
// register r of a k-step is word r / PK of it shifted by (r % PK) * KB and
// masked, so its byte j holds channel (4 (r / PK) + j) PK + r % PK.
template <int KB>
__device__ __forceinline__ int imma_key_channel(int r, int j) {
  constexpr int PK = 8 / KB;
  return (4 * (r / PK) + j) * PK + r % PK;
}

// Slice registers 2t and 2t + 1 of k-step ks of one packed key row (see
// imma_key_channel): the key codes a lane feeds to the MMA for k = 4t + j and
// 16 + 4t + j.
template <int KB>
__device__ __forceinline__ void key_slices(const unsigned char* row, int ks, int t, unsigned& s0, unsigned& s1) {
  constexpr int PK = 8 / KB;
  constexpr unsigned kMask = ((1u << KB) - 1u) * 0x01010101u;
  if constexpr (PK == 1) {
    const uint2 w = *reinterpret_cast<const uint2*>(row + 4 * (ks * KB + 2 * t));
    s0 = w.x, s1 = w.y;
  } else {
    const unsigned w = *reinterpret_cast<const unsigned*>(row + 4 * (ks * KB + (2 * t) / PK));
    const int sh = ((2 * t) % PK) * KB;
    s0 = (w >> sh) & kMask, s1 = (w >> (sh + KB)) & kMask;
  }
}

template <int KB, int VB, int META, int GS>
__global__ void __launch_bounds__(kThreads, 4) attn_imma_kernel(const AttnParams p, int row0) {
  start_body();
  extern __shared__ __align__(16) unsigned char ring[];
  constexpr int PV = 8 / VB, HV = VB / 2;  // value codes per byte; byte sets per value group
  constexpr unsigned kMaskV = ((1u << VB) - 1u) * 0x01010101u;
  static_assert(VB >= 2, "value n-tiles need 8 bytes per group");
  const FastLayout<kFastTile> lay(p);
  // blockIdx.z: the batch entry, then the block's group of kImmaRows query rows after row0 (one
  // launch takes many groups: launch_fast_rows)
  const int split = blockIdx.x, h = blockIdx.y, b = static_cast<int>(blockIdx.z % static_cast<unsigned>(p.B));
  row0 += static_cast<int>(blockIdx.z / static_cast<unsigned>(p.B)) * kImmaRows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int G = p.Hq / p.Hkv, n_rows = p.query_rows();
  constexpr int mb = meta_bytes<META>();  // metadata bytes
  // metadata groups of GS = 32, 64 or 128 channels: 1, 2 or 4 k-steps (and value n-tile sets) a group
  static_assert(GS == 32 || GS == 64 || GS == 128, "group size");
  constexpr int gshift = GS == 32 ? 0 : GS == 64 ? 1 : 2, spg = 1 << gshift;
  constexpr int kgs = 2 - gshift;  // log2 of the groups in a row
  const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hkv + h;
  const int* kperm = p.k.perm ? p.k.perm + h * kD : nullptr;
  const int krow = 16 * KB, vrow = 16 * VB;  // bytes per packed row
  // tile copies first: their latency overlaps the query setup
  const TileStream<kFastTile, KB, VB> tiles(p, lay, ring, bh, split);
  tiles.start();

  // q of this lane's row (g), rounded to 16 bits against the row's max|q|.
  const int row = row0 + g;
  const bool valid = row < n_rows;
  const int gq = valid ? row / p.Sq : 0, qi = valid ? row % p.Sq : 0;
  const float* qrow = p.q + ((static_cast<std::int64_t>(b) * p.Hq + h * G + gq) * p.Sq + qi) * kD;
  const std::int64_t limit = valid ? p.kv_len - p.Sq + qi : -1;
  float qs[4];
  unsigned qa[4][4];  // per k-step: a0 (row g, high), a1 (row g + 8, low), a2, a3 (k + 16)
  const float qstep = q16_fragments(qrow, kperm, valid, p.scale,
                                    [t](int ks, int e, int j) { return 32 * ks + imma_key_channel<KB>(2 * t + e, j); }, qa, qs);

  // Online softmax of row g over this lane's tokens (the 4 lanes of a row
  // share m; l is this lane's part); acc[vg][n-tile][i] holds channel
  // 32 vg + (8 hh + 2 t + i) PV + mm of n-tile hh * PV + mm.
  float m = -INFINITY, l = 0.0f, acc[4][4][2], lacc[4];
#pragma unroll
  for (int vg = 0; vg < 4; ++vg) {
    lacc[vg] = 0.0f;
#pragma unroll
    for (int n = 0; n < 4; ++n) acc[vg][n][0] = acc[vg][n][1] = 0.0f;
  }
  // value gathers: lane g takes byte (8 hh + g) of each group; the selector picks byte g % 4 of two words
  const unsigned vsel = static_cast<unsigned>(g & 3) | ((static_cast<unsigned>(g & 3) + 4u) << 4);

  for (int tile = 0; tile < tiles.n_tiles; ++tile) {
    const unsigned char* stage = tiles.acquire(tile);
    const std::int64_t t0 = tiles.first_token(tile);
    const int live = tiles.live_rows(tile);  // rows past it hold stale bytes: masked, values zeroed
    auto rel = [t0](std::int64_t x) { return static_cast<int>(x < t0 ? -1 : x - t0 > kFastTile ? kFastTile : x - t0); };
    const int lo = rel(p.sinks), hi = min(rel(limit), live - 1);
    const int base = warp * kImmaTokens;

    // scores of tokens base + 8 nt + 2 t + i (C columns), keys of token base + 8 nt + g (B column)
    float s[4][2];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const unsigned char* kr = stage + lay.kc + (base + 8 * nt + g) * krow;
      int c[4][4];  // one accumulator per k-step: the four MMAs are independent
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        unsigned b0, b1;
        key_slices<KB>(kr, ks, t, b0, b1);
        c[ks][0] = c[ks][1] = c[ks][2] = c[ks][3] = 0;
        imma<true, false>(c[ks], qa[ks], b0, b1);
      }
      float sc[2] = {0.0f, 0.0f}, qsum = 0.0f;
      int hs[2] = {0, 0}, ls[2] = {0, 0};  // a key group's integer sums (high, low rows)
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        if ((ks & (spg - 1)) == 0) hs[0] = hs[1] = ls[0] = ls[1] = 0, qsum = 0.0f;
        hs[0] += c[ks][0], hs[1] += c[ks][1], ls[0] += c[ks][2], ls[1] += c[ks][3];
        qsum += qs[ks];
        if (((ks + 1) & (spg - 1)) == 0) {  // end of a key metadata group
          const int kg = ks >> gshift;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int mo = (((base + 8 * nt + 2 * t + i) << kgs) + kg) * mb;
            const float ksc = load_meta(stage + lay.ksc + mo, META), klo = load_meta(stage + lay.klo + mo, META);
            sc[i] += fmaf(ksc * qstep, static_cast<float>(hs[i] * 256 + ls[i]), klo * qsum);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int local = base + 8 * nt + 2 * t + i;
        s[nt][i] = (local >= lo && local <= hi) ? sc[i] : -INFINITY;
      }
    }

    // online softmax over the 32 tokens (row max across the row's 4 lanes)
    float pw[4][2];
    const float corr = softmax_step<4, 1, 2>(s, m, l, pw);
    if (corr != 1.0f) {
#pragma unroll
      for (int vg = 0; vg < 4; ++vg) {
        lacc[vg] *= corr;
#pragma unroll
        for (int n = 0; n < 4; ++n) acc[vg][n][0] *= corr, acc[vg][n][1] *= corr;
      }
    }

    // values, one 32-channel group (4 n-tiles) at a time
    unsigned va[4] = {0, 0, 0, 0};
    float vsw = 0.0f;
#pragma unroll
    for (int vg = 0; vg < 4; ++vg) {
      if ((vg & (spg - 1)) == 0) {  // a new value metadata group: its weights
        const int vgrp = vg >> gshift;
        float u[4][2], umax = 0.0f, lsum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int local = base + 8 * nt + 2 * t + i;
            const int mo = ((local << kgs) + vgrp) * mb;
            const bool ok = local < live;  // weight 0 either way, but stale metadata could be NaN
            const float vs = ok ? load_meta(stage + lay.vsc + mo, META) : 0.0f;
            const float vl = ok ? load_meta(stage + lay.vlo + mo, META) : 0.0f;
            u[nt][i] = pw[nt][i] * vs;
            umax = fmaxf(umax, u[nt][i]);
            lsum = fmaf(pw[nt][i], vl, lsum);
          }
        lacc[vg] += lsum;
        umax = fmaxf(umax, __shfl_xor_sync(0xffffffffu, umax, 1));
        umax = fmaxf(umax, __shfl_xor_sync(0xffffffffu, umax, 2));
        const W16 w16 = w16_fast(umax);
        vsw = w16.step;
        unsigned r[4][2];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int i = 0; i < 2; ++i) r[nt][i] = w16.round_low16(u[nt][i]);
        // k = 4 t + j: token (j / 2) * 8 + 2 t + j % 2; k = 16 + 4 t + j: 16 more
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const unsigned x0 = __byte_perm(r[2 * half][0], r[2 * half][1], 0x5140);
          const unsigned x1 = __byte_perm(r[2 * half + 1][0], r[2 * half + 1][1], 0x5140);
          va[2 * half] = __byte_perm(x0, x1, 0x7632);      // high bytes: rows g
          va[2 * half + 1] = __byte_perm(x0, x1, 0x5410);  // low bytes: rows g + 8
        }
      }
#pragma unroll
      for (int hh = 0; hh < HV; ++hh) {
        const int wofs = (vg * 4 * VB + 8 * hh + g) & ~3;
        unsigned xv[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const unsigned char* vr = stage + lay.vc + (base + 16 * half + 2 * t) * vrow + wofs;
          xv[half] = gather_bytes4(vr, vrow, 8 * vrow, 9 * vrow, vsel);
        }
#pragma unroll
        for (int mm = 0; mm < PV; ++mm) {
          int c[4] = {0, 0, 0, 0};
          const unsigned mask = kMaskV << (mm * VB);  // codes stay mm * VB bits up: folded into unit
          imma<false, false>(c, va, xv[0] & mask, xv[1] & mask);
          const float unit = vsw * pow2_neg(mm * VB);
          acc[vg][hh * PV + mm][0] = fmaf(unit, static_cast<float>(c[0] * 256 + c[2]), acc[vg][hh * PV + mm][0]);
          acc[vg][hh * PV + mm][1] = fmaf(unit, static_cast<float>(c[1] * 256 + c[3]), acc[vg][hh * PV + mm][1]);
        }
      }
    }
  }

  // merge the 4 warps in shared memory; one partial per row
  __shared__ float sm_m[4][kImmaRows], sm_l[4][kImmaRows];
  __shared__ float sm_acc[4][kImmaRows][kD];
  l = quad_sum(l);
#pragma unroll
  for (int vg = 0; vg < 4; ++vg) lacc[vg] = quad_sum(lacc[vg]);  // each lane summed p * lo over its own tokens
  if (t == 0) sm_m[warp][g] = m, sm_l[warp][g] = l;
  float lv = lacc[0];
#pragma unroll
  for (int vg = 0; vg < 4; ++vg) {
    if ((vg & (spg - 1)) == 0) lv = lacc[vg];
#pragma unroll
    for (int hh = 0; hh < HV; ++hh)
#pragma unroll
      for (int mm = 0; mm < PV; ++mm)
#pragma unroll
        for (int i = 0; i < 2; ++i) sm_acc[warp][g][32 * vg + (8 * hh + 2 * t + i) * PV + mm] = acc[vg][hh * PV + mm][i] + lv;
  }
  __syncthreads();
  store_merged(p, b, h, row0, split, 4, kImmaRows, &sm_m[0][0], &sm_l[0][0], &sm_acc[0][0][0], kD);
}

// ---- token-major integer tensor-core kernel (up to 4 query rows) ----
//
// The same products with the roles turned: tokens (keys) and channels
// (values) are the 16 MMA rows, and the query rows are the 8 columns, two per
// row (its high and low bytes). Each MMA then does useful work in every row
// and column when 4 query rows share a KV head, and half the MMAs and half the
// integer-to-float work of attn_imma_kernel are needed per token:
//   scores^T (16 tokens x 8)   = K (16 tokens x 32 channels, u8 codes) . Q^T (32 x 8, s8 q bytes)
//   out^T    (16 channels x 8) = V^T (16 channels x 32 tokens, u8 codes) . W^T (32 x 8, u8 weight bytes)
// Lane (g, t) ends with row t's scores of tokens g, g + 8 (+16, +24) and row t's
// sums of two channels per n-tile; the weights travel to the lanes that hold
// W^T with 8 shuffles per 32 tokens. Same 16-bit q and 16-bit weights (per 32
// tokens and metadata group) as the other integer paths (docs/numerics.md).
constexpr int kTmmaRows = 4;
// Blocks per SM the register budget allows: 5 (up to 102 registers a thread) measured 3-7% faster
// than 6 (80) at grouped-query shapes in session 20, and again in session 25 for the kernels that
// take one tile at a time, the one-row form among them, by 1-13% (docs/performance-history.md); -D to
// experiment.
#ifndef SKVQ_TMMA_MIN_BLOCKS
#define SKVQ_TMMA_MIN_BLOCKS 5
#endif
constexpr int kTmmaMinBlocks = SKVQ_TMMA_MIN_BLOCKS;

// attn_tmma_kernel takes its value codes by ldmatrix: one `ldmatrix.x4.trans` a 16-byte span of
// the value rows gives a lane b16 column g (bytes 2g, 2g + 1) of 32 tokens, rows 2t and 2t + 1 of
// each 8, and two byte permutes make the A registers of two value sets from them (1 load and 4
// permutes for 4 registers, where word loads and a 4x4 byte transpose took 12 instructions at
// groups of 128 and single-byte gathers 28 at groups of 32 and 64). A set's bytes must lie in one
// metadata group. Where every 16-byte span does (all but 2-bit values at groups of 32), set 2s
// takes the even bytes of span s and set 2s + 1 the odd ones. With 2-bit values at groups of 32
// (tmma_swap_values) a span holds two groups of 8 bytes, and lane g's column lies in the first for
// g < 4, in the second otherwise: each lane keeps its even bytes and trades its odd bytes with lane
// g ^ 4 (one shuffle a register pair), so that set 2s (the span's first group) is the even bytes
// of lanes g < 4 and the odd bytes that lanes g >= 4 got from them, set 2s + 1 the other way round.
template <int GS, int VB>
constexpr bool tmma_swap_values() {
  return GS == 32 && VB == 2;
}
// The byte of a packed value row whose channels are A rows g and g + 8 of value set `set` in
// attn_tmma_kernel (all 8 bytes of a set lie in one metadata group).
template <int GS, int VB>
__device__ __forceinline__ constexpr int tmma_vbyte(int set, int g) {
  const int span = 16 * (set / 2);
  if constexpr (tmma_swap_values<GS, VB>()) {
    if (set % 2 == 0) return g < 4 ? span + 2 * g : span + 2 * (g - 4) + 1;
    return g >= 4 ? span + 2 * g : span + 2 * (g + 4) + 1;
  }
  return span + 2 * g + set % 2;
}
// The metadata group of value set `set`: that of its byte for g = 0 (every byte of a set lies in
// one group).
template <int GS, int VB>
__device__ __forceinline__ constexpr int tmma_vgroup(int set) {
  return tmma_vbyte<GS, VB>(set, 0) * (8 / VB) / GS;
}
// Four 8x8 matrices of 16-bit elements, transposed: lane l gives the address of row l % 8 of
// matrix l / 8 (16 bytes, 16-byte aligned); lane (g, t) gets element g of rows 2t (low half)
// and 2t + 1 (high half) of each matrix.
__device__ __forceinline__ void ldsm_x4_trans(const unsigned char* p, unsigned (&r)[4]) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// The token-major kernel's key fragments. Lane (g, t) feeds, for k-step ks,
// slice e (e = 0: k = 4t + j, e = 1: k = 16 + 4t + j) of a key row; which
// channel that is, is free (q is placed to match) as long as a metadata
// group's channels are whole k-steps. With 2- or 4-bit codes and groups of
// 64 or 128 a lane takes whole words of the row for all four k-steps (one or
// two loads a row) and each slice is a fixed-position shift and mask of them;
// otherwise (groups of 32, 8-bit codes) the k-steps are those of
// key_slices. Word `wi` of the row and position `pos` of a code in its byte
// give channel (4 wi + j) (8 / KB) + pos.
template <int KB, int GS>
constexpr bool tmma_wide_keys() {
  return (KB == 2 || KB == 4) && (GS == 64 || GS == 128);
}
template <int KB, int GS>
__device__ __forceinline__ int tmma_key_channel(int ks, int t, int e, int j) {
  constexpr int PK = 8 / KB;
  if constexpr (KB == 2 && GS == 128) {  // words 2t, 2t + 1 (one 8-byte load)
    return (4 * (2 * t + ks / 2) + j) * PK + 2 * (ks % 2) + e;
  } else if constexpr (KB == 2 && GS == 64) {  // words t, 4 + t
    return (4 * (4 * (ks / 2) + t) + j) * PK + 2 * (ks % 2) + e;
  } else if constexpr (KB == 4 && (GS == 64 || GS == 128)) {  // words 2t, 2t + 1 and 8 + 2t, 9 + 2t
    return (4 * (8 * (ks / 2) + 2 * t + ks % 2) + j) * PK + e;
  } else {
    return 32 * ks + imma_key_channel<KB>(2 * t + e, j);
  }
}
template <int KB, int GS>
__device__ __forceinline__ void tmma_key_slices(const unsigned char* row, int t, unsigned (&sl)[4][2]) {
  static_assert(tmma_wide_keys<KB, GS>(), "whole words a lane: key_slices otherwise");
  constexpr unsigned kMask = ((1u << KB) - 1u) * 0x01010101u;
  unsigned w[4];
  if constexpr (KB == 2 && GS == 128) {
    const uint2 a = *reinterpret_cast<const uint2*>(row + 8 * t);
    w[0] = w[1] = a.x, w[2] = w[3] = a.y;
  } else if constexpr (KB == 2) {
    w[0] = w[1] = *reinterpret_cast<const unsigned*>(row + 4 * t);
    w[2] = w[3] = *reinterpret_cast<const unsigned*>(row + 16 + 4 * t);
  } else {
    const uint2 a = *reinterpret_cast<const uint2*>(row + 8 * t), b = *reinterpret_cast<const uint2*>(row + 32 + 8 * t);
    w[0] = a.x, w[1] = a.y, w[2] = b.x, w[3] = b.y;
  }
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    constexpr int kPerWord = KB == 2 ? 2 : 1;  // k-steps a word serves
    const int sh = KB * 2 * (ks % kPerWord);
    sl[ks][0] = (w[ks] >> sh) & kMask, sl[ks][1] = (w[ks] >> (sh + KB)) & kMask;
  }
}

// The NG metadata values (minima or scales of NG groups) of one token in a stage, by one vector
// load: a token's NG values are contiguous, the stage's arrays start at multiples of 16 and a
// token's row is NG values long, so the row is aligned to its size.
template <int META, int NG>
__device__ __forceinline__ void load_meta_row(const unsigned char* p, float (&x)[NG]) {
  static_assert(NG == 1 || NG == 2 || NG == 4, "1, 2 or 4 groups a row");
  if constexpr (NG == 1) {
    x[0] = load_meta(p, META);
  } else if constexpr (META == 1) {
    if constexpr (NG == 2) {
      const float2 v = *reinterpret_cast<const float2*>(p);
      x[0] = v.x, x[1] = v.y;
    } else {
      const float4 v = *reinterpret_cast<const float4*>(p);
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    }
  } else if constexpr (META == 0) {
    __half2 h[NG / 2];
    if constexpr (NG == 2) {
      h[0] = *reinterpret_cast<const __half2*>(p);
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(p);
      memcpy(&h[0], &w.x, 4);
      memcpy(&h[1], &w.y, 4);
    }
#pragma unroll
    for (int j = 0; j < NG / 2; ++j) x[2 * j] = __low2float(h[j]), x[2 * j + 1] = __high2float(h[j]);
  } else {
    const unsigned w = NG == 4 ? *reinterpret_cast<const unsigned*>(p) : *reinterpret_cast<const unsigned short*>(p);
#pragma unroll
    for (int j = 0; j < NG; ++j) x[j] = e4m3_to_float(static_cast<unsigned char>(w >> (8 * j)));
  }
}

// The query of row `row` of the block's rows (row 0's where `row` is past them; `valid` says which).
__device__ __forceinline__ const float* tmma_qrow(const AttnParams& p, int b, int h, int row, bool& valid) {
  const int G = p.Hq / p.Hkv, n_rows = p.query_rows();
  valid = row < n_rows;
  const int gq = valid ? row / p.Sq : 0, qi = valid ? row % p.Sq : 0;
  return p.q + ((static_cast<std::int64_t>(b) * p.Hq + h * G + gq) * p.Sq + qi) * kD;
}

// attn_tmma_kernel's SRC: rows [r0, r0 + 32) of a tile's key and value codes, stored at SRC bits
// (ksrc, vsrc: rows of kD SRC / 8 bytes), widened to widen::Widen<SRC>::kTo bits (kdst, vdst; rows of
// kD kTo / 8 bytes; cuda/widen.hpp). A row is four chunks of 32 codes; lane l takes chunks l, l + 32,
// l + 64 and l + 96 of each side's 32 rows, so that consecutive lanes read and write consecutive
// chunks (no bank conflicts).
template <int SRC>
__device__ __forceinline__ void tmma_widen_rows(const unsigned char* ksrc, const unsigned char* vsrc, unsigned char* kdst,
                                                unsigned char* vdst, int r0, int lane) {
  using W = widen::Widen<SRC>;
  constexpr int kIn = kD * SRC / 8, kOut = kD * W::kTo / 8, kChunks = kD / 32;
  static_assert(kChunks * 4 * W::kIn == kIn && kChunks * 4 * W::kOut == kOut, "whole chunks a row");
#pragma unroll
  for (int side = 0; side < 2; ++side) {
    const unsigned char* src = (side == 0 ? ksrc : vsrc) + r0 * kIn;
    unsigned char* dst = (side == 0 ? kdst : vdst) + r0 * kOut;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = lane + 32 * j, row = c / kChunks, part = c % kChunks;
      const unsigned* w = reinterpret_cast<const unsigned*>(src + row * kIn + part * 4 * W::kIn);
      unsigned in[W::kIn], out[W::kOut];
#pragma unroll
      for (int i = 0; i < W::kIn; ++i) in[i] = w[i];
      W::chunk(in, out);
      unsigned char* o = dst + row * kOut + part * 4 * W::kOut;
      if constexpr (W::kOut == 4) *reinterpret_cast<uint4*>(o) = make_uint4(out[0], out[1], out[2], out[3]);
      else *reinterpret_cast<uint2*>(o) = make_uint2(out[0], out[1]);
    }
  }
}

// The token-major kernel's ring depth: one stage more for tile pairs (PAIR), two stages with the
// short ring (SHORT), else kStages. The kernel's TileStream and the launch's shared-memory size
// (fast_ring_bytes) both take it from here.
constexpr int tmma_ring_stages(bool pair, bool short_ring) { return pair ? kStages + 1 : short_ring ? 2 : kStages; }
// The ring of the token-major kernel over widened codes (SRC): the short one for 3-bit codes, whose
// three stages beside the widened tile would leave four blocks an SM; three stages for 1-bit codes.
constexpr bool tmma_widen_short(int src) { return src == 3; }

template <int KB, int VB, int META, int GS, bool PAIR = false, bool ONE = false, bool SHORT = false, int SRC = 0>
__global__ void __launch_bounds__(kThreads, kTmmaMinBlocks) attn_tmma_kernel(const AttnParams p, int row0) {
  static_assert(!(PAIR && SHORT), "tile pairs need the lead of two tiles");
  static_assert(SRC == 0 || (widen::widens(SRC) && KB == widen::widened(SRC) && VB == KB && !PAIR),
                "stored codes widened a tile at a time: one tile at a time");
  start_body();
  const std::uint64_t trace_t0 = trace_now();
  extern __shared__ __align__(16) unsigned char ring[];
  constexpr int PV = 8 / VB;
  constexpr unsigned kMaskV = ((1u << VB) - 1u) * 0x01010101u;
  static_assert(VB == 2 || VB == 4, "two value slices per byte pair");
  static_assert(GS == 32 || GS == 64 || GS == 128, "group size");
  constexpr int mb = meta_bytes<META>();
  constexpr int kgs = GS == 32 ? 2 : GS == 64 ? 1 : 0;  // log2 of the metadata groups in a row
  constexpr int kNG = 1 << kgs;                         // metadata groups in a row
  constexpr int spg = GS / 32;                          // k-steps (32 channels) a group
  constexpr int kSets = 4 * VB / 8 * 4;                 // byte sets of 8 bytes in a row: 4 VB
  constexpr int kPairs = PV / 2;                        // slice pairs (n-tiles) per byte set
  // the stage layout from compile-time sizes (D = 128 for keys and values, as run_attention and
  // DeviceCache require; the launch sizes the ring by FastLayout(p), the same): immediate offsets
  constexpr int kMetaRow = kD / GS * mb;
  // SRC: the codes stored at SRC bits (both sides), each tile's widened to KB = VB bits in a buffer
  // of the block's after the ring (tmma_widen_rows) before the warps read them; the stage holds
  // them as stored (lay), the buffer as read (clay). Otherwise clay is lay and the codes are read
  // in the stage.
  constexpr int SK = SRC ? SRC : KB, SV = SRC ? SRC : VB;
  constexpr FastLayout<kFastTile> lay(16 * SK, 16 * SV, kMetaRow, kMetaRow);
  constexpr FastLayout<kFastTile> clay(16 * KB, 16 * VB, kMetaRow, kMetaRow);
  [[maybe_unused]] unsigned char* const wide = ring + tmma_ring_stages(PAIR, SHORT) * lay.stage;
  // With balanced claiming the launch order deals the KV heads round-robin (block l: head
  // l % (B Hkv), split l / (B Hkv)), so that a head's blocks sit at every place on the SMs, which
  // the claims then even out; otherwise a head's splits are consecutive.
  int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (p.balance) {
    const int l = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), heads = gridDim.y * gridDim.z;
    split = l / heads, h = (l % heads) % gridDim.y, b = (l % heads) / gridDim.y;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hkv + h;
  const int* kperm = p.k.perm ? p.k.perm + h * kD : nullptr;
  constexpr int krow = 16 * KB, vrow = 16 * VB;
  const float qscale = p.scale * 1.4426950408889634f;  // log2 units

  // The query loads go out first (thread ch loads channel ch of every row:
  // one permutation load, the rows' loads independent of each other), then
  // the first tiles' copies, then the query setup, which waits for the loads
  // and overlaps the copies. The block's query rows go to shared memory
  // (stored channel order, log2 units), with each row's max |q| and per-k-step
  // sums (warp w: row w).
  static_assert(kThreads == kD, "a thread per channel");
  float qx[kTmmaRows];  // channel threadIdx.x of each row
  {
    const int ch = threadIdx.x, src = kperm ? kperm[ch] : ch;
#pragma unroll
    for (int r = 0; r < kTmmaRows; ++r) {
      bool ok;
      const float* qr = tmma_qrow(p, b, h, row0 + (ONE ? 0 : r), ok);  // ONE: the row in every slot
      qx[r] = ok ? qr[src] : 0.0f;
    }
  }
  const ClaimedTiles<kFastTile, SK, SV, kMetaRow, tmma_ring_stages(PAIR, SHORT)> tiles(p, lay, ring, bh, split);
  tiles.start();
  __shared__ float sq_max[kTmmaRows], sq_sum[kTmmaRows][4];
  __shared__ float sq[kTmmaRows][kD];
#pragma unroll
  for (int r = 0; r < kTmmaRows; ++r) {
    qx[r] *= qscale;
    sq[r][threadIdx.x] = qx[r];
  }
  __syncthreads();
  {
    float mx = 0.0f, sm[4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      sm[ks] = sq[warp][32 * ks + lane];
      mx = fmaxf(mx, fabsf(sm[ks]));
    }
#pragma unroll
    for (int x = 1; x < 32; x *= 2) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) sm[ks] += __shfl_xor_sync(0xffffffffu, sm[ks], x);
    }
    if (lane == 0) {
      sq_max[warp] = mx;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) sq_sum[warp][ks] = sm[ks];
    }
  }
  __syncthreads();
  // Row t (C columns 2t, 2t + 1): its qstep and causal limit.
  const int trow = row0 + (ONE ? 0 : t);
  bool tvalid;
  tmma_qrow(p, b, h, trow, tvalid);
  const float qstep_t = q16_step(sq_max[t]);
  const std::int64_t limit = tvalid ? p.kv_len - p.Sq + trow % p.Sq : -1;
  // Column g of Q^T: row g / 2, its high (g even) or low (g odd) bytes, at the
  // channels of k = 4t + j (slice register 2t) and 16 + 4t + j (2t + 1). Each
  // thread rounds its own channel of the 4 rows once and puts the two bytes
  // where the fragments read them (qwords[row][high, low][k-step][slice
  // register], byte j): one 16-bit split per value instead of one per value
  // and warp.
  __shared__ unsigned qwords[kTmmaRows][2][4][8];
  {
    // thread i fills byte j of slice register r = 2 t + e of k-step ks (tmma_key_channel)
    const int i = threadIdx.x, ks = i / 32, r = (i / 4) % 8, j = i % 4;
    const int c = tmma_key_channel<KB, GS>(ks, r / 2, r % 2, j);
    unsigned char* bytes = reinterpret_cast<unsigned char*>(&qwords[0][0][0][0]);
#pragma unroll
    for (int row = 0; row < kTmmaRows; ++row) {
      int hi, lo;
      q16_split(sq[row][c], q16_step(sq_max[row]), hi, lo);
      bytes[(((row * 2 + 0) * 4 + ks) * 8 + r) * 4 + j] = static_cast<unsigned char>(hi & 0xFF);
      bytes[(((row * 2 + 1) * 4 + ks) * 8 + r) * 4 + j] = static_cast<unsigned char>(lo & 0xFF);
    }
  }
  __syncthreads();
  unsigned qb[4][2];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int e = 0; e < 2; ++e) qb[ks][e] = qwords[g / 2][g & 1][ks][2 * t + e];

  // acc[s][pair][i]: row t, channel (8 s + g) PV + 2 pair + i; lacc per metadata group.
  float m = -INFINITY, l = 0.0f, acc[kSets][kPairs][2], lacc[4];
#pragma unroll
  for (int s = 0; s < kSets; ++s)
#pragma unroll
    for (int q = 0; q < kPairs; ++q) acc[s][q][0] = acc[s][q][1] = 0.0f;
#pragma unroll
  for (int v = 0; v < 4; ++v) lacc[v] = 0.0f;
  const unsigned wsel = (g & 1) ? 0x0040u : 0x0051u;  // low (g odd) or high (g even) byte of two weights

  // The sinks and row t's causal limit as offsets from the block's first token,
  // clamped to int (before the range: -1, past it: 2^30; every tile sees the
  // same masks as with the exact offsets).
  const auto offset = [&](std::int64_t x) {
    const std::int64_t d = x - tiles.t_begin;
    return static_cast<int>(d < 0 ? -1 : d > (1 << 30) ? (1 << 30) : d);
  };
  const int sink_off = offset(p.sinks), limit_off = offset(limit), span = static_cast<int>(tiles.t_end - tiles.t_begin);
  // Row r's q summed over each key metadata group's channels (the lo term of a score), from its
  // per-k-step sums in k-step order; qg: row t's.
  const auto group_sums = [&](int r, float(&x)[4]) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) x[ks / spg] = ks % spg == 0 ? sq_sum[r][ks] : x[ks / spg] + sq_sum[r][ks];
  };
  float qg[4];
  group_sums(t, qg);
  // With fp16 metadata and several key groups a row, the lo term sum_kg klo_kg qg_kg of two tokens
  // and four rows is one fp16 MMA (m16n8k16): A = the tokens' klo as stored (rows g, g + 8; k = the
  // group), B column n = row r = n / 2's qg 2^-e_r split into two fp16 parts (n even: the nearest
  // fp16, odd: the rest), so that C columns 2t and 2t + 1 sum to row t's term times 2^-e_t. 2^e_r is
  // the power of two at or below GS max|q| of row r, a bound on its |qg|: the parts neither overflow
  // nor lose more than 2^-25 2^e_r to subnormals; products are exact, sums fp32 (docs/numerics.md).
  // Lane (g, t) holds B rows k = 2t, 2t + 1 of column g.
  constexpr bool kLoMma = META == 0 && kNG > 1 && !ONE;
  [[maybe_unused]] unsigned qgb = 0u;
  [[maybe_unused]] float lo_scale = 1.0f;  // 2^e_t
  if constexpr (kLoMma) {
    const auto row_exp = [&](int r) {
      return min(max(static_cast<int>((__float_as_uint(sq_max[r] * GS) >> 23) & 0xFFu) - 127, -125), 125);
    };
    lo_scale = __uint_as_float(static_cast<unsigned>(127 + row_exp(t)) << 23);
    const float inv = __uint_as_float(static_cast<unsigned>(127 - row_exp(g / 2)) << 23);
    float qr[4];
    group_sums(g / 2, qr);
    const auto part = [&](float x) {
      x *= inv;
      const __half hi = __float2half_rn(x);
      return g % 2 == 0 ? hi : __float2half_rn(x - __half2float(hi));
    };
    const float x0 = kNG == 4 && t == 1 ? qr[2] : qr[0], x1 = kNG == 4 && t == 1 ? qr[3] : qr[1];
    const __half2 h2 = __halves2half2(part(x0), part(x1));
    if (2 * t < kNG) memcpy(&qgb, &h2, 4);
  }

  // One warp's 32 tokens of each of H tiles (H = 2 with PAIR: two tiles acquired together, their 64
  // tokens sharing one online-softmax step, one weight block per value metadata group and one
  // integer-to-float conversion of each value sum, the MMAs of both accumulating in one register
  // set); FULL: every token is live and unmasked for every row.
  struct Half {
    const unsigned char* stage;
    int lo, hi, live;  // unmasked local tokens [lo, hi]; rows [0, live) hold tokens
  };
  //
  // ONE (one query row a KV head): the row sits in all four slots, so every lane's MMAs give the
  // row's integer sums of its tokens base + 16 mt + 8 i + g; the lane keeps those of token
  // (mt, i) = (t / 2, t % 2) of each tile (its "own" token) and does that token's scalar work alone
  // (score, mask, exponential, value weight: a quarter of the lanes' work without it, where lanes
  // t > 0 had empty rows), the softmax spanning all 32 lanes. The value MMAs stay as they are: every
  // slot's columns hold the row's weights, so lanes t = 0..3 accumulate the same sums.
  auto warp_tile = [&](const Half(&hv)[2], auto halves, auto full) {
    constexpr int H = decltype(halves)::value;
    constexpr bool FULL = decltype(full)::value;
    const int base = warp * 32;
    // tile h's codes (SRC: the widened copy of the one tile; metadata stay in the stage)
    const auto codes = [&](int h) -> const unsigned char* {
      if constexpr (SRC != 0) return wide;
      else return hv[h].stage;
    };
    // The lane's tokens: e = 4 h + 2 mt + i (ONE: e = h, at mt = t / 2, i = t % 2).
    constexpr int kTok = ONE ? H : 4 * H;
    const auto token = [&](int e) {
      const int mt = ONE ? t >> 1 : (e >> 1) & 1, i = ONE ? t & 1 : e & 1;
      return base + 16 * mt + 8 * i + g;
    };
    const auto tile_of = [](int e) { return ONE ? e : e >> 2; };
    // A token's score, qstep sum_kg ksc_kg I_kg + sum_kg klo_kg qg_kg over the key metadata groups
    // (its kNG scales and minima by one vector load each), or -inf where masked.
    // (kLoMma: the lo term comes in as sb_mma)
    const auto token_score = [&](const Half& hf, const int(&Ik)[kNG], int local, [[maybe_unused]] float sb_mma) {
      float ksc[kNG], sa = 0.0f, sb = 0.0f;
      const int mo = (local << kgs) * mb;
      load_meta_row<META, kNG>(hf.stage + lay.ksc + mo, ksc);
#pragma unroll
      for (int kg = 0; kg < kNG; ++kg) sa = fmaf(ksc[kg], static_cast<float>(Ik[kg]), sa);
      if constexpr (kLoMma) {
        sb = sb_mma;
      } else {
        float klo[kNG];
        load_meta_row<META, kNG>(hf.stage + lay.klo + mo, klo);
#pragma unroll
        for (int kg = 0; kg < kNG; ++kg) sb = fmaf(klo[kg], qg[kg], sb);
      }
      const float sc = fmaf(sa, qstep_t, sb);
      return (FULL || (local >= hf.lo && local <= hf.hi)) ? sc : -INFINITY;
    };

    // scores: lane (g, t) gets row t at tokens base + 16 mt + 8 i + g of tile h, in s[4 h + 2 mt + i]
    // (ONE: its own token's, in s[h])
    float s[kTok];
#pragma unroll
    for (int h = 0; h < H; ++h) {
      [[maybe_unused]] int own[kNG];  // ONE: the own token's integer sum of each key metadata group
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        [[maybe_unused]] const unsigned char* stage = hv[h].stage;  // (kLoMma: the key minima)
        const unsigned char* k0 = codes(h) + clay.kc + (base + 16 * mt + g) * krow;
        unsigned sl0[4][2], sl1[4][2];  // rows g (token k0) and g + 8, each k-step's two slices
        if constexpr (tmma_wide_keys<KB, GS>()) {
          tmma_key_slices<KB, GS>(k0, t, sl0);
          tmma_key_slices<KB, GS>(k0 + 8 * krow, t, sl1);
        }
        int c[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          if constexpr (!tmma_wide_keys<KB, GS>()) {
            key_slices<KB>(k0, ks, t, sl0[ks][0], sl0[ks][1]);
            key_slices<KB>(k0 + 8 * krow, ks, t, sl1[ks][0], sl1[ks][1]);
          }
          const unsigned a[4] = {sl0[ks][0], sl1[ks][0], sl0[ks][1], sl1[ks][1]};
          // one metadata group a row: the 4 k-steps accumulate in one chain of MMAs (no integer adds)
          int(&ck)[4] = c[GS == 128 ? 0 : ks];
          if (GS != 128 || ks == 0) ck[0] = ck[1] = ck[2] = ck[3] = 0;
          imma<false, true>(ck, a, qb[ks][0], qb[ks][1]);
        }
        // I[i][kg]: token g + 8 i's integer sum over key metadata group kg (its k-steps' high and
        // low columns)
        int I[2][kNG];
        int hs[2] = {0, 0}, ls[2] = {0, 0};
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          if (ks % spg == 0) hs[0] = hs[1] = ls[0] = ls[1] = 0;
          if (GS != 128 || ks == 0) hs[0] += c[ks][0], ls[0] += c[ks][1], hs[1] += c[ks][2], ls[1] += c[ks][3];
          if ((ks + 1) % spg == 0) {
#pragma unroll
            for (int i = 0; i < 2; ++i) I[i][ks / spg] = hs[i] * 256 + ls[i];
          }
        }
        if constexpr (ONE) {
#pragma unroll
          for (int kg = 0; kg < kNG; ++kg) {
            const int pick = (t & 1) ? I[1][kg] : I[0][kg];
            own[kg] = (mt == 0 || (t >> 1)) ? pick : own[kg];
          }
        } else {
          float sbm[2] = {0.0f, 0.0f};  // kLoMma: the lo terms of tokens g and g + 8
          if constexpr (kLoMma) {
            const unsigned char* lo0 = stage + lay.klo + ((base + 16 * mt + g) << kgs) * mb;
            unsigned a[4] = {0u, 0u, 0u, 0u};
            if (2 * t < kNG) {
              a[0] = *reinterpret_cast<const unsigned*>(lo0 + 4 * t);
              a[1] = *reinterpret_cast<const unsigned*>(lo0 + (8 << kgs) * mb + 4 * t);
            }
            float cl[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma_f16(cl, a, qgb, 0u);
            sbm[0] = (cl[0] + cl[1]) * lo_scale, sbm[1] = (cl[2] + cl[3]) * lo_scale;
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) s[4 * h + 2 * mt + i] = token_score(hv[h], I[i], base + 16 * mt + 8 * i + g, sbm[i]);
        }
      }
      if constexpr (ONE) s[h] = token_score(hv[h], own, token(h), 0.0f);
    }

    // online softmax of row t over the 32 H tokens (its 8 lanes: xor 4, 8, 16; ONE: all 32 lanes)
    float pw[kTok], corr;
    if constexpr (ONE) corr = softmax_step<kTok, 1, 2, 4, 8, 16>(s, m, l, pw);
    else corr = softmax_step<kTok, 4, 8, 16>(s, m, l, pw);
    if (corr != 1.0f) {
#pragma unroll
      for (int v = 0; v < 4; ++v) lacc[v] *= corr;
#pragma unroll
      for (int s2 = 0; s2 < kSets; ++s2)
#pragma unroll
        for (int q = 0; q < kPairs; ++q) acc[s2][q][0] *= corr, acc[s2][q][1] *= corr;
    }

    // Row t's value weights for every value metadata group first (each token's kNG scales and
    // minima by one vector load each; the groups' reductions independent of each other), then W^T:
    // wbg[v][h], with two groups' 16-bit weights sharing each shuffle (the low and high halves of
    // a word). vsw: the block's step (the C columns of this lane are row t's).
    unsigned wbg[kNG][H][2];
    float vsw;
    {
      float u[kNG][kTok], umax[kNG], lsum[kNG];
#pragma unroll
      for (int v = 0; v < kNG; ++v) umax[v] = 0.0f, lsum[v] = 0.0f;
#pragma unroll
      for (int e = 0; e < kTok; ++e) {
        const Half& hf = hv[tile_of(e)];
        const int local = token(e);
        const int mo = (local << kgs) * mb;
        float vs[kNG], vl[kNG];
        if (FULL || local < hf.live) {
          load_meta_row<META, kNG>(hf.stage + lay.vsc + mo, vs);
          load_meta_row<META, kNG>(hf.stage + lay.vlo + mo, vl);
        } else {  // stale rows: weight 0 either way, but their metadata could be NaN
#pragma unroll
          for (int v = 0; v < kNG; ++v) vs[v] = vl[v] = 0.0f;
        }
#pragma unroll
        for (int v = 0; v < kNG; ++v) {
          u[v][e] = pw[e] * vs[v];
          umax[v] = fmaxf(umax[v], u[v][e]);
          lsum[v] = fmaf(pw[e], vl[v], lsum[v]);
        }
      }
#pragma unroll
      for (int v = 0; v < kNG; ++v) lacc[v] += lsum[v];
      // one step for all groups of the block: the rounding bound is in terms of the largest
      // weight of any group (docs/numerics.md), and one reduction serves them all
      float um = umax[0];
#pragma unroll
      for (int v = 1; v < kNG; ++v) um = fmaxf(um, umax[v]);
#pragma unroll
      for (int x = ONE ? 1 : 4; x <= 16; x *= 2) um = fmaxf(um, __shfl_xor_sync(0xffffffffu, um, x));
      const W16 w16 = w16_fast(um);
      vsw = w16.step;
      // W^T column g (row g / 2). Token 8 j + x is held by lane (x, row) as its e = 4 h + j (ONE: by
      // lane (x, j) as its e = h). With the value codes by ldmatrix k = 4 t + j is token
      // 2 t + j % 2 + 8 (j / 2) and k = 16 + 4 t + j that + 16 (rows 2t, 2t + 1 of the first two
      // matrices, then of the last two).
      const auto src_lane = [&](int j, bool second) {
        return 4 * (2 * t + j % 2) + (ONE ? (second ? 2 : 0) + j / 2 : g / 2);
      };
      const auto src_reg = [](int j, bool second) { return ONE ? 0 : (second ? 2 : 0) + j / 2; };
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int v0 = 0; v0 < kNG; v0 += 2) {
          const int v1 = kNG > 1 ? v0 + 1 : v0;
          unsigned r[4];
#pragma unroll
          for (int j = 0; j < (ONE ? 1 : 4); ++j) {
            const int e = ONE ? h : 4 * h + j;
            const unsigned r0 = w16.round_low16(u[v0][e]);  // pick_bytes4 takes bytes 0, 1
            r[j] = kNG > 1 ? __byte_perm(r0, w16.round_low16(u[v1][e]), 0x5410) : r0;
          }
          unsigned a0[4], a1[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            a0[j] = __shfl_sync(0xffffffffu, r[src_reg(j, false)], src_lane(j, false));
            a1[j] = __shfl_sync(0xffffffffu, r[src_reg(j, true)], src_lane(j, true));
          }
          wbg[v0][h][0] = pick_bytes4(a0[0], a0[1], a0[2], a0[3], wsel);
          wbg[v0][h][1] = pick_bytes4(a1[0], a1[1], a1[2], a1[3], wsel);
          if constexpr (kNG > 1) {  // the high halves: bytes 2 and 3
            wbg[v1][h][0] = pick_bytes4(a0[0], a0[1], a0[2], a0[3], wsel + 0x0022u);
            wbg[v1][h][1] = pick_bytes4(a1[0], a1[1], a1[2], a1[3], wsel + 0x0022u);
          }
        }
    }

    // values, one byte set (8 bytes of the row: 8 / VB * 8 channels, inside one metadata group) at a time
    unsigned vspan[H][4];  // ldmatrix: b16 column g of a 16-byte span, 32 tokens
#pragma unroll
    for (int set = 0; set < kSets; ++set) {
      const int vgrp = tmma_vgroup<GS, VB>(set);
      // V^T rows g / g + 8: byte tmma_vbyte(set, g) of the row, slices 2 q and 2 q + 1, at the tokens
      // of k = 4 t + j (x[h][0]) and k = 16 + 4 t + j (x[h][1]) (see the weights above)
      unsigned x[H][2];
#pragma unroll
      for (int h = 0; h < H; ++h) {
        // span set / 2 of the warp's 32 rows (lane l: row base + l), once for sets 2s and 2s + 1;
        // byte 2g + set % 2 of rows 2t, 2t + 1, 8 + 2t, 9 + 2t (and 16 more)
        if (set % 2 == 0) {
          ldsm_x4_trans(codes(h) + clay.vc + (base + lane) * vrow + 16 * (set / 2), vspan[h]);
          if constexpr (tmma_swap_values<GS, VB>()) {  // the sets' registers, by tmma_vbyte's trade
            unsigned y[4];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              const unsigned even = __byte_perm(vspan[h][2 * u], vspan[h][2 * u + 1], 0x6420);
              const unsigned odd = __shfl_xor_sync(0xffffffffu, __byte_perm(vspan[h][2 * u], vspan[h][2 * u + 1], 0x7531), 16);
              y[u] = g < 4 ? even : odd, y[2 + u] = g < 4 ? odd : even;
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) vspan[h][u] = y[u];
          }
        }
        if constexpr (tmma_swap_values<GS, VB>()) {
          x[h][0] = vspan[h][2 * (set % 2)], x[h][1] = vspan[h][2 * (set % 2) + 1];
        } else {
          const unsigned sel = set % 2 ? 0x7531u : 0x6420u;
          x[h][0] = __byte_perm(vspan[h][0], vspan[h][1], sel), x[h][1] = __byte_perm(vspan[h][2], vspan[h][3], sel);
        }
      }
#pragma unroll
      for (int q = 0; q < kPairs; ++q) {
        const unsigned m0 = kMaskV << (2 * q * VB), m1 = kMaskV << ((2 * q + 1) * VB);
        int c[4] = {0, 0, 0, 0};
#pragma unroll
        for (int h = 0; h < H; ++h) {
          const unsigned a[4] = {x[h][0] & m0, x[h][0] & m1, x[h][1] & m0, x[h][1] & m1};
          imma<false, false>(c, a, wbg[vgrp][h][0], wbg[vgrp][h][1]);
        }
        // C: c0 / c1 = channel of slice 2q, row t high / low; c2 / c3 = slice 2q + 1 (in units of
        // the slice's place value, 2^(slice VB): applied once, at the merge)
        acc[set][q][0] = fmaf(vsw, static_cast<float>(c[0] * 256 + c[1]), acc[set][q][0]);
        acc[set][q][1] = fmaf(vsw, static_cast<float>(c[2] * 256 + c[3]), acc[set][q][1]);
      }
    }
  };

  // The tiles in which this warp's 32 tokens are all past the sinks, before every row's causal
  // limit and before the range's end: [full_lo, full_hi] (warp-uniform). With tb = 128 tile and
  // base = 32 warp, a tile's masks (below) keep all 32 when sink_off <= tb + base and
  // tb + base + 31 <= min(limit_off, span - 1).
  int full_lo, full_hi;
  {
    const int base = warp * 32, x = sink_off - base, y = min(limit_off - 31, span - 32) - base;
    full_lo = __reduce_max_sync(0xffffffffu, x <= 0 ? 0 : (x + kFastTile - 1) / kFastTile);
    full_hi = __reduce_min_sync(0xffffffffu, y < 0 ? -1 : y / kFastTile);
  }
  const auto masked = [&](const unsigned char* stage, int tile) {
    const int tb = tile * kFastTile;
    const int live = min(span - tb, kFastTile);
    const auto rel = [tb](int x) { return x < tb ? -1 : min(x - tb, kFastTile); };
    return Half{stage, rel(sink_off), min(rel(limit_off), live - 1), live};
  };
  // (tile indices are the KV head's: ClaimedTiles)
  const std::uint64_t trace_tq = trace_now();
  [[maybe_unused]] std::uint64_t trace_tf = 0;
  [[maybe_unused]] unsigned trace_tiles = 0;
  for (;;) {
    int tile;
    const unsigned char* stage = tiles.next(tile);
    if (tile < 0) break;
    if constexpr (kTrace) {
      if (trace_tiles == 0) trace_tf = trace_now();
      ++trace_tiles;
    }
    if constexpr (PAIR) {
      int tile1;
      const unsigned char* s1 = tiles.next(tile1);
      if constexpr (kTrace) trace_tiles += tile1 >= 0 ? 1u : 0u;
      if (tile1 >= 0) {
        if (tile >= full_lo && tile <= full_hi && tile1 >= full_lo && tile1 <= full_hi) {
          const Half hv[2] = {{stage, 0, kFastTile - 1, kFastTile}, {s1, 0, kFastTile - 1, kFastTile}};
          warp_tile(hv, std::integral_constant<int, 2>{}, std::true_type{});
        } else {
          const Half hv[2] = {masked(stage, tile), masked(s1, tile1)};
          warp_tile(hv, std::integral_constant<int, 2>{}, std::false_type{});
        }
        continue;
      }
    }
    if constexpr (SRC != 0) {  // this warp's 32 rows of the tile, keys and values, widened
      tmma_widen_rows<SRC>(stage + lay.kc, stage + lay.vc, wide + clay.kc, wide + clay.vc, warp * 32, lane);
      __syncwarp();
    }
    if (tile >= full_lo && tile <= full_hi) {
      const Half hv[2] = {{stage, 0, kFastTile - 1, kFastTile}, {stage, 0, kFastTile - 1, kFastTile}};
      warp_tile(hv, std::integral_constant<int, 1>{}, std::true_type{});
    } else {
      const Half hv[2] = {masked(stage, tile), masked(stage, tile)};
      warp_tile(hv, std::integral_constant<int, 1>{}, std::false_type{});
    }
  }

  const std::uint64_t trace_t1 = trace_now();
  // merge the 4 warps in shared memory; one partial per row
  __shared__ float sm_m[4][kTmmaRows], sm_l[4][kTmmaRows];
  // The warps' accumulators in the ring: every copy into it has landed (the
  // last acquire waited for all but the empty groups committed after it) and
  // no warp reads a stage any more after this barrier.
  cp_async_wait_all();
  __syncthreads();
  float(&sm_acc)[4][kTmmaRows][kD] = *reinterpret_cast<float(*)[4][kTmmaRows][kD]>(ring);
#pragma unroll
  for (int x = ONE ? 1 : 4; x <= 16; x *= 2) {  // ONE: every lane's own tokens
    l += __shfl_xor_sync(0xffffffffu, l, x);
#pragma unroll
    for (int v = 0; v < 4; ++v) lacc[v] += __shfl_xor_sync(0xffffffffu, lacc[v], x);
  }
  if (g == 0) sm_m[warp][t] = m, sm_l[warp][t] = l;
#pragma unroll
  for (int set = 0; set < kSets; ++set)
#pragma unroll
    for (int q = 0; q < kPairs; ++q)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int ch = tmma_vbyte<GS, VB>(set, g) * PV + 2 * q + i;
        const float place = pow2_neg((2 * q + i) * VB);
        sm_acc[warp][t][ch] = fmaf(acc[set][q][i], place, lacc[tmma_vgroup<GS, VB>(set)]);
      }
  __syncthreads();
  store_merged(p, b, h, row0, split, 4, kTmmaRows, &sm_m[0][0], &sm_l[0][0], &sm_acc[0][0][0], kD);
  trace_block(trace::kBody, trace_t0, trace_t1, trace_tq, trace_tf, trace_tiles);
}

// ---- tensor-core kernel for the packed body ----
//
// Same tiles and cp.async ring as attn_fast_kernel, but each warp takes 16
// tokens of a 64-token tile and runs both products on the tensor cores
// (mma.sync m16n8k16, fp16 inputs, fp32 accumulation), for up to 8 query rows
// of the KV head:
//   S[query][token] = Q[query][channel] . K^T[channel][token]   (per metadata group)
//   O[query][channel] += (P * v_scale)[query][token] . V[token][channel]
// Codes become exact fp16 pairs with one shift, one LOP3 and one HSUB2:
// (w >> s) & mask | 0x6400.6400 is {1024 + c1, 1024 + c2}. Which channels share
// a pair differs for K (two channels of one token: the channel order of a dot
// product is free, so q is laid out to match) and V (one channel of two tokens:
// __byte_perm brings the two rows' bytes together). q and p are rounded to fp16,
// as FlashAttention does, so results carry fp16-level rounding (docs/numerics.md).
constexpr int kMmaMaxGroups = 4;

// {c(bits s..), c(bits s+16..)} of x as an exact fp16 pair.
template <int B>
__device__ __forceinline__ unsigned code_pair(unsigned x, int s) {
  constexpr unsigned kMask = ((1u << B) - 1u) * 0x00010001u;
  const unsigned h = ((x >> s) & kMask) | 0x64006400u;
  const __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&h), __half2(__float2half(1024.0f), __float2half(1024.0f)));
  return *reinterpret_cast<const unsigned*>(&v);
}

template <int B>
struct PairMap {  // pair p of a row: two channels of one 32-bit word
  static constexpr int kW = 32 / B;  // codes per word
  __device__ static int word(int p) { return p / (kW / 2); }
  __device__ static int shift(int p) { return B * (p % (kW / 2)); }
  __device__ static int ch_lo(int p) { return kW * word(p) + p % (kW / 2); }
  __device__ static int ch_hi(int p) { return ch_lo(p) + kW / 2; }
};

template <int KB, int VB, int META>
__global__ void __launch_bounds__(kThreads) attn_mma_kernel(const AttnParams p, int row0) {
  start_body();
  extern __shared__ __align__(16) unsigned char ring[];
  const FastLayout<kMmaTile> lay(p);
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int gid = lane / 4, tig = lane % 4;
  const int G = p.Hq / p.Hkv, n_rows = p.query_rows(), mb = p.meta_bytes;
  const int Gk = p.k.G, Gv = p.v.G, gsz = p.group;
  const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hkv + h;
  const int* kperm = p.k.perm ? p.k.perm + h * kD : nullptr;

  // This lane's query row (gid): A fragments of Q (rows gid; rows gid+8 are zero) per k-step.
  const int qr = row0 + gid;
  const bool qvalid = gid < 8 && qr < n_rows;
  const int gq = qvalid ? qr / p.Sq : 0, qi = qvalid ? qr % p.Sq : 0;
  const float* qrow = p.q + ((static_cast<std::int64_t>(b) * p.Hq + h * G + gq) * p.Sq + qi) * kD;
  const std::int64_t limit = qvalid ? p.kv_len - p.Sq + qi : -1;
  const float qscale = p.scale * 1.4426950408889634f;  // log2 units
  auto qv = [&](int ch) { return qvalid ? qrow[kperm ? kperm[ch] : ch] * qscale : 0.0f; };
  unsigned qa[8][2];  // [k-step][a0, a2]
  float qsum[kMmaMaxGroups] = {0, 0, 0, 0};  // sum of this row's (fp16-rounded) q per key group
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int p0 = 8 * i + tig, p1 = 8 * i + 4 + tig;
    qa[i][0] = pack_half2(qv(PairMap<KB>::ch_lo(p0)), qv(PairMap<KB>::ch_hi(p0)));
    qa[i][1] = pack_half2(qv(PairMap<KB>::ch_lo(p1)), qv(PairMap<KB>::ch_hi(p1)));
  }
  // qsum per group, from the same fp16 values (every channel once across the quad)
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 f0 = __half22float2(*reinterpret_cast<const __half2*>(&qa[i][0]));
    const float2 f1 = __half22float2(*reinterpret_cast<const __half2*>(&qa[i][1]));
    const int g = (KB == 1 ? PairMap<KB>::ch_lo(8 * i) : 16 * i) / gsz;
#pragma unroll
    for (int gg = 0; gg < kMmaMaxGroups; ++gg) qsum[gg] += gg == g ? f0.x + f0.y + f1.x + f1.y : 0.0f;
  }
#pragma unroll
  for (int g = 0; g < kMmaMaxGroups; ++g) {
    qsum[g] += __shfl_xor_sync(0xffffffffu, qsum[g], 1);
    qsum[g] += __shfl_xor_sync(0xffffffffu, qsum[g], 2);
  }

  float o[16][2];  // O[row gid][channels 8c + 2tig, +1] (values' permuted order)
#pragma unroll
  for (int c = 0; c < 16; ++c) o[c][0] = o[c][1] = 0.0f;
  float m = -INFINITY, l = 0.0f, lo_acc[kMmaMaxGroups] = {0, 0, 0, 0};

  const TileStream<kMmaTile, KB, VB> tiles(p, lay, ring, bh, split);
  tiles.start();
  constexpr int kRowWordsK = 128 * KB / 32, kRowWordsV = 128 * VB / 32;
  for (int tile = 0; tile < tiles.n_tiles; ++tile) {
    const unsigned char* stage = tiles.acquire(tile);
    const std::int64_t t0 = tiles.first_token(tile) + 16 * warp;  // this warp's 16 tokens
    const int l0 = 16 * warp;  // their first row in the stage

    // ---- S = Q K^T, one accumulator set per key group; two n-tiles of 8 tokens
    float sacc[kMmaMaxGroups][2][4];
#pragma unroll
    for (int g = 0; g < kMmaMaxGroups; ++g)
#pragma unroll
      for (int n = 0; n < 2; ++n) sacc[g][n][0] = sacc[g][n][1] = sacc[g][n][2] = sacc[g][n][3] = 0.0f;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      unsigned kw[kRowWordsK];  // the token's whole row, compile-time indexed
      const uint4* src = reinterpret_cast<const uint4*>(stage + lay.kc + (l0 + 8 * n + gid) * p.k.row_bytes);
#pragma unroll
      for (int v = 0; v < kRowWordsK / 4; ++v) {
        const uint4 x = src[v];
        kw[4 * v] = x.x, kw[4 * v + 1] = x.y, kw[4 * v + 2] = x.z, kw[4 * v + 3] = x.w;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        unsigned b0, b1;
        if constexpr (KB == 8) {  // pairs 8i + tig, 8i + 4 + tig: words 4i + tig / 2 and 4i + 2 + tig / 2
          b0 = code_pair<KB>(tig >= 2 ? kw[4 * i + 1] : kw[4 * i], 8 * (tig % 2));
          b1 = code_pair<KB>(tig >= 2 ? kw[4 * i + 3] : kw[4 * i + 2], 8 * (tig % 2));
        } else {
          constexpr int kHalf = 16 / KB;  // pairs per word
          b0 = code_pair<KB>(kw[(8 * i) / kHalf], KB * ((8 * i) % kHalf) + KB * tig);
          b1 = code_pair<KB>(kw[(8 * i + 4) / kHalf], KB * ((8 * i + 4) % kHalf) + KB * tig);
        }
        const unsigned a[4] = {qa[i][0], 0u, qa[i][1], 0u};
        const int g = (KB == 1 ? PairMap<KB>::ch_lo(8 * i) : 16 * i) / gsz;
#pragma unroll
        for (int gg = 0; gg < kMmaMaxGroups; ++gg) {
          if (gg == g) mma_f16(sacc[gg][n], a, b0, b1);
        }
      }
    }
    // scores of this lane: row gid, tokens 8n + 2tig + e
    float sc[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int local = l0 + 8 * n + 2 * tig + e;
        float v = 0.0f;
#pragma unroll
        for (int g = 0; g < kMmaMaxGroups; ++g) {
          if (g >= Gk) break;
          const int mo = (local * Gk + g) * mb;
          v += load_meta(stage + lay.ksc + mo, META) * sacc[g][n][e] + load_meta(stage + lay.klo + mo, META) * qsum[g];
        }
        const std::int64_t t = t0 + 8 * n + 2 * tig + e;
        sc[n][e] = (t >= p.sinks && t <= limit) ? v : -INFINITY;
      }
    // ---- online softmax of row gid across the quad
    float mt = fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1]));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float mnew = fmaxf(m, mt);
    float pr[2][2] = {{0, 0}, {0, 0}};
    if (mnew != -INFINITY) {
      const float corr = fast_exp2(m - mnew);
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) pr[n][e] = fast_exp2(sc[n][e] - mnew);
      l = l * corr + pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1];
      if (corr != 1.0f) {
#pragma unroll
        for (int c = 0; c < 16; ++c) o[c][0] *= corr, o[c][1] *= corr;
#pragma unroll
        for (int g = 0; g < kMmaMaxGroups; ++g) lo_acc[g] *= corr;
      }
      m = mnew;
    }
    // ---- O += (P * v_scale) V, per value group; lo terms on the side
    // rows of tokens 2tig, 2tig+1, 2tig+8, 2tig+9, compile-time indexed
    unsigned vw[4][kRowWordsV];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint4* src = reinterpret_cast<const uint4*>(stage + lay.vc + (l0 + 2 * tig + (r & 1) + 8 * (r >> 1)) * p.v.row_bytes);
#pragma unroll
      for (int v = 0; v < kRowWordsV / 4; ++v) {
        const uint4 x = src[v];
        vw[r][4 * v] = x.x, vw[r][4 * v + 1] = x.y, vw[r][4 * v + 2] = x.z, vw[r][4 * v + 3] = x.w;
      }
    }
    // This lane's channel in value tile c is 8c + gid: its byte k in the word and
    // bit shift depend on gid only (and on c's parity for 2 bits).
    constexpr int kCpb = 8 / VB;  // codes per byte
#pragma unroll
    for (int g = 0; g < kMmaMaxGroups; ++g) {
      if (g >= Gv) break;
      float ps[2][2];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int mo = ((l0 + 8 * n + 2 * tig + e) * Gv + g) * mb;
          ps[n][e] = pr[n][e] * load_meta(stage + lay.vsc + mo, META);
          lo_acc[g] += pr[n][e] * load_meta(stage + lay.vlo + mo, META);
        }
      const unsigned a[4] = {pack_half2(ps[0][0], ps[0][1]), 0u, pack_half2(ps[1][0], ps[1][1]), 0u};
#pragma unroll
      for (int c = 0; c < 16; ++c) {
        if (8 * c / gsz != g) continue;
        // channel ch = 8c + gid: byte ch / kCpb of the row = word (ch / kCpb) / 4, byte k, shift
        int word_lo, k, sh;
        if constexpr (VB == 8) {
          word_lo = 2 * c;  // word 2c + gid / 4
          k = gid % 4, sh = 0;
        } else {
          word_lo = (8 * c) / (4 * kCpb);
          k = ((8 * c) % (4 * kCpb) + gid) / kCpb;
          sh = VB * (gid % kCpb);
        }
        const unsigned sel = static_cast<unsigned>(k | (k << 4) | ((k + 4) << 8) | ((k + 4) << 12));
        unsigned w0, w1, w2, w3;
        if constexpr (VB == 8) {
          const bool hi = gid >= 4;
          w0 = hi ? vw[0][word_lo + 1] : vw[0][word_lo];
          w1 = hi ? vw[1][word_lo + 1] : vw[1][word_lo];
          w2 = hi ? vw[2][word_lo + 1] : vw[2][word_lo];
          w3 = hi ? vw[3][word_lo + 1] : vw[3][word_lo];
        } else {
          w0 = vw[0][word_lo], w1 = vw[1][word_lo], w2 = vw[2][word_lo], w3 = vw[3][word_lo];
        }
        const unsigned b0 = code_pair<VB>(__byte_perm(w0, w1, sel), sh);
        const unsigned b1 = code_pair<VB>(__byte_perm(w2, w3, sel), sh);
        float cc[4] = {o[c][0], o[c][1], 0.0f, 0.0f};
        mma_f16(cc, a, b0, b1);
        o[c][0] = cc[0], o[c][1] = cc[1];
      }
    }
  }
  // ---- merge the 4 warps: per row gid: m, l (quad sums), o + lo terms
  l = quad_sum(l);
#pragma unroll
  for (int g = 0; g < kMmaMaxGroups; ++g) lo_acc[g] = quad_sum(lo_acc[g]);
  __shared__ float wm[4][8], wl[4][8], wo[4][8][kD];
  if (tig == 0) wm[warp][gid] = m, wl[warp][gid] = l;
#pragma unroll
  for (int c = 0; c < 16; ++c)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int ch = 8 * c + 2 * tig + e;
      float lo_g = 0.0f;
#pragma unroll
      for (int g = 0; g < kMmaMaxGroups; ++g) lo_g = g == ch / gsz ? lo_acc[g] : lo_g;
      wo[warp][gid][ch] = o[c][e] + lo_g;
    }
  __syncthreads();
  store_merged(p, b, h, row0, split, 4, 8, &wm[0][0], &wl[0][0], &wo[0][0][0], kD);
}

// SKVQ_CUDA_PDL=0: the combine kernel launched after the body kernel as on
// GPUs before compute capability 9.0 (tests of that path, benchmarks).
bool dependent_launch_disabled() {
  static const bool off = env_switch("SKVQ_CUDA_PDL") == "0";
  return off;
}

// Programmatic dependent launch needs compute capability 9.0 (checked once per device).
bool dependent_launch_supported() {
  static std::mutex mu;
  static std::map<int, bool> known;
  const int dev = current_device();
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(dev);
  if (it != known.end()) return it->second;
  int major = 0;
  SKVQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return known[dev] = major >= 9 && !dependent_launch_disabled();
}

// SKVQ_CUDA_BODY_PDL=0: the body kernels launched after the stream's earlier work has ended, as
// before session 39 (benchmarks, tests); SKVQ_CUDA_PDL=0 turns it off too.
bool body_dependent_launch() {
  static const bool off = env_switch("SKVQ_CUDA_BODY_PDL") == "0";
  return !off && dependent_launch_supported();
}
// Launches kernel on `stream`; with `dependent`, as a programmatic dependent of the stream's
// previous kernel (compute capability 9.0), which the kernel must wait for itself
// (griddepcontrol.wait) before it reads what that kernel wrote.
template <typename... P, typename... A>
void launch_on(void (*kernel)(P...), dim3 grid, dim3 block, int smem, cudaStream_t stream, bool dependent, A&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = static_cast<std::size_t>(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = dependent ? 1 : 0;
  SKVQ_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
}
// Launches a pipelined body kernel, a programmatic dependent of the stream's previous work where
// the device allows (start_body).
template <typename K>
void launch_body(K kernel, dim3 grid, int smem, cudaStream_t stream, const AttnParams& p, int row) {
  launch_on(kernel, grid, dim3(kThreads), smem, stream, body_dependent_launch(), p, row);
}

template <int KB, int VB>
void launch_mma_rows(const AttnParams& p, int splits, cudaStream_t stream) {
  const int n_rows = p.query_rows();
  const dim3 grid(splits, p.Hkv, p.B);
  const int smem = kStages * FastLayout<kMmaTile>(p).stage;
  for (int row = 0; row < n_rows; row += 8) {
    auto go = [&](auto kernel) {
      allow_smem(kernel, smem);
      launch_body(kernel, grid, smem, stream, p, row);
    };
    if (p.meta == 0) go(attn_mma_kernel<KB, VB, 0>);
    else if (p.meta == 1) go(attn_mma_kernel<KB, VB, 1>);
    else go(attn_mma_kernel<KB, VB, 2>);
  }
}

// Max or sum over the 128 threads of a combine block (4 warps): shuffles,
// then the 4 warps' results through shared memory.
template <bool MAX>
__device__ __forceinline__ float combine_reduce(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, w) : v + w;
  }
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = MAX ? fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3])) : (red[0] + red[1]) + (red[2] + red[3]);
  __syncthreads();
  return v;
}

// The exact tokens of one query row (the sinks [0, sinks) and the tail
// [q_end, kv_len)) in float32, in the channels' stored (original) order:
// lane l holds channels 4l..4l+3, warp w takes the row's exact tokens w,
// w + 4, ..., 8 at a time (loads in flight together). Returns the row's
// max and sum (log2 units) and leaves its accumulators (not divided) in
// ex_acc[0][*]; every thread of the block must call it.
constexpr int kExactStep = 8;  // tokens a warp takes per online-softmax step
__device__ __forceinline__ void exact_row(const AttnParams& p, std::int64_t qrow, std::int64_t bh, std::int64_t limit,
                                          float (&ex_m)[kD / 32], float (&ex_l)[kD / 32], float (&ex_acc)[kD / 32][kD],
                                          float& M, float& L) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float qsc = p.scale * 1.4426950408889634f;  // log2 units
  const float4 qv = __ldg(reinterpret_cast<const float4*>(p.q + qrow * kD) + lane);
  const float q[4] = {qv.x * qsc, qv.y * qsc, qv.z * qsc, qv.w * qsc};
  const std::int64_t n_sinks = p.sinks, n = n_sinks + (p.kv_len - p.q_end);
  float m = -INFINITY, l = 0.0f, a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (std::int64_t e0 = warp; e0 < n; e0 += 4 * kExactStep) {
    float s[kExactStep];
    uint2 vraw[kExactStep];
#pragma unroll
    for (int u = 0; u < kExactStep; ++u) {
      const std::int64_t e = e0 + 4 * u;
      const bool in = e < n;
      const std::int64_t t = e < n_sinks ? e : p.q_end + (e - n_sinks);
      const std::int64_t off = (e < n_sinks ? bh * p.sinks + e : bh * p.window + (e - n_sinks)) * kD + 4 * lane;
      const __half* kr = (e < n_sinks ? p.k.sinks : p.k.tail) + off;
      const __half* vr = (e < n_sinks ? p.v.sinks : p.v.tail) + off;
      uint2 kraw = make_uint2(0u, 0u);
      vraw[u] = make_uint2(0u, 0u);
      if (in) kraw = __ldg(reinterpret_cast<const uint2*>(kr)), vraw[u] = __ldg(reinterpret_cast<const uint2*>(vr));
      const float2 k01 = __half22float2(*reinterpret_cast<const __half2*>(&kraw.x));
      const float2 k23 = __half22float2(*reinterpret_cast<const __half2*>(&kraw.y));
      float d = fmaf(q[0], k01.x, fmaf(q[1], k01.y, fmaf(q[2], k23.x, q[3] * k23.y)));
#pragma unroll
      for (int x = 16; x > 0; x >>= 1) d += __shfl_xor_sync(0xffffffffu, d, x);
      s[u] = (in && t <= limit) ? d : -INFINITY;
    }
    float mt = s[0];
#pragma unroll
    for (int u = 1; u < kExactStep; ++u) mt = fmaxf(mt, s[u]);
    const float mnew = fmaxf(m, mt);
    if (mnew == -INFINITY) continue;  // uniform over the warp
    const float corr = fast_exp2(m - mnew);
    l *= corr;
#pragma unroll
    for (int c = 0; c < 4; ++c) a[c] *= corr;
#pragma unroll
    for (int u = 0; u < kExactStep; ++u) {
      const float w = fast_exp2(s[u] - mnew);
      const float2 v01 = __half22float2(*reinterpret_cast<const __half2*>(&vraw[u].x));
      const float2 v23 = __half22float2(*reinterpret_cast<const __half2*>(&vraw[u].y));
      l += w;
      a[0] = fmaf(w, v01.x, a[0]), a[1] = fmaf(w, v01.y, a[1]), a[2] = fmaf(w, v23.x, a[2]), a[3] = fmaf(w, v23.y, a[3]);
    }
    m = mnew;
  }
  if (lane == 0) ex_m[warp] = m, ex_l[warp] = l;
#pragma unroll
  for (int c = 0; c < 4; ++c) ex_acc[warp][4 * lane + c] = a[c];
  __syncthreads();
  M = fmaxf(fmaxf(ex_m[0], ex_m[1]), fmaxf(ex_m[2], ex_m[3]));
  L = 0.0f;
  float A = 0.0f;
  if (M != -INFINITY) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float wt = fast_exp2(ex_m[w] - M);  // exp2(-inf) = 0 for a warp that saw nothing
      L = fmaf(ex_l[w], wt, L);
      A = fmaf(ex_acc[w][threadIdx.x], wt, A);
    }
  }
  __syncthreads();
  ex_acc[0][threadIdx.x] = A;
  __syncthreads();
}

// One block per query row: the splits' maxima and weights in shared memory
// first (any number of splits), then each thread sums one channel over the
// splits, kU independent (predicated) loads in flight at a time, the first kU
// issued before the weights (with 4 at a time, 66 splits took ~11 us: one
// memory latency per 4). kU is 64 where there are more than
// kCombineFewSplits splits (at most 102 registers: five blocks an SM; with a
// minimum of one block ptxas took 142), else 16 with at most 64 registers
// (eight blocks an SM: more of them fit beside the pipelined kernel's last
// blocks and after them; B=32 Hkv=8 has 1024 rows). EXACT: the row's sinks
// and tail enter here as one more part, attended before the wait for the
// pipelined kernel (exact_row), so that they overlap it.
constexpr int kCombineFewSplits = 16;
constexpr int kCombineManyLoads = 64;  // kU where there are more splits
template <bool EXACT, int kU>
__global__ void __launch_bounds__(kD, kU <= kCombineFewSplits ? 8 : 5) combine_kernel(const AttnParams p, const int* vperm_all, void* out) {
  extern __shared__ float sw[];  // [splits] weights exp2(m_s - M)
  __shared__ float red[kD / 32];
  static_assert(kD == 128, "4 warps a block");
  const std::int64_t qrow = blockIdx.x;  // (b * Hq + hq) * Sq + i
  const int hq = static_cast<int>((qrow / p.Sq) % p.Hq), h = hq / (p.Hq / p.Hkv);
  const int j = threadIdx.x;
  const std::uint64_t trace_t0 = trace_now();
  // (masked: a permutation read before the cache's first flush has written it, by a call not ordered
  // after the append, must not send the store outside the row; a valid one is unchanged)
  const int dst = vperm_all ? vperm_all[h * kD + j] & (kD - 1) : j;
  float Me = -INFINITY, Le = 0.0f, Ae = 0.0f;  // the exact tokens' part (none without EXACT)
  if constexpr (EXACT) {
    __shared__ float ex_m[kD / 32], ex_l[kD / 32], ex_acc[kD / 32][kD];
    const std::int64_t b = qrow / (static_cast<std::int64_t>(p.Sq) * p.Hq);
    const std::int64_t limit = p.kv_len - p.Sq + qrow % p.Sq;
    exact_row(p, qrow, b * p.Hkv + h, limit, ex_m, ex_l, ex_acc, Me, Le);
    Ae = ex_acc[0][dst];
  }
  wait_prerequisites();
  // every body block is done: the next step's claims start from zero (counters of this call only)
  if (j == 0 && qrow < p.n_claims) p.claims[qrow] = 0u;
  const std::uint64_t trace_t1 = trace_now();
  const float* ms = p.ws_m + qrow * p.splits;
  const float* ls = p.ws_l + qrow * p.splits;
  const float* acc = p.ws_acc + qrow * p.splits * kD + j;
  // The first kU splits' partial sums go out before the weights are known,
  // with the maxima and sums, so that one memory latency covers them all
  // (up to kU splits; one more per kU after).
  float x[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) x[u] = u < p.splits ? acc[u * kD] : 0.0f;
  float M = Me;
  for (int s = j; s < p.splits; s += kD) {
    M = fmaxf(M, ms[s]);
    sw[s] = ls[s];
  }
  M = combine_reduce<true>(M, red);
  float L = 0.0f;
  for (int s = j; s < p.splits; s += kD) {  // (sw[s] is this thread's own)
    const float w = ms[s] == -INFINITY ? 0.0f : fast_exp2(ms[s] - M);
    L += sw[s] * w;
    sw[s] = w;
  }
  L = combine_reduce<false>(L, red);  // (its barrier also publishes sw)
  const float we = Me == -INFINITY ? 0.0f : fast_exp2(Me - M);
  L = fmaf(Le, we, L);
  float A[4] = {Ae * we, 0.0f, 0.0f, 0.0f};
  for (int s = 0; s < p.splits; s += kU) {
    if (s > 0) {
#pragma unroll
      for (int u = 0; u < kU; ++u) x[u] = s + u < p.splits ? acc[(s + u) * kD] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) A[u % 4] = fmaf(x[u], s + u < p.splits ? sw[s + u] : 0.0f, A[u % 4]);
  }
  store_out(p, out, qrow * kD + dst, ((A[0] + A[1]) + (A[2] + A[3])) / L);
  trace_block(trace::kCombine, trace_t0, trace_t1);
}

// Which pipelined kernel takes the packed body. The integer tensor-core
// kernels need value n-tiles inside one metadata group (groups of 32, 64 or
// 128 channels); the token-major one also values of 2 or 4 bits.
// The one-token-per-lane dp4a kernel needs groups of whole lanes (32, 64, 128).
// SKVQ_CUDA_BODY=fast|rs|imma|tmma forces one where the layout allows (tests,
// benchmarks). By default (measured, docs/performance-history.md): one row per KV head
// (multi-head decode) with 2-bit keys and values at groups of 32 and 128, or 4-bit ones at group
// 128, or 3-bit ones widened (widen_one_row), through attn_tmma_kernel's one-row form (tmma_one_row);
// other one or two rows per KV head through
// attn_rs_kernel at groups of 32, 64 and 128, else attn_fast_kernel; three or
// four (grouped-query decode) through attn_tmma_kernel, more (wider groups,
// prefill) through attn_imma_kernel, 8 rows a block, and from chunk_min_rows(p) rows through the
// chunk kernel (attend_chunk.cu), 64 rows a block. SKVQ_CUDA_BODY=chunk forces the chunk kernel
// where its shapes allow.
enum class Body { fast, imma, tmma, rs, chunk };
// Keys and values of one width that the token-major kernel takes widened (3 and 1 bits: tmma_widens),
// at its shapes, unless SKVQ_CUDA_WIDEN=0. (body_kernel names it for them, so that its choice and
// tmma_widens' agree wherever the packed body takes the pipelined kernels.)
bool widen_pair(const AttnParams& p) {
  static const bool on = env_switch("SKVQ_CUDA_WIDEN") != "0";
  return on && p.k.bits == p.v.bits && widen::widens(p.k.bits) && p.D == kD && p.Dv == kD && p.group == p.group_v;
}
// Query rows a KV head from which the chunk kernel takes the packed body by default: 40 with 2-bit
// keys, 32 with wider ones. Below a whole block of kChunkRows its idle rows cost what full ones do,
// where the integer tensor-core kernel's work shrinks by 8 rows at a time; measured side by side
// (`bench_cuda --chunks 8,10,12,14,16` with SKVQ_CUDA_CHUNK_ROWS=0 and =1, G = 4; docs/performance.md
// "Chunked prefill (session 58)"). Session 58 (H200, the chunk kernel's one fp16 value product): at
// 40 rows K2V2 g128 the chunk kernel is 8% slower at B=1 Hkv=8 32k and 7% and 22% faster at 128k and
// at B=8 (at 48 rows 1.02-1.36x faster); with 4-bit keys and values 1.05-1.32x faster at 32 rows (fewer
// not measured). Session 53 (H100, two bf16 value products) had put the thresholds at 48 and 40 by
// the same measure. SKVQ_CUDA_CHUNK_ROWS=N sets it (0: never).
int chunk_min_rows(const AttnParams& p) {
  static const int n = env_int("SKVQ_CUDA_CHUNK_ROWS", -1);
  if (n >= 0) return n;
  return p.k.bits == 2 ? 40 : 32;
}
// Settings whose single query row a KV head goes through the token-major kernel's one-row form by
// default. Measured against the one-token-per-lane kernel (docs/performance-history.md): 7-15% faster
// with 2-bit keys and values at group 128 (session 25); since its value codes come by ldmatrix
// (sessions 29 and 34) 9-16% faster at K2V2 group 32 and 1-8% at K4V4 group 128 (session 34; in
// session 25 tied and 13-17% slower). Group 64 and the mixed widths not measured.
constexpr bool tmma_one_row(int kb, int vb, int group) {
  return (kb == 2 && vb == 2 && (group == 128 || group == 32)) || (kb == 4 && vb == 4 && group == 128);
}
// Widths whose single query row a KV head goes through the one-row form over widened codes: 3 bits
// (session 66, H100: 1.9-2.6x faster than the general path's tensor-core kernel, and as fast as the
// four-row form to 12% faster). Not 1 bit: there it measured 4% faster to 10% slower than the tuned
// 1-bit kernels, which keep it (docs/performance.md, "3- and 1-bit codes on the token-major kernel").
constexpr bool widen_one_row(int bits) { return bits == 3; }
int body_override() {  // -1: none
  static const int v = [] {
    const std::string s = env_switch("SKVQ_CUDA_BODY");
    return s == "fast" ? 0 : s == "imma" ? 1 : s == "tmma" ? 2 : s == "rs" ? 3 : s == "chunk" ? 4 : -1;
  }();
  return v;
}
Body body_kernel(const AttnParams& p) {
  const bool groups = p.group == 32 || p.group == 64 || p.group == 128;
  const bool widened = widen_pair(p);  // (tmma_widens)
  const bool imma = groups && p.v.bits >= 2, tmma = groups && (p.v.bits == 2 || p.v.bits == 4 || widened);
  const bool rs = groups;  // metadata groups of whole lanes (16 channels)
  const bool chunk = chunk_shape_ok(p);
  const int rows = p.query_rows();
  switch (body_override()) {
    case 0: return Body::fast;
    case 1: return imma ? Body::imma : Body::fast;
    case 2: return tmma ? Body::tmma : Body::fast;
    case 3: return rs ? Body::rs : Body::fast;
    case 4: return chunk ? Body::chunk : Body::fast;
    default: break;
  }
  const int chunk_from = chunk_min_rows(p);
  if (chunk && chunk_from > 0 && rows >= chunk_from) return Body::chunk;
  if (tmma && rows >= 3 && rows <= kTmmaRows) return Body::tmma;
  if (tmma && rows == 1 && (tmma_one_row(p.k.bits, p.v.bits, p.group) || (widened && widen_one_row(p.k.bits))))
    return Body::tmma;
  if (imma && rows >= 3) return Body::imma;
  return rs && rows <= 2 ? Body::rs : Body::fast;
}

// Whether 3-bit (1-bit) keys and values decode through the token-major kernel on codes widened to 4
// (2) bits a tile in shared memory (attn_tmma_kernel's SRC) rather than the general path's
// tensor-core kernel (and the tuned 1-bit kernels): at head dim 128, groups of 32, 64 or 128 (one for
// keys and values), 3 or 4 query rows a KV head (grouped-query decode) or one (multi-head decode, the
// one-row form, where widen_one_row; any number of rows where SKVQ_CUDA_BODY=tmma forces the
// kernel), windows of whole pieces and something packed. Measured:
// docs/performance.md, "3- and 1-bit codes on the token-major kernel". SKVQ_CUDA_WIDEN=0 turns it off
// (benchmarks, tests).
bool tmma_widens(const AttnParams& p) {
  if (!widen_pair(p) || p.window % kPiece != 0 || p.q_end <= 0) return false;
  const int o = body_override();
  if (o >= 0 && o != 2) return false;  // another body kernel forced (2: tmma, which takes every row count)
  const int rows = p.query_rows();
  return body_kernel(p) == Body::tmma && (o == 2 || (rows >= 3 && rows <= kTmmaRows) || rows == 1);
}

// Whether the token-major kernel takes its tiles two at a time (attn_tmma_kernel's PAIR): with 2-bit
// keys and values, where the per-tile work it halves is a visible share, and metadata groups of 64
// or 128 channels, where the ring's extra stage still leaves five blocks an SM (at groups of 32 it
// leaves four: 6% faster at B=8 Hkv=8 128k, 2% slower at B=32; docs/performance-history.md, session 23).
// And only where a block has at least kPairMinTiles tiles: with short blocks (B=1 Hkv=8: 4 tiles at
// 32k, 13 at 128k) waiting for two tiles before the first work measured 3-6% slower, with 26 (B=8
// Hkv=8 32k) and 50 (B=1 Hkv=8 512k) 2-5% faster. p.split_len is 0 while the split count is chosen,
// so the occupancy it assumes is the fewer of the two kernels' (fast_blocks_per_sm; five blocks an
// SM each by default).
// SKVQ_CUDA_TMMA_PAIR=0 turns it off (tests, benchmarks); =N (N >= 1) takes pairs from blocks of N
// tiles instead of kPairMinTiles (benchmarks).
constexpr bool tmma_pairs(int kb, int vb, int group) { return kb == 2 && vb == 2 && group >= 64; }
constexpr std::int64_t kPairMinTiles = 16;
std::int64_t pair_min_tiles() {  // 0: never
  static const std::int64_t n = std::max(env_int("SKVQ_CUDA_TMMA_PAIR", static_cast<int>(kPairMinTiles)), 0);
  return n;
}
bool tmma_pair(const AttnParams& p) {
  const std::int64_t min_tiles = pair_min_tiles();
  return min_tiles > 0 && tmma_pairs(p.k.bits, p.v.bits, p.group) && p.split_len >= min_tiles * kFastTile &&
         body_kernel(p) == Body::tmma;
}
// Whether the token-major kernel runs in its one-row form (attn_tmma_kernel's ONE): wherever it
// takes a KV head with a single query row (with widened codes: where widen_one_row). SKVQ_CUDA_TMMA_ONE=0
// turns it off (benchmarks).
bool tmma_one(const AttnParams& p) {
  static const bool on = env_switch("SKVQ_CUDA_TMMA_ONE") != "0";
  return on && p.query_rows() == 1 && (!widen_pair(p) || widen_one_row(p.k.bits)) && body_kernel(p) == Body::tmma;
}
// Whether the token-major kernel streams its tiles through a ring of two stages, copies one tile
// ahead (attn_tmma_kernel's SHORT), instead of three: with 4-bit keys and values at groups of 128
// or 32, whose three stages of 17 or 20 KB leave four or three blocks an SM where its registers
// allow five. Session 37 measured it 0.5-8% faster back to back at every K4V4 g128 shape and 0-8%
// at g32 (docs/performance-history.md); at groups of 64, where it spills twice the bytes, 2%
// faster or slower by shape, so not there. SKVQ_CUDA_TMMA_SHORT=0 turns it off (benchmarks, tests).
constexpr bool tmma_shorts(int kb, int vb, int group) { return kb == 4 && vb == 4 && group != 64; }
bool tmma_short(const AttnParams& p) {
  static const bool on = env_switch("SKVQ_CUDA_TMMA_SHORT") != "0";
  return on && tmma_shorts(p.k.bits, p.v.bits, p.group) && !tmma_pair(p) && body_kernel(p) == Body::tmma;
}
// The pipelined kernel's shared-memory ring in bytes (one stage more when it holds two tiles, one
// less with the short ring): the launch and the occupancy calculation size it alike.
int fast_ring_bytes(const AttnParams& p) {
  if (body_kernel(p) == Body::chunk) return chunk_smem_bytes(p);  // (and its unpacked tile)
  if (tmma_widens(p)) {  // the ring (3-bit codes: the short one), then the tile's widened codes
    const int to = widen::widened(p.k.bits);
    const FastLayout<kFastTile> wide(16 * to, 16 * to, 0, 0);
    return tmma_ring_stages(false, tmma_widen_short(p.k.bits)) * FastLayout<kFastTile>(p).stage + wide.stage;
  }
  return tmma_ring_stages(tmma_pair(p), tmma_short(p)) * FastLayout<kFastTile>(p).stage;
}

// Query rows a block of the integer tensor-core kernel or the chunk kernel (0: the other kernels,
// which launch per few rows), and the groups of that many rows a call (all of them side by side:
// launch_fast_rows).
int block_rows(const AttnParams& p) {
  const Body k = body_kernel(p);
  return k == Body::imma ? kImmaRows : k == Body::chunk ? kChunkRows : 0;
}
int row_groups(const AttnParams& p) {
  const int n = block_rows(p);
  return n > 0 ? (p.query_rows() + n - 1) / n : 1;
}

// Query rows the pipelined kernel takes per launch when `left` rows remain.
int fast_rows_per_launch(const AttnParams& p, int left) {
  switch (body_kernel(p)) {
    case Body::imma: return std::min(left, kImmaRows);
    case Body::chunk: return std::min(left, kChunkRows);
    case Body::tmma: return std::min(left, kTmmaRows);
    case Body::rs: return left >= 2 ? 2 : 1;
    default: return left >= 4 ? 4 : left >= 2 ? 2 : 1;
  }
}

// Launches of the pipelined kernel for all of p's query rows (launch_fast_rows' row loop).
int fast_launches(const AttnParams& p) {
  int n = 0;
  for (int row = 0; row < p.query_rows(); row += fast_rows_per_launch(p, p.query_rows() - row)) ++n;
  return n;
}

// Calls f with the pipelined kernel for nq query rows (the integer
// tensor-core kernel: up to 8; the chunk kernel: up to 64; the float32 kernel: 4, 2 or 1) and the
// metadata type of p.
template <int KB, int VB, typename F>
void with_tuned_fast_kernel(const AttnParams& p, int nq, F&& f) {
  auto by_meta = [&](auto k16, auto k32, auto k8) {
    if (p.meta == 0) f(k16);
    else if (p.meta == 1) f(k32);
    else f(k8);
  };
  if (body_kernel(p) == Body::chunk) {
    f(chunk_kernel(p));
    return;
  }
  if constexpr (VB == 2 || VB == 4) {
    if (body_kernel(p) == Body::tmma) {
      auto tm = [&](auto gs, auto pair, auto one) {
        constexpr int GS = decltype(gs)::value;
        constexpr bool PAIR = decltype(pair)::value, ONE = decltype(one)::value;
        if constexpr (tmma_shorts(KB, VB, GS) && !PAIR) {
          if (tmma_short(p)) {
            by_meta(attn_tmma_kernel<KB, VB, 0, GS, PAIR, ONE, true>, attn_tmma_kernel<KB, VB, 1, GS, PAIR, ONE, true>,
                    attn_tmma_kernel<KB, VB, 2, GS, PAIR, ONE, true>);
            return;
          }
        }
        by_meta(attn_tmma_kernel<KB, VB, 0, GS, PAIR, ONE>, attn_tmma_kernel<KB, VB, 1, GS, PAIR, ONE>,
                attn_tmma_kernel<KB, VB, 2, GS, PAIR, ONE>);
      };
      auto by_group = [&](auto pair, auto one) {  // (tiles two at a time: groups of 64 or 128 only)
        if (p.group == 32) {
          if constexpr (!decltype(pair)::value) tm(std::integral_constant<int, 32>{}, pair, one);
        } else if (p.group == 64) {
          tm(std::integral_constant<int, 64>{}, pair, one);
        } else {
          tm(std::integral_constant<int, 128>{}, pair, one);
        }
      };
      auto by_rows = [&](auto pair) {
        if (tmma_one(p)) by_group(pair, std::true_type{});
        else by_group(pair, std::false_type{});
      };
      if constexpr (tmma_pairs(KB, VB, 64)) {
        if (tmma_pair(p)) {
          by_rows(std::true_type{});
          return;
        }
      }
      by_rows(std::false_type{});
      return;
    }
  }
  if constexpr (VB >= 2) {
    if (body_kernel(p) == Body::imma) {
      if (p.group == 32) by_meta(attn_imma_kernel<KB, VB, 0, 32>, attn_imma_kernel<KB, VB, 1, 32>, attn_imma_kernel<KB, VB, 2, 32>);
      else if (p.group == 64) by_meta(attn_imma_kernel<KB, VB, 0, 64>, attn_imma_kernel<KB, VB, 1, 64>, attn_imma_kernel<KB, VB, 2, 64>);
      else by_meta(attn_imma_kernel<KB, VB, 0, 128>, attn_imma_kernel<KB, VB, 1, 128>, attn_imma_kernel<KB, VB, 2, 128>);
      return;
    }
  }
  if (body_kernel(p) == Body::rs) {
    auto rows = [&](auto gs) {
      constexpr int GS = decltype(gs)::value;
      if (nq == 2) by_meta(attn_rs_kernel<KB, VB, 2, 0, GS>, attn_rs_kernel<KB, VB, 2, 1, GS>, attn_rs_kernel<KB, VB, 2, 2, GS>);
      else by_meta(attn_rs_kernel<KB, VB, 1, 0, GS>, attn_rs_kernel<KB, VB, 1, 1, GS>, attn_rs_kernel<KB, VB, 1, 2, GS>);
    };
    if (p.group == 32) rows(std::integral_constant<int, 32>{});
    else if (p.group == 64) rows(std::integral_constant<int, 64>{});
    else rows(std::integral_constant<int, 128>{});
    return;
  }
  if (nq == 4) by_meta(attn_fast_kernel<KB, VB, 4, 0>, attn_fast_kernel<KB, VB, 4, 1>, attn_fast_kernel<KB, VB, 4, 2>);
  else if (nq == 2) by_meta(attn_fast_kernel<KB, VB, 2, 0>, attn_fast_kernel<KB, VB, 2, 1>, attn_fast_kernel<KB, VB, 2, 2>);
  else by_meta(attn_fast_kernel<KB, VB, 1, 0>, attn_fast_kernel<KB, VB, 1, 1>, attn_fast_kernel<KB, VB, 1, 2>);
}

// with_tuned_fast_kernel, and where the codes are widened (tmma_widens: 3- and 1-bit keys and values)
// the token-major kernel over the widened codes (its SRC; never two tiles at a time; the one-row form
// where tmma_one, 3-bit codes only).
template <int KB, int VB, typename F>
void with_fast_kernel(const AttnParams& p, int nq, F&& f) {
  if constexpr (KB == VB && widen::widens(KB)) {
    if (tmma_widens(p)) {
      constexpr int W = widen::widened(KB);
      constexpr bool S = tmma_widen_short(KB);
      auto tm = [&](auto gs, auto one) {
        constexpr int GS = decltype(gs)::value;
        constexpr bool ONE = decltype(one)::value;
        if (p.meta == 0) f(attn_tmma_kernel<W, W, 0, GS, false, ONE, S, KB>);
        else if (p.meta == 1) f(attn_tmma_kernel<W, W, 1, GS, false, ONE, S, KB>);
        else f(attn_tmma_kernel<W, W, 2, GS, false, ONE, S, KB>);
      };
      auto by_group = [&](auto one) {
        if (p.group == 32) tm(std::integral_constant<int, 32>{}, one);
        else if (p.group == 64) tm(std::integral_constant<int, 64>{}, one);
        else tm(std::integral_constant<int, 128>{}, one);
      };
      if constexpr (widen_one_row(KB)) {
        if (tmma_one(p)) {
          by_group(std::true_type{});
          return;
        }
      }
      by_group(std::false_type{});
      return;
    }
  }
  if constexpr (KB != 3) {
    with_tuned_fast_kernel<KB, VB>(p, nq, std::forward<F>(f));
  } else {  // (with_fast_bits gives 3 bits only where tmma_widens)
    throw Error("skvq: cuda attend: 3-bit codes reached the tuned kernels without widening");
  }
}

template <int KB, int VB>
void launch_fast_rows(const AttnParams& p, int splits, cudaStream_t stream) {
  const int n_rows = p.query_rows();
  const dim3 grid(splits, p.Hkv, p.B);
  const int smem = fast_ring_bytes(p);
  if (const int rows = block_rows(p); rows > 0) {
    // Every group of kImmaRows (kChunkRows) rows in one launch (blockIdx.z = group * B + b), at most
    // row_groups_a_launch(p.B) groups a launch: the groups' blocks stream the tiles side by side
    // (one launch a group ran them one after another, each a short grid: a prefill chunk cost
    // about a decode step a query position).
    with_fast_kernel<KB, VB>(p, rows, [&](auto kernel) {
      allow_smem(kernel, smem);
      for_row_group_launches(row_groups(p), rows, p.B, [&](int row, int ng) {
        launch_body(kernel, dim3(splits, p.Hkv, static_cast<unsigned>(p.B * ng)), smem, stream, p, row);
      });
    });
    return;
  }
  AttnParams lp = p;  // each launch its own claim counters (balanced claiming)
  for (int row = 0; row < n_rows;) {
    const int nq = fast_rows_per_launch(p, n_rows - row);
    with_fast_kernel<KB, VB>(p, nq, [&](auto kernel) {
      allow_smem(kernel, smem);
      launch_body(kernel, grid, smem, stream, lp, row);
    });
    row += nq;
    if (lp.claims != nullptr) lp.claims += static_cast<std::int64_t>(p.B) * p.Hkv;
  }
}

// Blocks of the pipelined kernel that fit one SM at once (registers and
// shared memory), for the first launch of launch_fast_rows' row loop; cached
// per (kernel, shared memory): a host calculation per call otherwise.
template <int KB, int VB>
int fast_blocks_per_sm(const AttnParams& p) {
  const int smem = fast_ring_bytes(p);
  int blocks = 0;
  with_fast_kernel<KB, VB>(p, fast_rows_per_launch(p, p.query_rows()), [&](auto kernel) {
    static std::mutex mu;
    static std::map<std::pair<const void*, int>, int> cache;
    const std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), smem);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      blocks = it->second;
      return;
    }
    allow_smem(kernel, smem);
    SKVQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem));
    cache[key] = blocks;
  });
  return std::max(1, blocks);
}

// Calls f(KB, VB) as compile-time constants for the supported (key, value)
// bit pairs; false for any other pair.
template <typename F>
bool with_bits(int kb, int vb, F&& f) {
  auto pair = [&](auto k, auto v) {
    if (kb != decltype(k)::value || vb != decltype(v)::value) return false;
    f(k, v);
    return true;
  };
  using std::integral_constant;
  return pair(integral_constant<int, 2>{}, integral_constant<int, 2>{}) ||
         pair(integral_constant<int, 4>{}, integral_constant<int, 4>{}) ||
         pair(integral_constant<int, 8>{}, integral_constant<int, 8>{}) ||
         pair(integral_constant<int, 1>{}, integral_constant<int, 1>{}) ||
         pair(integral_constant<int, 4>{}, integral_constant<int, 2>{}) ||
         pair(integral_constant<int, 8>{}, integral_constant<int, 4>{});
}

// with_bits for p's widths, and (3, 3) where they decode through the widened token-major kernel
// (tmma_widens; (1, 1) is one of with_bits' pairs either way).
template <typename F>
bool with_fast_bits(const AttnParams& p, F&& f) {
  if (tmma_widens(p)) {
    if (p.k.bits == 3) f(std::integral_constant<int, 3>{}, std::integral_constant<int, 3>{});
    else f(std::integral_constant<int, 1>{}, std::integral_constant<int, 1>{});
    return true;
  }
  return with_bits(p.k.bits, p.v.bits, std::forward<F>(f));
}

// The split count is chosen before a block's tile count is known (p.split_len 0): where blocks may
// take their tiles two at a time (tmma_pair), the fewer of the two kernels' resident blocks.
int fast_blocks_per_sm(const AttnParams& p) {
  int blocks = 1;
  with_fast_bits(p, [&](auto k, auto v) {
    constexpr int KB = decltype(k)::value, VB = decltype(v)::value;
    blocks = fast_blocks_per_sm<KB, VB>(p);
    AttnParams paired = p;
    paired.split_len = pair_min_tiles() * kFastTile;  // (0 with pairs off: tmma_pair is false then)
    if (tmma_pair(paired)) blocks = std::min(blocks, fast_blocks_per_sm<KB, VB>(paired));
  });
  return blocks;
}

// Blocks of the pipelined kernel resident at once on the current device.
std::int64_t fast_slots(const AttnParams& p) {
  int sms = 132, dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return static_cast<std::int64_t>(sms) * fast_blocks_per_sm(p);
}

// Splits of the packed body for the pipelined kernel: the cost model of cuda/split_rule.hpp
// (waves of resident blocks, a fixed cost a block). SKVQ_CUDA_SPLIT_RULE=fill keeps the rule before
// session 23 (the last wave's fill, less 0.002 a split), for benchmarks.
int choose_fast_splits(const AttnParams& p, int requested) {
  if (requested > 0) return requested;
  const std::int64_t slots = fast_slots(p);
  // (the integer tensor-core kernel and the chunk kernel take all their groups of query rows in one
  // grid: each counts as a head of its own)
  const std::int64_t heads = static_cast<std::int64_t>(p.B) * p.Hkv * row_groups(p);
  static const bool fill_rule = env_switch("SKVQ_CUDA_SPLIT_RULE") == "fill";
  if (fill_rule) return fill_split_count(heads, p.q_end / kFastTile, slots);
  return cached_split_count(heads, (p.q_end + kFastTile - 1) / kFastTile, slots);
}

template <int KB, int VB, bool DENSE>
void launch_rows(const AttnParams& p, cudaStream_t stream) {
  const int n_rows = p.query_rows();
  const dim3 grid(p.splits, p.Hkv, p.B);
  int row = 0;
  while (row < n_rows) {
    const int left = n_rows - row;
    if (left >= 4) {
      attn_kernel<KB, VB, 4, DENSE><<<grid, kThreads, 0, stream>>>(p, row);
      row += 4;
    } else if (left >= 2) {
      attn_kernel<KB, VB, 2, DENSE><<<grid, kThreads, 0, stream>>>(p, row);
      row += 2;
    } else {
      attn_kernel<KB, VB, 1, DENSE><<<grid, kThreads, 0, stream>>>(p, row);
      row += 1;
    }
    SKVQ_CUDA_LAUNCH_CHECK();
  }
}

// The split workspaces (partials of each split): one buffer per device and
// stream (and thread, for cudaStreamPerThread), grown when a call needs more
// and kept until the process ends. Calls on one stream run one after
// another, so they share its buffer; calls on different streams may overlap,
// so they never share one. The lock is held while a call enqueues its
// kernels, so a growth by another thread on the same stream (cudaFree waits
// for the device) cannot free the buffer between a call's lookup and its
// launches. A stream-ordered allocation and free per call cost 2-2.5 us of
// host time before the first kernel could start (docs/performance-history.md,
// session 13). A stream being captured into a graph cannot allocate: such a
// call must find its buffer large enough, and a buffer once captured is never
// freed (a graph may replay it later), only set aside when its stream grows.
// Beside it, the claim counters of balanced claiming (AttnParams::claims):
// zero between calls (the combine kernel zeroes those a call used), zeroed
// on the stream first when a call enqueued its body but not its combine
// (`dirty`: an error between the two launches).
struct WorkspaceBuffer {
  void* ptr = nullptr;
  std::size_t size = 0;
  bool captured = false;
  unsigned* claims = nullptr;
  std::size_t n_claims = 0;
  bool dirty = false;
};
struct Workspace {
  std::unique_lock<std::mutex> lock;
  float* ptr = nullptr;
  WorkspaceBuffer* buf = nullptr;
};
struct WorkspaceRegistry {
  std::mutex mu;
  std::map<std::tuple<int, cudaStream_t, std::thread::id>, WorkspaceBuffer> buffers;
  std::vector<void*> set_aside;  // captured buffers outgrown or released: graphs may still use them

  static std::tuple<int, cudaStream_t, std::thread::id> key(cudaStream_t stream) {
    return {current_device(), stream, stream == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id{}};
  }
  // Frees b (cudaFree waits for the device), or sets it aside when a graph may hold it.
  void drop(WorkspaceBuffer& b) {
    for (void* x : {b.ptr, static_cast<void*>(b.claims)}) {
      if (x == nullptr) continue;
      if (b.captured) set_aside.push_back(x);
      else SKVQ_CUDA_CHECK(cudaFree(x));
    }
    b = WorkspaceBuffer{};
  }
};
WorkspaceRegistry& workspaces() {
  static WorkspaceRegistry r;  // kept until the process ends
  return r;
}

Workspace workspace(std::size_t bytes, std::size_t n_claims, cudaStream_t stream) {
  WorkspaceRegistry& r = workspaces();
  const auto key = WorkspaceRegistry::key(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (stream != nullptr) SKVQ_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  std::unique_lock<std::mutex> lock(r.mu);
  WorkspaceBuffer& b = r.buffers[key];
  if (b.size < bytes || b.n_claims < n_claims) {
    if (capturing) {
      throw Error("skvq: cuda attend: this call needs a split workspace of " + std::to_string(bytes) + " bytes and " +
                  std::to_string(n_claims) + " claim counters on its stream, which has " + std::to_string(b.size) + " and " +
                  std::to_string(b.n_claims) +
                  ", and a stream capture cannot allocate: run the same attention on this stream once before capturing it");
    }
    const std::size_t keep_bytes = std::max(bytes, b.size), keep_claims = std::max(n_claims, b.n_claims);
    r.drop(b);
    SKVQ_CUDA_CHECK(cudaMalloc(&b.ptr, keep_bytes));
    b.size = keep_bytes;
    if (keep_claims > 0) {
      SKVQ_CUDA_CHECK(cudaMalloc(&b.claims, keep_claims * sizeof(unsigned)));
      // on the call's stream: cudaMemset would run on the legacy default stream, asynchronously to the
      // host and unordered with a non-blocking stream's kernels
      SKVQ_CUDA_CHECK(cudaMemsetAsync(b.claims, 0, keep_claims * sizeof(unsigned), stream));
      b.n_claims = keep_claims;
    }
  }
  b.captured = b.captured || capturing;
  return {std::move(lock), static_cast<float*>(b.ptr), &b};
}

// Balanced claiming's chunks a split (SKVQ_CUDA_BALANCE=N: N chunks, 0 or 1: off, each block its
// own split's tiles, deterministic; default 8: the block's own chunk an eighth of a split). Only
// for splits of kBalanceMinTiles tiles or more: with 4 (B=1 Hkv=8 32k) claiming measured 0.7-1.3
// us slower, with 13 (B=1 Hkv=8 128k) even to 4% faster, with 26-100 5-8% faster (N = 4, 8, 16, 32
// side by side: docs/performance.md).
constexpr int kBalanceMinTiles = 8;
int balance_chunks() {
  static const int n = std::clamp(env_int("SKVQ_CUDA_BALANCE", 8), 0, 64);
  return n;
}
// The step's tail in small chunks (session 38): kSmallChunkTiles tiles each (the copies' lead, the
// least a chunk may hold), over tail_tenths() / 10 of a chunk a block. SKVQ_CUDA_TAIL=N sets N
// (0: none; tests, benchmarks).
constexpr int kSmallChunkTiles = 2;
int tail_tenths() {
  static const int n = std::clamp(env_int("SKVQ_CUDA_TAIL", 20), 0, 100);
  return n;
}

}  // namespace

// The tensor-core kernel is opt-in (SKVQ_CUDA_MMA=1): measured on the H200 it
// runs at about half the speed of the float32 kernel (docs/performance-history.md).
bool mma_enabled() {
  static const bool on = env_switch("SKVQ_CUDA_MMA") == "1";
  return on;
}

void release_workspace(cudaStream_t stream) {
  WorkspaceRegistry& r = workspaces();
  const auto key = WorkspaceRegistry::key(stream);
  const std::lock_guard<std::mutex> lock(r.mu);
  const auto it = r.buffers.find(key);
  if (it == r.buffers.end()) return;
  r.drop(it->second);
  r.buffers.erase(it);
}

int choose_splits(const AttnParams& p, int requested) {
  if (requested > 0) return requested;
  int sms = 132;
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const std::int64_t blocks_per_split = static_cast<std::int64_t>(p.B) * p.Hkv;
  std::int64_t splits = (8LL * sms + blocks_per_split - 1) / blocks_per_split;  // about two waves
  const std::int64_t max_splits = (p.kv_len + 255) / 256;  // at least 256 tokens a split
  splits = std::max<std::int64_t>(1, std::min(splits, max_splits));
  return static_cast<int>(splits);
}

namespace {

// n 16-bit queries (fp16, or bf16 where BF16) widened to fp32 (exactly).
template <bool BF16>
__global__ void __launch_bounds__(256) widen_queries_kernel(const unsigned short* __restrict__ q, std::int64_t n, float* __restrict__ out) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const unsigned short u = q[i];
    out[i] = BF16 ? __uint_as_float(static_cast<unsigned>(u) << 16) : __half2float(__ushort_as_half(u));
  }
}

void widen_queries(const void* q, bool bf16, std::int64_t n, float* out, cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min<std::int64_t>((n + 255) / 256, 1024));
  const auto* src = static_cast<const unsigned short*>(q);
  if (bf16) widen_queries_kernel<true><<<blocks, 256, 0, stream>>>(src, n, out);
  else widen_queries_kernel<false><<<blocks, 256, 0, stream>>>(src, n, out);
  SKVQ_CUDA_LAUNCH_CHECK();
}

}  // namespace

// Whether 1-bit keys and values at head dim 128 go through the general path's tensor-core kernel
// (attend_tc.cu) instead of the tuned ones: not where the token-major kernel takes them widened to
// 2 bits (tmma_widens, session 65: 3 or 4 rows a KV head), so 5 to 8 rows by this rule. Before
// that, at 1 bit the tuned kernels had no tensor-core form for grouped-query decode
// (attn_tmma_kernel takes 2- or 4-bit values); their one-token-per-lane kernel
// measured against the tensor-core kernel on an H100 (session 62, `bench_cuda --one` with
// SKVQ_CUDA_BODY=fast and =general; docs/performance.md "Every code width"), by the query rows a KV
// head and the work, B x Hkv x the packed tokens:
// - groups of 128, 8 rows: the tensor-core kernel 1.1x faster at 2^14 (B=1 Hkv=4 4k), 1.3x at
//   2^17, 3.2x at 2^20;
// - groups of 128, 4 rows: 1.1-1.6x slower up to 2^17, 1.1-1.3x faster at 2^18, 1.5-2.1x from 2^20;
// - groups of 32 and 64, 4 rows: 1.3-1.6x faster at 2^20 and 2^21 (less not measured);
// - 1 row: 2.2-3.0x slower; 2 rows: 1.3-1.6x slower.
// Its work a token does not grow from 1 to 8 rows (A rows 0-7), the tuned kernel's does; 5 to 7 rows
// (not measured) take 4 rows' line. Not where a tuned body kernel is forced (SKVQ_CUDA_BODY=fast).
bool one_bit_to_tc(const AttnParams& p) {
  if (p.k.bits != 1 || p.v.bits != 1 || body_override() >= 0 || tmma_widens(p)) return false;
  const int rows = p.query_rows();
  if (rows < 3 || rows > 8) return false;
  const std::int64_t work = static_cast<std::int64_t>(p.B) * p.Hkv * p.q_end;
  const bool wide = p.group == 128 && (rows == 8 || work >= (std::int64_t{1} << 18));
  const bool narrow = (p.group == 32 || p.group == 64) && work >= (std::int64_t{1} << 20);
  return (wide || narrow) && tc_shape_ok(p);
}

void run_attention(AttnParams p, bool dense, int requested_splits, void* out, cudaStream_t stream) {
  if (p.Dv == 0) p.Dv = p.D;
  if (p.group_v == 0) p.group_v = p.group;
  const int kb = dense ? 16 : p.k.bits;
  // Shapes the tuned kernels do not take go through the general path (attend_general.cu): head dims
  // other than 128, pairs of code widths outside with_bits' six (but for 3-bit keys and values where
  // tmma_widens). SKVQ_CUDA_BODY=general sends every call there (tests, benchmarks).
  static const bool general_forced = env_switch("SKVQ_CUDA_BODY") == "general";
  const bool general = general_forced || p.D != kD || p.Dv != kD || (!dense && !with_fast_bits(p, [](auto, auto) {})) ||
                       (!dense && one_bit_to_tc(p));
  if (!dense) {  // t / window as (t * magic) >> shift, exact for t < 2^32
    int sh = 0;
    while ((1LL << sh) < p.window) ++sh;
    p.div_shift = 32 + sh;
    p.div_magic = static_cast<unsigned long long>((((__uint128_t)1 << p.div_shift) + p.window - 1) / p.window);
    if (p.window % kFastTile == 0) p.window_tiles = FastDiv(static_cast<std::uint32_t>(p.window / kFastTile));
  }
  // Packed body through the pipelined kernel when tiles of 64 rows fit the
  // window, the exact sinks and tail in the combine kernel (which starts
  // beside the pipelined kernel: programmatic dependent launch); otherwise
  // everything through the general kernel, then the combine.
  const bool fast = !general && !dense && p.window % kPiece == 0 && p.q_end > 0;
  int fast_splits = 0;
  if (fast) {
    AttnParams body = p;
    body.kv_len = p.q_end;
    fast_splits = choose_fast_splits(body, requested_splits);
    p.split_len = (p.q_end + fast_splits - 1) / fast_splits;
    p.split_len = (p.split_len + kFastTile - 1) / kFastTile * kFastTile;
    fast_splits = static_cast<int>((p.q_end + p.split_len - 1) / p.split_len);
    p.splits = fast_splits;
  } else if (general && !dense && tc_shape_ok(p)) {
    plan_tc(p, requested_splits);  // the packed body through the general path's tensor-core kernel
  } else {
    p.splits = choose_splits(p, requested_splits);
    p.split_len = (p.kv_len + p.splits - 1) / p.splits;
    p.split_len = (p.split_len + kGroups * kTile - 1) / (kGroups * kTile) * (kGroups * kTile);
    p.splits = static_cast<int>((p.kv_len + p.split_len - 1) / p.split_len);
  }
  const std::int64_t rows = static_cast<std::int64_t>(p.B) * p.Hq * p.Sq;
  // Tensor cores when every k-step and every 8-channel value tile lies in one metadata group.
  const bool mma = fast && p.group >= 32 && (kb != 1 || p.group % 32 == 0) && !tmma_widens(p) && mma_enabled();
  // Balanced claiming (the token-major kernel): chunks of split_len / balance_chunks() tiles, at
  // least 2 (the copies' lead), where that leaves chunks to claim; else each block its split.
  if (fast) {
    const int split_tiles = static_cast<int>(p.split_len / kFastTile);
    const int n = balance_chunks();
    p.chunk_tiles = split_tiles;
    p.head_tiles = static_cast<int>((p.q_end + kFastTile - 1) / kFastTile);
    if (!mma && n > 1 && split_tiles >= kBalanceMinTiles && body_kernel(p) == Body::tmma) {
      const int c = std::max(2, (split_tiles + n - 1) / n);
      if ((p.head_tiles + c - 1) / c > p.splits) p.chunk_tiles = c, p.balance = 1;
    }
    p.head_chunks = (p.head_tiles + p.chunk_tiles - 1) / p.chunk_tiles;
    p.big_chunks = p.head_chunks, p.small_tiles = p.chunk_tiles, p.small_base = 0;
    // The tail in small chunks: the last tail_tenths() / 10 of a chunk a block (at most what is left
    // to claim) in chunks of kSmallChunkTiles, so that the blocks still streaming when the big
    // chunks run out (the slower ones: a block's place on its SM, docs/performance.md) end on a
    // small chunk instead of a whole one. Only where the blocks are resident together (one wave:
    // with two, B=32 Hkv=8 32k measured 1.5% slower).
    // (the occupancy lookup only where small chunks could apply: it costs the host a lock)
    const bool one_wave = p.balance && p.chunk_tiles > kSmallChunkTiles && tail_tenths() > 0 &&
                          static_cast<std::int64_t>(p.B) * p.Hkv * p.splits <= fast_slots(p);
    const int tail = one_wave ? std::min(p.head_tiles - p.splits * p.chunk_tiles, p.splits * p.chunk_tiles * tail_tenths() / 10) : 0;
    if (tail >= kSmallChunkTiles) {
      const int big = std::max(p.splits, (p.head_tiles - tail) / p.chunk_tiles);
      p.big_chunks = big, p.small_tiles = kSmallChunkTiles;
      p.small_base = big * (p.chunk_tiles - kSmallChunkTiles);
      p.head_chunks = big + (p.head_tiles - big * p.chunk_tiles + kSmallChunkTiles - 1) / kSmallChunkTiles;
    }
  }
  // (a counter per KV head and body launch: launch_fast_rows moves each launch to its own)
  const std::int64_t n_claims = p.balance ? static_cast<std::int64_t>(p.B) * p.Hkv * fast_launches(p) : 0;
  // 16-bit queries are widened to fp32 into the workspace first (one small kernel), so that every
  // attention kernel reads fp32 queries as it always has
  const std::int64_t partials = (rows * p.splits * (2 + p.Dv) + 3) / 4 * 4;  // (the queries 16-byte aligned after them)
  const std::int64_t q_floats = p.q16 ? rows * p.D : 0;
  const Workspace w = workspace(static_cast<std::size_t>(partials + q_floats) * sizeof(float), static_cast<std::size_t>(n_claims), stream);
  float* ws = w.ptr;
  p.ws_m = ws;
  p.ws_l = ws + rows * p.splits;
  p.ws_acc = ws + 2 * rows * p.splits;
  if (q_floats > 0) {
    widen_queries(p.q16, p.q_type == kTypeBF16, q_floats, ws + partials, stream);
    p.q = ws + partials;
    p.q16 = nullptr;
    p.q_type = kTypeF32;
  }
  if (p.balance) {
    p.claims = w.buf->claims;
    p.n_claims = static_cast<int>(n_claims);
    // (all of them: the call that left them dirty may have used more than this one)
    if (w.buf->dirty) SKVQ_CUDA_CHECK(cudaMemsetAsync(p.claims, 0, w.buf->n_claims * sizeof(unsigned), stream));
    w.buf->dirty = true;  // until the combine kernel (which zeroes them again) is enqueued
  }
  if (general) {
    launch_general(p, dense, out, stream);
    return;
  }
  if (dense) {
    launch_rows<2, 2, true>(p, stream);
  } else {
    with_fast_bits(p, [&](auto k, auto v) {
      constexpr int K = decltype(k)::value, V = decltype(v)::value;
      if constexpr (K == 3) {
        launch_fast_rows<K, V>(p, fast_splits, stream);  // (tmma_widens: fast, never mma)
      } else {
        if (!fast) launch_rows<K, V, false>(p, stream);
        else if (mma) launch_mma_rows<K, V>(p, fast_splits, stream);
        else launch_fast_rows<K, V>(p, fast_splits, stream);
      }
    });
  }
  const int combine_smem = p.splits * static_cast<int>(sizeof(float));
  const bool few = p.splits <= kCombineFewSplits;
  const auto combine = fast ? (few ? combine_kernel<true, kCombineFewSplits> : combine_kernel<true, kCombineManyLoads>)
                            : (few ? combine_kernel<false, kCombineFewSplits> : combine_kernel<false, kCombineManyLoads>);
  allow_smem(combine, combine_smem);
  launch_on(combine, dim3(static_cast<unsigned>(rows)), dim3(kD), combine_smem, stream, fast && dependent_launch_supported(),
            static_cast<const AttnParams>(p), dense ? nullptr : static_cast<const int*>(p.v.perm), out);
  if (p.balance) w.buf->dirty = false;
}

#ifdef SKVQ_CUDA_TRACE
namespace trace {
void reset() {
  SKVQ_CUDA_CHECK(cudaDeviceSynchronize());
  void* at = nullptr;
  SKVQ_CUDA_CHECK(cudaGetSymbolAddress(&at, g_trace));
  SKVQ_CUDA_CHECK(cudaMemset(at, 0, sizeof(Record) * kCapacity));
}
std::vector<Record> fetch() {
  SKVQ_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<Record> all(kCapacity), r;
  SKVQ_CUDA_CHECK(cudaMemcpyFromSymbol(all.data(), g_trace, all.size() * sizeof(Record)));
  for (const Record& e : all)
    if (e.kind != 0) r.push_back(e);
  return r;
}
}  // namespace trace
#endif

}  // namespace skvq::cuda
