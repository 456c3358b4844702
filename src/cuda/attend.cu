// Fused split-K attention over the device cache: [exact sinks | packed body |
// exact tail], grouped-query attention, causal prefill, and a combine step.
//
// A block (128 threads) owns one (batch, kv head, token split) and up to NQ
// query rows of that kv head. Its threads form 16 groups of 8 lanes; a group
// takes one token at a time, lane l holding channels [16 l, 16 l + 16) of the
// row in the side's permuted order: 16 codes = 2 * bits bytes, one load. Each
// group keeps its own online softmax (max, sum, accumulators); the block
// merges its 16 groups in shared memory and writes one partial per split,
// and the combine kernel merges the splits and undoes the value permutation.
#include <cfloat>

#include "cuda/common.cuh"
#include "cuda/device_state.cuh"
#include "cuda/kernels.cuh"

namespace skvq::cuda {

namespace {

constexpr int kCPL = 16;     // codes (channels) per lane
constexpr int kLanes = 8;    // lanes per token: D = 128
constexpr int kD = kCPL * kLanes;
constexpr int kThreads = 128;
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
  __device__ __forceinline__ float frac(int i) const {
    constexpr int kTop = 23 - BITS;
    const int bit = i * BITS, pos = bit % 32;
    const unsigned word = w[bit / 32];
    const unsigned moved = pos >= kTop ? word >> (pos - kTop) : word << (kTop - pos);
    return __uint_as_float((moved & (((1u << BITS) - 1u) << kTop)) | 0x3F800000u);
  }
};

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
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

  __device__ __forceinline__ void init(const AttnParams& p, int b, int h, int row0, int lane, const int* kperm) {
    const int G = p.Hq / p.Hkv, n_rows = G * p.Sq;
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      const int row = row0 + n;
      const bool valid = row < n_rows;
      const int gq = valid ? row / p.Sq : 0, i = valid ? row % p.Sq : 0;
      const float* qrow = p.q + ((static_cast<std::int64_t>(b) * p.Hq + h * G + gq) * p.Sq + i) * kD;
      limit[n] = valid ? p.kv_len - p.Sq + i : -1;
      qs[n] = 0.0f;
#pragma unroll
      for (int c = 0; c < kCPL; ++c) {
        const int j = lane * kCPL + c;
        q[n][c] = valid ? qrow[kperm ? kperm[j] : j] * (p.scale * 1.4426950408889634f) : 0.0f;  // log2 units
        qs[n] += q[n][c];
      }
      m[n] = -INFINITY, l[n] = 0.0f, lacc[n] = 0.0f, wsum[n] = 0.0f;
#pragma unroll
      for (int c = 0; c < kCPL; ++c) acc[n][c] = 0.0f;
    }
  }
  // This lane's part of row n's score for a packed key.
  template <int KB>
  __device__ __forceinline__ float packed_score(const LaneCodes<KB>& kc, float ks, float kl, int n) const {
    float d = 0.0f;
#pragma unroll
    for (int c = 0; c < kCPL; ++c) d = fmaf(q[n][c], kc.frac(c), d);
    return fmaf(ks * static_cast<float>(1 << KB), d - qs[n], kl * qs[n]);
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
      for (int c = 0; c < kCPL; ++c) acc[n][c] = fmaf(w, vc.frac(c), acc[n][c]);
      wsum[n] += w;
      lacc[n] = fmaf(pw[u][n], vl, lacc[n]);
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
  const int G = p.Hq / p.Hkv, n_rows = G * p.Sq;
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
  for (int e = threadIdx.x; e < NQ * kD; e += kThreads) {
    const int n = e / kD, j = e % kD;
    const int row = row0 + n;
    if (row >= n_rows) continue;
    float M = -INFINITY;
    for (int g = 0; g < kGroups; ++g) M = fmaxf(M, sm_m[g][n]);
    float L = 0.0f, A = 0.0f;
    if (M != -INFINITY) {
      for (int g = 0; g < kGroups; ++g) {
        const float w = fast_exp2(sm_m[g][n] - M);
        L += sm_l[g][n] * w;
        A += sm_acc[g][n][j] * w;
      }
    }
    const int gq = row / p.Sq, i = row % p.Sq;
    const std::int64_t qrow = (static_cast<std::int64_t>(b) * p.Hq + h * G + gq) * p.Sq + i;
    if (j == 0) {
      p.ws_m[qrow * p.splits + out_split] = M;
      p.ws_l[qrow * p.splits + out_split] = L;
    }
    p.ws_acc[(qrow * p.splits + out_split) * kD + j] = A;
  }
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
  const int mb = p.meta_bytes;
  const int kgrp = (lane * kCPL) / p.group;  // one metadata group per lane
  const std::int64_t t_begin = p.n_ranges ? p.range_begin[split] : static_cast<std::int64_t>(split) * p.split_len;
  const std::int64_t t_end = p.n_ranges ? p.range_end[split] : min(p.kv_len, t_begin + p.split_len);
  const int out_split = p.n_ranges ? p.split_base + split : split;

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
  write_partial<NQ, VB>(p, row0, out_split, b, h, lane, grp, st);
}

// ---- pipelined kernel for the packed body (window a multiple of 64) ----
//
// The block stages 64-token tiles of packed codes and metadata in shared
// memory with 16-byte cp.async copies, kStages deep, so that many bytes are
// in flight while the groups compute on an earlier tile from shared memory.
// Tokens below `sinks` (chunk 0's exact rows) are masked here; the general
// kernel covers them and the tail.
constexpr int kFastTile = 64;
constexpr int kStages = 3;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_stages() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2)); }

__device__ __forceinline__ void copy_range(unsigned char* dst, const unsigned char* src, int bytes) {
  for (int u = threadIdx.x; u < bytes / 16; u += kThreads) cp_async16(dst + u * 16, src + u * 16);
}

struct FastLayout {  // byte offsets inside one stage
  int kc, vc, klo, ksc, vlo, vsc, stage;
  __host__ __device__ FastLayout(const AttnParams& p) {
    const auto pad = [](std::int64_t x) { return static_cast<int>((x + 15) & ~15LL); };
    kc = 0;
    vc = pad(kFastTile * p.k.row_bytes);
    klo = vc + pad(kFastTile * p.v.row_bytes);
    ksc = klo + pad(static_cast<std::int64_t>(kFastTile) * p.k.G * p.meta_bytes);
    vlo = ksc + pad(static_cast<std::int64_t>(kFastTile) * p.k.G * p.meta_bytes);
    vsc = vlo + pad(static_cast<std::int64_t>(kFastTile) * p.v.G * p.meta_bytes);
    stage = vsc + pad(static_cast<std::int64_t>(kFastTile) * p.v.G * p.meta_bytes);
  }
};

template <int KB, int VB, int NQ, int META>
__global__ void __launch_bounds__(kThreads) attn_fast_kernel(const AttnParams p, int row0) {
  extern __shared__ __align__(16) unsigned char ring[];
  constexpr int kSub = NQ >= 4 ? 2 : kTile;  // tokens per group per softmax step (registers)
  const FastLayout lay(p);
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x % kLanes, grp = threadIdx.x / kLanes;
  const int mb = p.meta_bytes;
  const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hkv + h;
  GroupState<NQ, VB> st;
  st.init(p, b, h, row0, lane, p.k.perm ? p.k.perm + h * kD : nullptr);
  const int kgrp = (lane * kCPL) / p.group;
  const std::int64_t t_begin = static_cast<std::int64_t>(split) * p.split_len;
  const std::int64_t t_end = min(p.q_end, t_begin + p.split_len);
  const int n_tiles = static_cast<int>((t_end - t_begin + kFastTile - 1) / kFastTile);

  auto issue = [&](int tile) {
    const std::int64_t t0 = t_begin + static_cast<std::int64_t>(tile) * kFastTile;
    const std::int64_t slot = static_cast<std::int64_t>((static_cast<unsigned long long>(t0) * p.div_magic) >> p.div_shift);
    const std::int64_t rowi = bh * p.window + (t0 - slot * p.window);
    unsigned char* stage = ring + (tile % kStages) * lay.stage;
    copy_range(stage + lay.kc, p.k.codes + slot * p.k.slot_codes + rowi * p.k.row_bytes, kFastTile * static_cast<int>(p.k.row_bytes));
    copy_range(stage + lay.vc, p.v.codes + slot * p.v.slot_codes + rowi * p.v.row_bytes, kFastTile * static_cast<int>(p.v.row_bytes));
    const std::int64_t km = slot * p.k.slot_meta + rowi * p.k.G * mb, vm = slot * p.v.slot_meta + rowi * p.v.G * mb;
    copy_range(stage + lay.klo, p.k.lo + km, kFastTile * p.k.G * mb);
    copy_range(stage + lay.ksc, p.k.scale + km, kFastTile * p.k.G * mb);
    copy_range(stage + lay.vlo, p.v.lo + vm, kFastTile * p.v.G * mb);
    copy_range(stage + lay.vsc, p.v.scale + vm, kFastTile * p.v.G * mb);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) issue(s);
    cp_async_commit();
  }
  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait_stages();
    __syncthreads();
    if (tile + kStages - 1 < n_tiles) issue(tile + kStages - 1);
    cp_async_commit();
    const unsigned char* stage = ring + (tile % kStages) * lay.stage;
    const std::int64_t t0 = t_begin + static_cast<std::int64_t>(tile) * kFastTile;
#pragma unroll
    for (int u0 = 0; u0 < kTile; u0 += kSub) {
      float s[kSub][NQ];
#pragma unroll
      for (int u = 0; u < kSub; ++u) {
        const int local = (u0 + u) * kGroups + grp;
        const std::int64_t t = t0 + local;
        LaneCodes<KB> kc;
        kc.load_shared(stage + lay.kc + local * p.k.row_bytes + lane * LaneCodes<KB>::kBytes);
        const int mo = (local * p.k.G + kgrp) * mb;
        const float ks = load_meta(stage + lay.ksc + mo, META), kl = load_meta(stage + lay.klo + mo, META);
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          const float v = group_sum(st.packed_score(kc, ks, kl, n));
          s[u][n] = (t >= p.sinks && t <= st.limit[n]) ? v : -INFINITY;
        }
      }
      float pw[kSub][NQ];
      st.softmax(s, pw);
#pragma unroll
      for (int u = 0; u < kSub; ++u) {
        const int local = (u0 + u) * kGroups + grp;
        LaneCodes<VB> vc;
        vc.load_shared(stage + lay.vc + local * p.v.row_bytes + lane * LaneCodes<VB>::kBytes);
        const int mo = (local * p.v.G + kgrp) * mb;
        st.add_packed_value(vc, load_meta(stage + lay.vsc + mo, META), load_meta(stage + lay.vlo + mo, META), pw, u);
      }
    }
    __syncthreads();  // the stage is refilled two tiles later
  }
  write_partial<NQ, VB>(p, row0, split, b, h, lane, grp, st);
}

__global__ void combine_kernel(const AttnParams p, const int* vperm_all, float* out) {
  const std::int64_t qrow = blockIdx.x;  // (b * Hq + hq) * Sq + i
  const int hq = static_cast<int>((qrow / p.Sq) % p.Hq), h = hq / (p.Hq / p.Hkv);
  const int j = threadIdx.x;
  float M = -INFINITY;
  for (int s = 0; s < p.splits; ++s) M = fmaxf(M, p.ws_m[qrow * p.splits + s]);
  float L = 0.0f, A = 0.0f;
  for (int s = 0; s < p.splits; ++s) {
    const float ms = p.ws_m[qrow * p.splits + s];
    if (ms == -INFINITY) continue;
    const float w = fast_exp2(ms - M);
    L += p.ws_l[qrow * p.splits + s] * w;
    A += p.ws_acc[(qrow * p.splits + s) * kD + j] * w;
  }
  const int dst = vperm_all ? vperm_all[h * kD + j] : j;
  out[qrow * kD + dst] = A / L;
}

template <int KB, int VB>
void launch_fast_rows(const AttnParams& p, int splits, cudaStream_t stream) {
  const int n_rows = (p.Hq / p.Hkv) * p.Sq;
  const dim3 grid(splits, p.Hkv, p.B);
  const int smem = kStages * FastLayout(p).stage;
  int row = 0;
  while (row < n_rows) {
    const int left = n_rows - row;
    auto go = [&](auto kernel, int nq) {
      SKVQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      kernel<<<grid, kThreads, smem, stream>>>(p, row);
      SKVQ_CUDA_LAUNCH_CHECK();
      row += nq;
    };
    auto by_meta = [&](auto k16, auto k32, auto k8, int nq) {
      if (p.meta == 0) go(k16, nq);
      else if (p.meta == 1) go(k32, nq);
      else go(k8, nq);
    };
    if (left >= 4) by_meta(attn_fast_kernel<KB, VB, 4, 0>, attn_fast_kernel<KB, VB, 4, 1>, attn_fast_kernel<KB, VB, 4, 2>, 4);
    else if (left >= 2) by_meta(attn_fast_kernel<KB, VB, 2, 0>, attn_fast_kernel<KB, VB, 2, 1>, attn_fast_kernel<KB, VB, 2, 2>, 2);
    else by_meta(attn_fast_kernel<KB, VB, 1, 0>, attn_fast_kernel<KB, VB, 1, 1>, attn_fast_kernel<KB, VB, 1, 2>, 1);
  }
}

template <int KB, int VB, bool DENSE>
void launch_rows(const AttnParams& p, cudaStream_t stream) {
  const int n_rows = (p.Hq / p.Hkv) * p.Sq;
  const dim3 grid(p.n_ranges ? p.n_ranges : p.splits, p.Hkv, p.B);
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

}  // namespace

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

void run_attention(AttnParams p, bool dense, int requested_splits, float* out, cudaStream_t stream) {
  if (p.D != kD) throw Error("skvq: cuda attend supports head_dim 128 only, got " + std::to_string(p.D));
  if (!dense) {  // t / window as (t * magic) >> shift, exact for t < 2^32
    int sh = 0;
    while ((1LL << sh) < p.window) ++sh;
    p.div_shift = 32 + sh;
    p.div_magic = static_cast<unsigned long long>((((__uint128_t)1 << p.div_shift) + p.window - 1) / p.window);
  }
  // Packed body through the pipelined kernel when tiles of 64 rows fit the window;
  // exact sinks and tail (and everything else) through the general kernel.
  const bool fast = !dense && p.window % kFastTile == 0 && p.q_end > 0;
  int fast_splits = 0;
  AttnParams gen = p;
  if (fast) {
    AttnParams body = p;
    body.kv_len = p.q_end;
    fast_splits = choose_splits(body, requested_splits);
    p.split_len = (p.q_end + fast_splits - 1) / fast_splits;
    p.split_len = (p.split_len + kFastTile - 1) / kFastTile * kFastTile;
    fast_splits = static_cast<int>((p.q_end + p.split_len - 1) / p.split_len);
    gen.n_ranges = 0;
    if (p.sinks > 0) gen.range_begin[gen.n_ranges] = 0, gen.range_end[gen.n_ranges++] = p.sinks;
    if (p.kv_len > p.q_end) gen.range_begin[gen.n_ranges] = p.q_end, gen.range_end[gen.n_ranges++] = p.kv_len;
    gen.split_base = fast_splits;
    p.splits = fast_splits + gen.n_ranges;
  } else {
    p.splits = choose_splits(p, requested_splits);
    p.split_len = (p.kv_len + p.splits - 1) / p.splits;
    p.split_len = (p.split_len + kGroups * kTile - 1) / (kGroups * kTile) * (kGroups * kTile);
    p.splits = static_cast<int>((p.kv_len + p.split_len - 1) / p.split_len);
  }
  const std::int64_t rows = static_cast<std::int64_t>(p.B) * p.Hq * p.Sq;
  float* ws = nullptr;
  const std::size_t ws_bytes = static_cast<std::size_t>(rows) * p.splits * (2 + kD) * sizeof(float);
  SKVQ_CUDA_CHECK(cudaMallocAsync(&ws, ws_bytes, stream));
  p.ws_m = ws;
  p.ws_l = ws + rows * p.splits;
  p.ws_acc = ws + 2 * rows * p.splits;
  gen.ws_m = p.ws_m, gen.ws_l = p.ws_l, gen.ws_acc = p.ws_acc, gen.splits = p.splits;
  if (!fast) gen = p;
  const int kb = dense ? 16 : p.k.bits, vb = dense ? 16 : p.v.bits;
  auto both = [&](auto fast_launch, auto gen_launch) {
    if (fast) fast_launch(p, fast_splits, stream);
    if (!fast || gen.n_ranges > 0) gen_launch(gen, stream);
  };
  if (dense) launch_rows<2, 2, true>(p, stream);
  else if (kb == 2 && vb == 2) both(launch_fast_rows<2, 2>, launch_rows<2, 2, false>);
  else if (kb == 4 && vb == 4) both(launch_fast_rows<4, 4>, launch_rows<4, 4, false>);
  else if (kb == 8 && vb == 8) both(launch_fast_rows<8, 8>, launch_rows<8, 8, false>);
  else if (kb == 1 && vb == 1) both(launch_fast_rows<1, 1>, launch_rows<1, 1, false>);
  else if (kb == 4 && vb == 2) both(launch_fast_rows<4, 2>, launch_rows<4, 2, false>);
  else if (kb == 8 && vb == 4) both(launch_fast_rows<8, 4>, launch_rows<8, 4, false>);
  else {
    cudaFreeAsync(ws, stream);
    throw Error("skvq: cuda attend supports bits (key, value) in (1,1) (2,2) (4,4) (8,8) (4,2) (8,4), got (" +
                std::to_string(kb) + ", " + std::to_string(vb) + ")");
  }
  combine_kernel<<<static_cast<unsigned>(rows), kD, 0, stream>>>(p, dense ? nullptr : p.v.perm, out);
  SKVQ_CUDA_LAUNCH_CHECK();
  SKVQ_CUDA_CHECK(cudaFreeAsync(ws, stream));
}

}  // namespace skvq::cuda
