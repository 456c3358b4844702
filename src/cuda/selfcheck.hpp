// Internal entry points that let the tests check device arithmetic against
// the host's IEEE operations (declared without CUDA headers).
#pragma once

#include <cstdint>

namespace skvq::cuda {

// out[i] = the flush kernel's division-free RN(num[i] / scale[i]) (host
// arrays; exact where nothing overflows or underflows, as for every quotient
// the flush forms from finite fp16 input).
void flush_quotients(const float* num, const float* scale, float* out, std::int64_t n);

}  // namespace skvq::cuda
