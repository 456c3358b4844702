// Packed codes widened to a width the token-major kernel has (attend.cu, attn_tmma_kernel's SRC):
// a tile's 3-bit key and value rows become 4-bit rows, 1-bit rows 2-bit ones, in shared memory, so that
// 3- and 1-bit caches decode through the integer tensor-core kernel's 4- and 2-bit forms (session 65).
// Host and device share this code, so a host test (tests/test_cuda.cpp, CudaWiden.*) checks it
// without a GPU.
#pragma once

#include "cuda/host_device.hpp"
#include "cuda/tc_codes.hpp"

namespace skvq::cuda::widen {

// The eight 3-bit codes in bits 0-23 of x (code j at bits 3j to 3j + 2; bits 24-31 ignored) as eight
// 4-bit ones (code j in nibble j, its top bit 0): codes 0-3 to bits 0-11 and 4-7 to bits 16-27 of y,
// then code j of each half moved up by j bits.
SKVQ_HD_INLINE unsigned word3(unsigned x) {
  const unsigned y = (x & 0x00000FFFu) | ((x << 4) & 0x0FFF0000u);
  return (y & 0x00070007u) | ((y << 1) & 0x00700070u) | ((y << 2) & 0x07000700u) | ((y << 3) & 0x70007000u);
}

// The sixteen 1-bit codes in bits 0-15 of x (bits 16-31 ignored) as sixteen 2-bit ones (code j at
// bits 2j and 2j + 1, the upper 0): each step moves the upper half of every field up by its width.
SKVQ_HD_INLINE unsigned word1(unsigned x) {
  x = ((x & 0xFF00u) << 8) | (x & 0x00FFu);
  x = (x | (x << 4)) & 0x0F0F0F0Fu;
  x = (x | (x << 2)) & 0x33333333u;
  return (x | (x << 1)) & 0x55555555u;
}

// FROM-bit codes as TO-bit ones, 32 codes (a chunk: FROM words in, TO words out, LSB first) at a time.
template <int FROM>
struct Widen;
template <>
struct Widen<3> {
  static constexpr int kTo = 4, kIn = 3, kOut = 4;  // (words a chunk)
  // output word j takes input bits 24j to 24j + 23
  SKVQ_HD_INLINE static void chunk(const unsigned (&in)[kIn], unsigned (&out)[kOut]) {
    out[0] = word3(in[0]);
    out[1] = word3(tc::funnel_r(in[0], in[1], 24));
    out[2] = word3(tc::funnel_r(in[1], in[2], 16));
    out[3] = word3(in[2] >> 8);
  }
};
template <>
struct Widen<1> {
  static constexpr int kTo = 2, kIn = 1, kOut = 2;
  SKVQ_HD_INLINE static void chunk(const unsigned (&in)[kIn], unsigned (&out)[kOut]) {
    out[0] = word1(in[0]);
    out[1] = word1(in[0] >> 16);
  }
};

// Whether FROM-bit codes are widened (FROM 1 or 3), and to what.
constexpr bool widens(int from) { return from == 1 || from == 3; }
constexpr int widened(int from) { return from == 3 ? Widen<3>::kTo : Widen<1>::kTo; }

}  // namespace skvq::cuda::widen
