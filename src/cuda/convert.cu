// Input rows of bf16 or fp32 keys and values rounded to the device cache's fp16 on the device
// (DeviceCache::append_device with a dtype): into the live tail directly, or into a scratch buffer
// that the flush kernels then read as they read fp16 input.
#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/kernels.cuh"

namespace skvq::cuda {
namespace {

struct RowCopy {
  std::int64_t rows_bh = 0, src_tokens = 0, first = 0, n = 0, dst_tokens = 0, dst_first = 0;
  int D = 0;
};

// Eight channels a thread (D is a multiple of 16): loaded as 16-byte vectors where VEC (the source
// rows 16-byte aligned), else one element at a time; stored as one 16-byte vector of fp16, each
// value rounded to nearest even as the host conversion rounds it.
template <typename T, bool VEC>
__global__ void __launch_bounds__(256) rows_to_half_kernel(const RowCopy c, const T* __restrict__ src, __half* __restrict__ dst) {
  const std::int64_t per_row = c.D / 8, total = c.rows_bh * c.n * per_row;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = e / per_row, j = (e - row * per_row) * 8;
    const std::int64_t bh = row / c.n, i = row - bh * c.n;
    const T* s = src + (bh * c.src_tokens + c.first + i) * c.D + j;
    float x[8];
    if constexpr (VEC) {
      constexpr int kPer = 16 / sizeof(T);  // elements a 16-byte load
#pragma unroll
      for (int u = 0; u < 8 / kPer; ++u) {
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(s) + u);
        const T* t = reinterpret_cast<const T*>(&w);
#pragma unroll
        for (int k = 0; k < kPer; ++k) x[u * kPer + k] = to_float(t[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) x[k] = to_float(s[k]);
    }
    uint4 out;
    __half2* h = reinterpret_cast<__half2*>(&out);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __halves2half2(__float2half_rn(x[2 * k]), __float2half_rn(x[2 * k + 1]));
    *reinterpret_cast<uint4*>(dst + (bh * c.dst_tokens + c.dst_first + i) * c.D + j) = out;
  }
}

template <typename T>
void launch_rows_to_half(const RowCopy& c, const void* src, __half* dst, cudaStream_t stream) {
  const std::int64_t total = c.rows_bh * c.n * (c.D / 8);
  const int blocks = static_cast<int>(std::min<std::int64_t>((total + 255) / 256, 132 * 16));
  const T* s = static_cast<const T*>(src);
  if (reinterpret_cast<std::uintptr_t>(src) % 16 == 0) {
    rows_to_half_kernel<T, true><<<blocks, 256, 0, stream>>>(c, s, dst);
  } else {
    rows_to_half_kernel<T, false><<<blocks, 256, 0, stream>>>(c, s, dst);
  }
  SKVQ_CUDA_LAUNCH_CHECK();
}

}  // namespace

void run_rows_to_half(const void* src, DType src_type, std::int64_t rows_bh, std::int64_t src_tokens, std::int64_t first,
                      std::int64_t n, __half* dst, std::int64_t dst_tokens, std::int64_t dst_first, int D,
                      cudaStream_t stream) {
  if (rows_bh * n == 0) return;
  const RowCopy c{rows_bh, src_tokens, first, n, dst_tokens, dst_first, D};
  if (src_type == DType::f32) {
    launch_rows_to_half<float>(c, src, dst, stream);
  } else {
    launch_rows_to_half<__nv_bfloat16>(c, src, dst, stream);
  }
}

}  // namespace skvq::cuda
