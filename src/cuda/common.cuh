// CUDA helpers: every runtime call checked where it is made.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "skvq/error.hpp"

#define SKVQ_CUDA_CHECK(expr)                                                                             \
  do {                                                                                                    \
    const cudaError_t skvq_err_ = (expr);                                                                 \
    if (skvq_err_ != cudaSuccess) {                                                                       \
      throw ::skvq::Error(std::string("skvq: CUDA error in ") + #expr + " at " + __FILE__ + ":" +        \
                          std::to_string(__LINE__) + ": " + cudaGetErrorString(skvq_err_));              \
    }                                                                                                     \
  } while (0)

#define SKVQ_CUDA_LAUNCH_CHECK() SKVQ_CUDA_CHECK(cudaGetLastError())

namespace skvq::cuda {

// The calling thread's current CUDA device.
inline int current_device() {
  int dev = 0;
  SKVQ_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

// The value of environment variable `name`, "" when unset: the backend's test
// and benchmark switches (SKVQ_CUDA_*), each read once by the code it steers.
inline std::string env_switch(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr ? e : "";
}
// An integer switch: `fallback` when unset, else its value as std::atoi reads it.
inline int env_int(const char* name, int fallback) {
  const std::string s = env_switch(name);
  return s.empty() ? fallback : std::atoi(s.c_str());
}

// Groups of query rows that one launch of an attention kernel taking its group from blockIdx.z
// (z = group * B + b: attend.cu's integer tensor-core kernel, attend_chunk.cu's kernel, attend_tc.cu's
// kernel, attend_general.cu's float kernel) holds: a grid's
// z dimension holds at most 65535. SKVQ_CUDA_IMMA_GROUPS=N caps it at N (tests: several launches
// from a few rows).
inline int row_groups_a_launch(int B) {
  static const int cap = env_int("SKVQ_CUDA_IMMA_GROUPS", 65535);
  return std::max(1, std::min(cap, 65535 / std::max(B, 1)));
}
// Calls launch(first_row, n_groups) once a launch for `groups` groups of `rows` query rows each, at
// most row_groups_a_launch(B) groups a launch (the kernel's grid z: n_groups * B).
template <typename F>
void for_row_group_launches(int groups, int rows, int B, F&& launch) {
  const int per = row_groups_a_launch(B);
  for (int g0 = 0; g0 < groups; g0 += per) launch(g0 * rows, std::min(per, groups - g0));
}

// Raises a kernel's function attribute to at least `value` on the current
// device (each device holds its own copy of the kernel, and of its
// attributes): the runtime is called only when the value rises above what
// this process already set there, so a launch pays no attribute call after
// the first. For attributes whose larger value only admits more: the dynamic
// shared memory a launch may take, the shared-memory carveout.
inline void raise_func_attribute(const void* kernel, cudaFuncAttribute attr, int value) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int>, int> set;
  const int dev = current_device();
  const std::lock_guard<std::mutex> lock(mu);
  int& have = set[{dev, kernel, static_cast<int>(attr)}];
  if (value > have) {
    SKVQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, attr, value));
    have = value;
  }
}
// Lets `kernel` use up to `smem` bytes of dynamic shared memory: set once, to
// the largest size asked for so far (occupancy depends on the size of each
// launch, not on the attribute).
template <typename Kernel>
void allow_smem(Kernel kernel, int smem) {
  raise_func_attribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
}

// Metadata codes shared by kernels: 0 fp16, 1 fp32, 2 fp8 e4m3.
__host__ __device__ inline int meta_code(int m) { return m; }

// An input element as float (the bf16 and fp32 rows that append_device rounds to fp16).
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ inline float e4m3_to_float(unsigned char b) {
  const int e = (b >> 3) & 0xf, m = b & 7;
  float a = e == 0 ? ldexpf(static_cast<float>(m), -9) : ldexpf(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -a : a;
}

// Bytes of one metadata value (META as meta_code: fp16, fp32, e4m3).
template <int META>
constexpr int meta_bytes() {
  return META == 0 ? 2 : META == 1 ? 4 : 1;
}

// A metadata value from its stored bits (the low 16 of fp16's, the low 8 of e4m3's), the type a
// template argument (META as meta_code).
template <int META>
__device__ __forceinline__ float meta_value(unsigned bits) {
  if constexpr (META == 1) return __uint_as_float(bits);
  else if constexpr (META == 0) return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  else return e4m3_to_float(static_cast<unsigned char>(bits));
}

__device__ inline float load_meta(const unsigned char* p, int meta) {
  if (meta == 0) return __half2float(*reinterpret_cast<const __half*>(p));
  if (meta == 1) return *reinterpret_cast<const float*>(p);
  return e4m3_to_float(*p);
}

}  // namespace skvq::cuda
