// Internal entry points that let the tests check device arithmetic against
// the host's IEEE operations (declared without CUDA headers).
#pragma once

#include <cstdint>

namespace skvq::cuda {

// out[i] = the flush kernel's division-free RN(num[i] / scale[i]) (host
// arrays; valid for |quotient| < 2^20, which the kernel checks).
void flush_quotients(const float* num, const float* scale, float* out, std::int64_t n);

}  // namespace skvq::cuda
