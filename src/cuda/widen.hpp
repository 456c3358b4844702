// Packed 3-bit codes widened to 4-bit ones, for the token-major kernel (attend.cu, attn_tmma_kernel's
// SRC): a tile's 3-bit key and value rows become the 4-bit rows its 4-bit form reads, in shared
// memory, so that 3-bit caches decode through the integer tensor-core kernel (session 65). Host and
// device share this code, so a host test (tests/test_cuda.cpp, CudaWiden.*) checks it without a GPU.
#pragma once

#include "cuda/host_device.hpp"
#include "cuda/tc_codes.hpp"

namespace skvq::cuda::widen {

// The stored width that is widened, and the width it becomes.
constexpr int kFrom = 3, kTo = 4;

// The eight 3-bit codes in bits 0-23 of x (code j at bits 3j to 3j + 2; bits 24-31 ignored) as eight
// 4-bit ones (code j in nibble j, its top bit 0): codes 0-3 to bits 0-11 and 4-7 to bits 16-27 of y,
// then code j of each half moved up by j bits.
SKVQ_HD_INLINE unsigned word(unsigned x) {
  const unsigned y = (x & 0x00000FFFu) | ((x << 4) & 0x0FFF0000u);
  return (y & 0x00070007u) | ((y << 1) & 0x00700070u) | ((y << 2) & 0x07000700u) | ((y << 3) & 0x70007000u);
}

// 32 codes of 3 bits (12 bytes as three words, LSB first) as 32 of 4 bits (four words): output word j
// takes input bits 24j to 24j + 23.
SKVQ_HD_INLINE void chunk(const unsigned (&in)[3], unsigned (&out)[4]) {
  out[0] = word(in[0]);
  out[1] = word(tc::funnel_r(in[0], in[1], 24));
  out[2] = word(tc::funnel_r(in[1], in[2], 16));
  out[3] = word(in[2] >> 8);
}

// Bytes a 3-bit chunk takes and a 4-bit one gives.
constexpr int kChunkIn = 12, kChunkOut = 16;

}  // namespace skvq::cuda::widen
