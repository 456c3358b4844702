// Device helpers shared by the attention kernels (attend.cu, attend_general.cu, attend_tc.cu): the
// fast exp2, the fp16 and bf16 MMAs, the output stores in the call's element type,
// the quad sums and the merge of a block's partial softmax states into its split's workspace slot.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/device_state.cuh"

namespace skvq::cuda {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^e, exact, from its exponent bits (-126 <= e <= 127).
__device__ __forceinline__ float pow2(int e) { return __uint_as_float(static_cast<unsigned>(e + 127) << 23); }

// lo, hi rounded to an fp16 pair (low half: lo), as an MMA operand's bits.
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}

// D += A B, mma.sync m16n8k16 (A row-major, B column-major), fp32 sums: fp16 inputs, bf16 inputs.
__device__ __forceinline__ void mma_f16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Output element i (of the [B, Hq, Sq, Dv] array of p.out_type): v rounded to nearest.
__device__ __forceinline__ void store_out(const AttnParams& p, void* out, std::int64_t i, float v) {
  if (p.out_type == kTypeF32) static_cast<float*>(out)[i] = v;
  else if (p.out_type == kTypeF16) static_cast<__half*>(out)[i] = __float2half_rn(v);
  else static_cast<unsigned short*>(out)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// The sum of v over the four lanes of a quad (lanes 4g .. 4g + 3: an MMA fragment's row), in every
// one of them.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Merges n_parts partial softmax states per query row (max m, sum l, acc[dv])
// held in shared memory as [part][row] and writes one partial per row of
// this block to the workspace slot `out_split` (dv: the accumulators a row,
// the values' head dim).
__device__ __forceinline__ void store_merged(const AttnParams& p, int b, int h, int row0, int out_split, int n_parts,
                                             int rows, const float* pm, const float* pl, const float* pacc, int dv) {
  const int G = p.Hq / p.Hkv, n_rows = p.query_rows();
  for (int e = threadIdx.x; e < rows * dv; e += blockDim.x) {
    const int n = e / dv, j = e % dv;
    const int row = row0 + n;
    if (row >= n_rows) continue;
    float M = -INFINITY;
    for (int g = 0; g < n_parts; ++g) M = fmaxf(M, pm[g * rows + n]);
    float L = 0.0f, A = 0.0f;
    if (M != -INFINITY) {
      for (int g = 0; g < n_parts; ++g) {
        const float w = fast_exp2(pm[g * rows + n] - M);
        L += pl[g * rows + n] * w;
        A += pacc[(g * rows + n) * dv + j] * w;
      }
    }
    const int gq = row / p.Sq, i = row % p.Sq;
    const std::int64_t qrow = (static_cast<std::int64_t>(b) * p.Hq + h * G + gq) * p.Sq + i;
    if (j == 0) {
      p.ws_m[qrow * p.splits + out_split] = M;
      p.ws_l[qrow * p.splits + out_split] = L;
    }
    p.ws_acc[(qrow * p.splits + out_split) * dv + j] = A;
  }
}

}  // namespace skvq::cuda
