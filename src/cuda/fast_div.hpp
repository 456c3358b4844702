// Division of 32-bit unsigned integers by a divisor fixed at launch: one
// multiply-high, an add and a shift instead of the ~20 instructions of a
// runtime division (Granlund and Montgomery's round-up method). Exact for
// every dividend below 2^31. Host code builds it; kernels and the host test
// divide with it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SKVQ_HD __host__ __device__
#else
#define SKVQ_HD
#endif

namespace skvq::cuda {

struct FastDiv {
  std::uint32_t d = 1, m = 1;
  int s = 0;
  FastDiv() = default;
  // d >= 1: s = ceil(log2 d), m = floor(2^32 (2^s - d) / d) + 1, so that
  // m + 2^32 = ceil(2^(32 + s) / d) (the error term stays below 2^s / 2^31)
  explicit FastDiv(std::uint32_t divisor) : d(divisor) {
    while ((std::uint64_t{1} << s) < d) ++s;
    m = static_cast<std::uint32_t>(((std::uint64_t{1} << 32) * ((std::uint64_t{1} << s) - d)) / d + 1);
  }
  SKVQ_HD std::uint32_t div(std::uint32_t n) const {  // n < 2^31
#if defined(__CUDA_ARCH__)
    const std::uint32_t t = __umulhi(n, m);
#else
    const std::uint32_t t = static_cast<std::uint32_t>((static_cast<std::uint64_t>(n) * m) >> 32);
#endif
    return (t + n) >> s;
  }
};

}  // namespace skvq::cuda

#undef SKVQ_HD
