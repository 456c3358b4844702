// The clip search's choice from an approximate error a factor, certified.
//
// The spec picks the factor whose error, summed in slot order with every
// operation rounded separately, is smallest (ties to the earlier factor).
// Summing it exactly costs ~9-12 operations a slot and factor, most of them
// comparisons and selects on the integer/ALU pipe. Here each factor's error
// is estimated with 5 float operations a slot (an FMA for the quotient, the
// rounding by 1.5 * 2^23 after a clamp, a subtraction, an FMA into the sum:
// the distance to the nearest code, in scale units), and each estimate comes
// with a rigorous bound on its distance from the spec's float32 sum. When the
// smallest estimate's interval lies below every other factor's, with a
// margin that survives the spec's final rounding (sum * 1/g), it is the
// spec's choice; otherwise the caller sums the errors exactly. The bound's
// derivation is in docs/numerics.md ("The clip search's certified choice").
//
// Host and device share this code, so the tests check its choices on the
// host against the spec's exact sums (tests/test_cuda.cpp).
#pragma once

#include <cmath>

#include "cuda/host_device.hpp"

namespace skvq::cuda::clip {

// Separately rounded float operations (no contraction on either side: the
// host's numerics flags and explicit intrinsics on the device).
SKVQ_HD_INLINE float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
SKVQ_HD_INLINE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SKVQ_HD_INLINE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
// (as written, not fminf / fmaxf: with those the 2-bit search kernel at groups of 128 measured 3% slower,
// session 28, though it executed fewer instructions)
SKVQ_HD_INLINE float min_f(float a, float b) { return a < b ? a : b; }
SKVQ_HD_INLINE float max_f(float a, float b) { return a > b ? a : b; }
// (fabs, not a < 0 ? -a : a: that keeps -0 and costs a compare and a select; |a| is an operand
// modifier of the FADD that takes it)
SKVQ_HD_INLINE float abs_f(float a) { return std::fabs(a); }

constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: x + kMagic - kMagic = rint(x) for |x| < 2^22
constexpr float kU = 0x1p-24f;         // unit roundoff of float32

// NA factors of one group at BITS-bit codes: lo, scale and inv = RN(1 /
// scale) as the flush forms them (after the metadata rounding), levels L =
// 2^BITS - 1.
//
// At 1 to 4 bits (kFold) a slot's distance to the nearest code comes from
// the quotient centred on the codes, a = RN(x * inv - cm) with cm = RN(c0 +
// L / 2) (the codes then lie at +-0.5, +-1.5, .. +-L / 2), folded BITS times:
// the codes are symmetric about 0, so |a| keeps the distance; the positive
// ones about (L + 1) / 4, so | |a| - (L + 1) / 4 | keeps it; and so on down to
// the last code, 0.5, whose distance is the last fold's |v - 0.5|. A clipped
// end needs no clamp (past the last code the folds give the distance to it),
// and a slot costs BITS + 2 operations a factor (2 bits: 4, against 5 for
// rint by the 1.5 * 2^23 addition plus 2 for a clamp). From 5 bits the folds
// would cost more than rint and the clamp: there the distance is a - rint(a)
// of the uncentred quotient, the clamp left out where in_range allows.
template <int NA, int BITS>
struct ClipProxy {
  static constexpr bool kFold = BITS <= 4;
  static constexpr float kLevels = static_cast<float>((1 << BITS) - 1);
  static constexpr float kHalfL = kLevels * 0.5f;                   // exact
  // (c0 = RN(lo * inv) is not kept: choose forms it again where it needs it; with c0 as a fifth
  // array the search kernels' 80 registers a thread no longer held the slot loop without spills)
  float inv[NA], cm[NA], even[NA], odd[NA];

  SKVQ_HD_INLINE ClipProxy(const float (&lo)[NA], const float (&inv_)[NA]) {
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) {
      inv[a] = inv_[a];
      const float c0 = mul_rn(lo[a], inv_[a]);
      cm[a] = kFold ? add_rn(c0, kHalfL) : c0;
      even[a] = odd[a] = 0.0f;
    }
  }

  // kFold: (x - lo) / scale - L / 2 approximately; else (x - lo) / scale.
  SKVQ_HD_INLINE float quotient(float x, int a) const { return fma_rn(x, inv[a], -cm[a]); }
  // The square of the quotient's distance to the nearest of the codes added
  // to acc. kClamp (8 bits only) false: only where in_range holds (then rint
  // alone lands on a code).
  template <bool kClamp = true>
  SKVQ_HD_INLINE void add(float x, int a, float& acc) const {
    const float av = quotient(x, a);
    float d;
    if constexpr (kFold) {
      d = av;
SKVQ_UNROLL
      for (int m = (1 << BITS) / 4; m >= 1; m /= 2) d = add_rn(abs_f(d), -static_cast<float>(m));
      d = add_rn(abs_f(d), -0.5f);
    } else {
      const float r = add_rn(add_rn(kClamp ? min_f(max_f(av, 0.0f), kLevels) : av, kMagic), -kMagic);
      d = add_rn(av, -r);
    }
    acc = fma_rn(d, d, acc);
  }
  // Two slots (even, odd): two sums a factor, half as long (a smaller bound, more independent chains).
  template <bool kClamp = true>
  SKVQ_HD_INLINE void add2(float x0, float x1) {
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) {
      add<kClamp>(x0, a, even[a]);
      add<kClamp>(x1, a, odd[a]);
    }
  }
  template <bool kClamp = true>
  SKVQ_HD_INLINE void add1(float x) {
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) add<kClamp>(x, a, even[a]);
  }
  // Whether every quotient of the group (between those of its extremes: the
  // estimate is monotonic in x) lies in [-0.5, levels + 0.5), where rint
  // already gives the nearest code and the clamp can be left out (8 bits;
  // the folds need no clamp: always true there).
  SKVQ_HD_INLINE bool in_range(float gmin, float gmax) const {
    if constexpr (kFold) return true;
    bool ok = true;
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) ok = ok && quotient(gmin, a) >= -0.5f && quotient(gmax, a) < add_rn(kLevels, 0.5f);
    return ok;
  }

  // The radius of one factor's interval around C = RN(s^2 P): s its scale,
  // P its estimate, qm a bound on every |q| of the group (q = (x - lo) /
  // scale exactly), alo = |lo|, bey = how far a quotient at an extreme lies
  // past the codes (0 inside), eu a bound on |a - q| (a the estimate's
  // quotient, centred or not), ef (kFold) a bound on the folds' roundings,
  // with the group's g slots (docs/numerics.md). Every term is a sum or
  // product of non-negative values, non-decreasing in each argument: at the
  // factors' largest arguments it bounds every factor's.
  SKVQ_HD_INLINE static float radius(float s, float P, float qm, float alo, float bey, float C, float eu, float ef, int g) {
    const float fg = static_cast<float>(g);
    const float m = static_cast<float>((g + 1) / 2 + 1);  // roundings in a slot's path through its sum
    const float gam_p = mul_rn(m * 1.001f, kU);                               // the proxy's sums (two halves, then their sum)
    const float gam_e = mul_rn(fg * 1.001f, kU);                              // the spec's sum of g terms in order
    const float s2 = mul_rn(s, s);
    // largest distance to a code (0.5 inside the range, more for a clipped end)
    const float dm = max_f(0.5f, bey + eu) + eu;
    // the proxy: each |d| within eta of the exact distance (the quotient's error, then the
    // distance's own roundings: the folds', or d = RN(a - rint(a))'s); the squares' sum within ep of P
    const float eta = eu + (kFold ? ef : kU * (dm + eu));
    const float ep = gam_p * P * 1.001f + fg * (2.0f * dm * eta + eta * eta);
    // the spec: codes from RN(RN(x - lo) / scale) (within epsq of q), reconstructions rounded twice,
    // differences and squares rounded, g terms summed in order (a subnormal square: 2^-149 off)
    const float epsq = 2.01f * kU * qm + 0x1p-120f;
    const float rho = kU * (2.01f * kLevels * s + alo);
    const float em = s * (dm + 2.0f * epsq);
    const float etas = rho + kU * (em + rho);
    const float term = 2.0f * em * etas + etas * etas + kU * (em + etas) * (em + etas) +
                       s2 * (4.0f * dm * epsq + 4.0f * epsq * epsq) + 0x1p-140f;
    const float nup = s2 * (P + ep);
    const float ec = fg * term + gam_e * (nup + fg * term);
    // every term above is a sum or product of non-negative values: a 2^-10 slack covers their roundings
    return (s2 * ep + ec) * (1.0f + 0x1p-10f) + 4.0f * kU * C;
  }

  // Whether the smallest C (its factor in b) lies clear of every other
  // factor's interval, each factor's radius R[a].
  // (The smallest's C and R are carried as values: indexing C and R by b
  // would put both arrays in local memory on the device.)
  SKVQ_HD_INLINE static bool separated(const float (&C)[NA], const float (&R)[NA], int& b) {
    b = 0;
    float Cb = C[0], Rb = R[0];
SKVQ_UNROLL
    for (int a = 1; a < NA; ++a)
      if (C[a] < Cb) b = a, Cb = C[a], Rb = R[a];
    const float top = Cb + Rb;
    // the chosen sum well above the smallest normal float times g (so sum * 1/g keeps the order)
    if (!(Cb - Rb > 0x1p-95f)) return false;
    bool ok = true;
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a)
      if (a != b) ok = ok && (C[a] - R[a]) - top > 0x1p-19f * (C[a] + Cb);
    return ok;
  }

  // After every slot of the group went through add2 / add1 (g slots, gmin
  // and gmax their extremes, all finite): true and the spec's choice in
  // `best` when certified; false when the intervals overlap or the bound
  // does not apply (then sum the errors exactly). One radius, at the
  // factors' largest arguments, first serves every factor (one evaluation
  // instead of NA: nearly every ordinary group is certified by it); where it
  // is too wide, each factor's own. `shared` (tests): whether the one radius
  // certified the choice.
  SKVQ_HD_INLINE bool choose(const float (&lo)[NA], const float (&scale)[NA], float gmin, float gmax, int g, int& best,
                      bool* shared = nullptr) const {
    float C[NA], P[NA], qm[NA], bey[NA], eu[NA], ef[NA];
    float smax = 0.0f, Pmax = 0.0f, qmax = 0.0f, lmax = 0.0f, bmax = 0.0f, Cmax = 0.0f, umax = 0.0f, fmax = 0.0f;
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) {
      const float s = scale[a];
      const float avmin = quotient(gmin, a), avmax = quotient(gmax, a);
      const float ci = abs_f(mul_rn(lo[a], inv[a])), cc = abs_f(cm[a]);
      const float amax = max_f(abs_f(avmin), abs_f(avmax));
      // the bound holds with |c0|, |cm|, |a| <= 2^20 and a positive scale
      if (!(ci <= 0x1p20f && cc <= 0x1p20f && amax <= 0x1p20f && s > 0.0f)) return false;
      if constexpr (kFold) {
        // a = RN(x inv - cm) against q - L / 2: |x inv - c0 - q| <= u (|q| + 1.001 |c0|), cm is
        // c0 + L / 2 within u |cm|, a rounds once; every |q| <= |a| + 1 + L / 2
        qm[a] = amax + 1.0f + kHalfL;
        bey[a] = max_f(amax - kHalfL, 0.0f);
        eu[a] = kU * (2.01f * (amax + 1.0f) + 0.51f * kLevels + 1.01f * ci + 1.01f * cc) + 0x1p-120f;
        // BITS folds, each rounding once (each fold is 1-Lipschitz): with the fold points m_1 = (L + 1) / 4,
        // .., m_BITS = 0.5 (summing to L / 2), fold k's value is at most m_k + bey, the |a| of a slot up to
        // L / 2 + 0.5 giving at most m_k and one further out m_k plus its excess
        ef[a] = 1.01f * kU * (kHalfL + static_cast<float>(BITS) * bey[a]);
      } else {
        qm[a] = amax + 1.0f;
        bey[a] = max_f(max_f(-avmin, avmax - kLevels), 0.0f);
        // |av - q| <= 2^-24 (2.01 |q| + 1.01 |c0|) with |c0|, |av| <= 2^20 (+ a subnormal's absolute error)
        eu[a] = kU * (2.01f * qm[a] + 1.01f * ci) + 0x1p-120f;
        ef[a] = 0.0f;
      }
      P[a] = add_rn(even[a], odd[a]);
      C[a] = mul_rn(mul_rn(s, s), P[a]);
      if (!(C[a] < 0x1p100f)) return false;
      smax = max_f(smax, s), Pmax = max_f(Pmax, P[a]), qmax = max_f(qmax, qm[a]), umax = max_f(umax, eu[a]);
      fmax = max_f(fmax, ef[a]), lmax = max_f(lmax, abs_f(lo[a])), bmax = max_f(bmax, bey[a]), Cmax = max_f(Cmax, C[a]);
    }
    float R[NA];
    const float Rall = radius(smax, Pmax, qmax, lmax, bmax, Cmax, umax, fmax, g);
    if (Rall < 0x1p100f) {
SKVQ_UNROLL
      for (int a = 0; a < NA; ++a) R[a] = Rall;
      if (separated(C, R, best)) {
        if (shared) *shared = true;
        return true;
      }
    }
    if (shared) *shared = false;
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) {
      R[a] = radius(scale[a], P[a], qm[a], abs_f(lo[a]), bey[a], C[a], eu[a], ef[a], g);
      if (!(R[a] < 0x1p100f)) return false;
    }
    return separated(C, R, best);
  }
};

}  // namespace skvq::cuda::clip

