// The code unpacking of the general path's tensor-core kernel (attend_tc.cu): packed key codes of 1
// to 8 bits and value codes of 1 to 8 bits (8-bit values as two 4-bit planes) into the fp16 / bf16
// mantissas of its mma.sync B registers. Host and device
// share this code, so a host test (tests/test_cuda.cpp, CudaTcCodes.*) checks every width, lane and
// k-step against the packed codes without a GPU.
#pragma once

#include <cstdint>

#include "cuda/host_device.hpp"

namespace skvq::cuda::tc {

// __funnelshift_r: the low 32 bits of (hi:lo) >> (s & 31).
SKVQ_HD_INLINE unsigned funnel_r(unsigned lo, unsigned hi, int s) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, s);
#else
  return static_cast<unsigned>(((static_cast<std::uint64_t>(hi) << 32) | lo) >> (s & 31));
#endif
}
// __byte_perm: byte i of the result is byte (s >> 4 i) & 7 of (y:x).
SKVQ_HD_INLINE unsigned byte_perm(unsigned x, unsigned y, unsigned s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const std::uint64_t v = (static_cast<std::uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  return r;
#endif
}

// The code widths that have a kernel of their own: 2 and 4 bits each side, and 1, 3, 5, 6 or 7 bits
// both sides (session 60).
constexpr bool tc_widths_ok(int kb, int vb) {
  const bool whole = (kb == 2 || kb == 4) && (vb == 2 || vb == 4);
  return whole || (kb == vb && (kb == 1 || kb == 3 || kb == 5 || kb == 6 || kb == 7));
}
// The widths a side's codes may have in the kernel at all: keys 1 to 8 bits (fp16 1 + c / 2^KB holds
// 8 bits exactly), values 1 to 8 (bf16 1 + c / 2^VB up to 7 bits; 8-bit values, whose codes would not
// fit a bf16's mantissa, as two 4-bit planes: ValuePair). At head dim 128 the pairs without a kernel
// of their own (session 63; 8-bit values session 64) take one whose widths are read at run time
// (attend_tc.cu, kAnyWidth); elsewhere they go to the float kernel, which keeps the number of
// kernels down.
constexpr int kMaxKeyBits = 8, kMaxValueBits = 8;
constexpr bool tc_any_widths_ok(int kb, int vb) { return kb >= 1 && kb <= kMaxKeyBits && vb >= 1 && vb <= kMaxValueBits; }
// A value group's packed segment of a row (GS VB / 8 bytes) is whole 32-bit words, so that it starts on
// a word boundary (ValueChunk); lane chunks of any bit length then follow (whole bytes: Raw; other
// lengths: ValueChunk::from_words).
constexpr bool tc_chunk_ok(int gs, int vb) { return gs * vb >= 32 && gs * vb % 32 == 0; }

// BYTES bytes as words (loaded on the device from p, aligned to the largest power of two, up to 16,
// that divides BYTES); a trailing part word holds the last 1-3 bytes in its low bits (zero above).
template <int BYTES>
struct Raw {
  static constexpr int kWords = (BYTES + 3) / 4;
  unsigned w[kWords];
#if defined(__CUDACC__)
  __device__ __forceinline__ void load(const unsigned char* p) {
    if constexpr (BYTES % 16 == 0) {
#pragma unroll
      for (int i = 0; i < BYTES / 16; ++i) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
    } else if constexpr (BYTES % 8 == 0) {
#pragma unroll
      for (int i = 0; i < BYTES / 8; ++i) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + i);
        w[2 * i] = v.x, w[2 * i + 1] = v.y;
      }
    } else if constexpr (BYTES % 4 == 0) {
#pragma unroll
      for (int i = 0; i < BYTES / 4; ++i) w[i] = __ldg(reinterpret_cast<const unsigned*>(p) + i);
    } else if constexpr (BYTES % 2 == 0) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = 0u;
#pragma unroll
      for (int i = 0; i < BYTES / 2; ++i) w[i / 2] |= static_cast<unsigned>(__ldg(reinterpret_cast<const unsigned short*>(p) + i)) << (16 * (i % 2));
    } else {  // odd: a byte at a time
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = 0u;
#pragma unroll
      for (int i = 0; i < BYTES; ++i) {
        w[i / 4] |= static_cast<unsigned>(__ldg(p + i)) << (8 * (i % 4));
      }
    }
  }
#endif
  // byte e
  SKVQ_HD_INLINE unsigned byte(int e) const { return (w[e / 4] >> (8 * (e % 4))) & 0xFFu; }
};

// x shifted left by s (right by -s), s a compile-time constant
template <int S>
SKVQ_HD_INLINE unsigned shift(unsigned x) {
  if constexpr (S >= 0) return x << S;
  else return x >> (-S);
}

// Key k-step ks of a row (codes LSB first, channel c at bit c KB): lane t's B registers
// b0 = channels (2t, 2t + 8), b1 = (2t + 1, 2t + 9) of the k-step's 16, as fp16 1 + c / 2^KB
// (one: fp16 1.0 twice, opaque). A's registers carry q at the same channels: a0 (k 2t, 2t + 1) =
// channels 2t, 2t + 8 and a2 (k 2t + 8, 2t + 9) = channels 2t + 1, 2t + 9 (key_channel).
// 2-bit: a word a k-step, the codes 2t, 8 + 2t at bits 4t, 16 + 4t; a rotation right by r0 = 4t + 24
// (r1 = 4t + 26 for 2t + 1, 9 + 2t) puts them at bits 8 and 24 at once. 4-bit: two words a k-step,
// byte t of each moved to bytes 0 and 2 (sel), then shifted.
template <int KB, int WORDS>
SKVQ_HD_INLINE void key_frag(const unsigned (&w)[WORDS], int ks, unsigned sel, int r0, int r1, unsigned one, unsigned& b0,
                      unsigned& b1) {
  if constexpr (KB == 2) {
    b0 = (funnel_r(w[ks], w[ks], r0) & 0x03000300u) | one;
    b1 = (funnel_r(w[ks], w[ks], r1) & 0x03000300u) | one;
  } else {
    static_assert(KB == 4, "2- or 4-bit keys");
    const unsigned x = byte_perm(w[2 * ks], w[2 * ks + 1], sel);
    b0 = ((x << 6) & 0x03C003C0u) | one;
    b1 = ((x << 2) & 0x03C003C0u) | one;
  }
}

// Key widths other than 2 and 4 bits (1, 3, 5, 6 and 7, session 60; 8, session 63; at 3, 5, 6 and 7
// bits codes cross bytes): lane t holds channels t, t + 4, t + 8 and t + 12 of each k-step (q slots j = 0-3:
// key_channel), so that after the row is shifted right by KB t bits once a tile (RowShifted: one
// funnel shift a word) every code a lane takes sits at a compile-time bit of the shifted row:
// channel 16 ks + t + 4 j at KB (16 ks + 4 j).
template <int KB, int WORDS>
struct RowShifted {
  unsigned w[WORDS];
  SKVQ_HD_INLINE RowShifted(const unsigned (&raw)[WORDS], int s) {
    SKVQ_UNROLL
    for (int i = 0; i + 1 < WORDS; ++i) w[i] = funnel_r(raw[i], raw[i + 1], s);
    w[WORDS - 1] = raw[WORDS - 1] >> s;
  }
  // the code at bit P of the shifted row moved to bit DST (the bits around it anything; P and DST
  // compile-time constants once the caller's loops unroll). A code that crosses a word has P % 32
  // past 32 - KB, above any DST the fp16 pair takes (at most 26 - KB): one funnel shift right.
  SKVQ_HD_INLINE unsigned at(int P, int DST) const {
    const int i = P / 32, o = P % 32;
    if (o + KB <= 32) return DST >= o ? w[i] << (DST - o) : w[i] >> (o - DST);
    return funnel_r(w[i], w[i + 1], o - DST);
  }
};
template <int KB, int WORDS>
SKVQ_HD_INLINE void key_frag_any(const RowShifted<KB, WORDS>& r, int ks, unsigned one, unsigned& b0, unsigned& b1) {
  constexpr unsigned kLo = ((1u << KB) - 1u) << (10 - KB), kHi = kLo << 16;
  const int p0 = KB * 16 * ks;
  b0 = (r.at(p0, 10 - KB) & kLo) | ((r.at(p0 + 4 * KB, 26 - KB) & kHi) | one);
  b1 = (r.at(p0 + 8 * KB, 10 - KB) & kLo) | ((r.at(p0 + 12 * KB, 26 - KB) & kHi) | one);
}
constexpr bool key_bytes_whole(int kb) { return kb == 2 || kb == 4; }

// A lane's constants for the key unpacking (t = lane % 4): key_frag's byte selector (4 bits) and
// rotations (2 bits), RowShifted's shift (the other widths).
template <int KB>
struct KeyLane {
  unsigned sel;
  int r0, r1, shift;
  SKVQ_HD_INLINE explicit KeyLane(int t)
      : sel(KB == 4 ? static_cast<unsigned>(t | (t << 4) | ((t + 4) << 8) | ((t + 4) << 12)) : 0u),
        r0((4 * t + 24) & 31),
        r1((4 * t + 26) & 31),
        shift(KB * t) {}
};

// The B registers of the KS k-steps of a warp's part of a key row (w: its words, as Raw loads
// them): f(ks, b0, b1) for ks = 0, 1, ..., KS - 1.
template <int KB, int KS, int WORDS, typename F>
SKVQ_HD_INLINE void key_steps(const unsigned (&w)[WORDS], const KeyLane<KB>& kl, unsigned one, F&& f) {
  if constexpr (key_bytes_whole(KB)) {
    SKVQ_UNROLL
    for (int ks = 0; ks < KS; ++ks) {
      unsigned b0, b1;
      key_frag<KB>(w, ks, kl.sel, kl.r0, kl.r1, one, b0, b1);
      f(ks, b0, b1);
    }
  } else {
    const RowShifted<KB, WORDS> row(w, kl.shift);
    SKVQ_UNROLL
    for (int ks = 0; ks < KS; ++ks) {
      unsigned b0, b1;
      key_frag_any(row, ks, one, b0, b1);
      f(ks, b0, b1);
    }
  }
}

// The channel (of the k-step's 16) that lane t's q slot j holds: j = 0, 1: a0's low and high
// halves; j = 2, 3: a2's.
template <int KB>
SKVQ_HD_INLINE int key_channel(int t, int j) {
  if constexpr (!key_bytes_whole(KB)) return t + 4 * j;
  return 2 * t + (j == 1 ? 8 : j == 2 ? 1 : j == 3 ? 9 : 0);
}

// Lane g's value chunk of a group: its GS / 8 codes, bits [g K, (g + 1) K) of the group's packed
// segment (K = GS VB / 8 bits; the segment starts on a word boundary: tc_chunk_ok). Chunks of one
// byte or of whole halfwords load as Raw<kBytes> from their first byte (kByWords false). The others
// (half a byte: 1 bit at groups of 32; 1.5, 2.5 or 3.5 bytes: 3, 5 and 7 bits there; 3 bytes or
// more, odd: odd widths at groups of 64, 2 bits at a group of 96, ...) load as the segment's words
// that hold them (where Raw would load odd byte counts a byte at a time), words(g) of them from
// word first_word(g), shifted down by shift(g) (from_words): what ValuePair takes, as Raw::load
// would give it for a chunk of whole bytes. A lane reads no word past the one that holds its last
// bit, so nothing past the segment.
template <int VB, int GS>
struct ValueChunk {
  static constexpr int kBits = GS * VB / 8;
  static constexpr int kBytes = (kBits + 7) / 8;
  static constexpr bool kByWords = kBits % 8 != 0 || (kBits > 8 && kBits % 16 != 0);
  static constexpr int kWords = (kBits + 31 + 31) / 32;  // the most a chunk spans, from any bit
  SKVQ_HD_INLINE static constexpr int first_word(int g) { return g * kBits / 32; }
  SKVQ_HD_INLINE static constexpr int shift(int g) { return g * kBits % 32; }
  SKVQ_HD_INLINE static constexpr int words(int g) { return (shift(g) + kBits + 31) / 32; }
  // w: words first_word(g), first_word(g) + 1, ... (those from words(g) on anything: shifted out or
  // masked); s: shift(g)
  SKVQ_HD_INLINE static Raw<kBytes> from_words(const unsigned (&w)[kWords], int s) {
    Raw<kBytes> r;
    SKVQ_UNROLL
    for (int i = 0; i < Raw<kBytes>::kWords; ++i) r.w[i] = funnel_r(w[i], i + 1 < kWords ? w[i + 1] : 0u, s);
    // (Raw's trailing part word is zero above its bytes; ValuePair relies on it for one-byte
    // chunks, and masks every code it takes from longer ones)
    if constexpr (kBytes == 1) r.w[0] &= 0xFFu;
    return r;
  }
};

// Value n-tile i of a metadata group: lane g's column is channel g * (GS / 8) + i of the group,
// its chunk of the group (GS / 8 codes, bits [g GS / 8 VB, ..)). From the chunks of two tokens
// (c0: the low half of the register, c1: the high), the bf16 pair 1 + c / 2^VB (reg). At 8 bits,
// whose codes a bf16 mantissa cannot hold, c = 16 h + l is taken as two planes: reg gives
// 1 + h / 16 and reg_low 2^-4 (1 + l / 16) (both exact in bf16), whose sum is 1 + 2^-4 + c / 2^8:
// the kernel multiplies both by the same weights and moves the 2^-4 into the token's offset.
constexpr unsigned kLowPlaneOne = 0x3D803D80u;  // bf16 2^-4 in both halves
template <int VB, int CVB>
struct ValuePair {
  static constexpr int kHalves = (CVB + 1) / 2;
  unsigned x[kHalves];  // halfword h of both chunks: c0's in the low half, c1's in the high
  SKVQ_HD_INLINE ValuePair(const Raw<CVB>& c0, const Raw<CVB>& c1) {
    if constexpr (CVB == 1) {
      x[0] = c0.w[0] | (c1.w[0] << 16);
    } else {
      SKVQ_UNROLL
      for (int h = 0; h < kHalves; ++h) x[h] = byte_perm(c0.w[h / 2], c1.w[h / 2], h % 2 == 0 ? 0x5410u : 0x7632u);
    }
  }
  template <int I>
  SKVQ_HD_INLINE unsigned reg(unsigned one) const {  // one: bf16 1.0 twice, opaque
    if constexpr (VB == 8) return nibble<I, 4>(one);
    else return packed<I>(one);
  }
  // 8 bits: the low plane, 2^-4 (1 + l / 16) (one_low: bf16 2^-4 twice, kLowPlaneOne, opaque)
  template <int I>
  SKVQ_HD_INLINE unsigned reg_low(unsigned one_low) const {
    static_assert(VB == 8, "two planes at 8 bits only");
    return nibble<I, 0>(one_low);
  }

 private:
  // the 4 bits at bit AT of code I's byte into the top of both halves' mantissas (I's byte lies in one halfword)
  template <int I, int AT>
  SKVQ_HD_INLINE unsigned nibble(unsigned base) const {
    constexpr int h = I / 2, pos = 8 * (I % 2) + AT;
    constexpr unsigned kMask = 0xFu << 3;
    return (shift<3 - pos>(x[h]) & (kMask | (kMask << 16))) | base;
  }
  template <int I>
  SKVQ_HD_INLINE unsigned packed(unsigned one) const {
    constexpr int bit = I * VB, h = bit / 16, pos = bit % 16;
    constexpr unsigned kMask = ((1u << VB) - 1u) << (7 - VB);
    if constexpr (pos + VB <= 16) {
      return (shift<(7 - VB) - pos>(x[h]) & (kMask | (kMask << 16))) | one;
    } else {  // (3, 5, 6 or 7 bits) a code across two halfwords: its low bits from x[h], the rest from x[h + 1]
      constexpr int nlo = 16 - pos;  // bits in x[h]
      constexpr unsigned kLo = ((1u << nlo) - 1u) << (7 - VB), kHi = kMask & ~kLo;
      return (shift<(7 - VB) - pos>(x[h]) & (kLo | (kLo << 16))) | ((shift<(7 - VB) + nlo>(x[h + 1]) & (kHi | (kHi << 16))) | one);
    }
  }
};

}  // namespace skvq::cuda::tc

