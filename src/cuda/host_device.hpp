// Macros of the code that host and device share (clip_proxy.hpp, tc_codes.hpp), so that host tests
// check it without a GPU: SKVQ_HD_INLINE marks a function for both sides, inlined; SKVQ_UNROLL
// unrolls the loop after it on the device (nothing on the host).
#pragma once

#if defined(__CUDACC__)
#define SKVQ_HD_INLINE __host__ __device__ __forceinline__
#define SKVQ_UNROLL _Pragma("unroll")
#else
#define SKVQ_HD_INLINE inline
#define SKVQ_UNROLL
#endif
