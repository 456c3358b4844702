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

#if defined(__CUDACC__)
#define SKVQ_HD __host__ __device__ __forceinline__
#define SKVQ_UNROLL _Pragma("unroll")
#else
#define SKVQ_HD inline
#define SKVQ_UNROLL
#endif

namespace skvq::cuda::clip {

// Separately rounded float operations (no contraction on either side: the
// host's numerics flags and explicit intrinsics on the device).
SKVQ_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
SKVQ_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SKVQ_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SKVQ_HD float min_f(float a, float b) { return a < b ? a : b; }
SKVQ_HD float max_f(float a, float b) { return a > b ? a : b; }
SKVQ_HD float abs_f(float a) { return a < 0.0f ? -a : a; }

constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: x + kMagic - kMagic = rint(x) for |x| < 2^22
constexpr float kU = 0x1p-24f;         // unit roundoff of float32

// NA factors of one group: lo, scale and inv = RN(1 / scale) as the flush
// forms them (after the metadata rounding), levels = 2^bits - 1.
template <int NA>
struct ClipProxy {
  float inv[NA], c0[NA], even[NA], odd[NA];
  float levels;

  SKVQ_HD ClipProxy(const float (&lo)[NA], const float (&inv_)[NA], float levels_) : levels(levels_) {
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) {
      inv[a] = inv_[a];
      c0[a] = mul_rn(lo[a], inv_[a]);
      even[a] = odd[a] = 0.0f;
    }
  }

  // (x - lo) / scale approximately, and the square of its distance to the
  // nearest of 0 .. levels added to acc.
  SKVQ_HD float quotient(float x, int a) const { return fma_rn(x, inv[a], -c0[a]); }
  // kClamp false: only where in_range holds (then rint alone lands on a code).
  template <bool kClamp = true>
  SKVQ_HD void add(float x, int a, float& acc) const {
    const float av = quotient(x, a);
    const float r = add_rn(add_rn(kClamp ? min_f(max_f(av, 0.0f), levels) : av, kMagic), -kMagic);
    const float d = add_rn(av, -r);
    acc = fma_rn(d, d, acc);
  }
  // Two slots (even, odd): two sums a factor, half as long (a smaller bound, more independent chains).
  template <bool kClamp = true>
  SKVQ_HD void add2(float x0, float x1) {
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) {
      add<kClamp>(x0, a, even[a]);
      add<kClamp>(x1, a, odd[a]);
    }
  }
  template <bool kClamp = true>
  SKVQ_HD void add1(float x) {
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) add<kClamp>(x, a, even[a]);
  }
  // Whether every quotient of the group (between those of its extremes: the
  // estimate is monotonic in x) lies in [-0.5, levels + 0.5), where rint
  // already gives the nearest code and the clamp can be left out: at 1 and
  // 2 bits nearly always (the clipped ends lie within 0.27 of the range).
  SKVQ_HD bool in_range(float gmin, float gmax) const {
    bool ok = true;
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) ok = ok && quotient(gmin, a) >= -0.5f && quotient(gmax, a) < add_rn(levels, 0.5f);
    return ok;
  }

  // After every slot of the group went through add2 / add1 (g slots, gmin
  // and gmax their extremes, all finite): true and the spec's choice in
  // `best` when certified; false when the intervals overlap or the bound
  // does not apply (then sum the errors exactly).
  SKVQ_HD bool choose(const float (&lo)[NA], const float (&scale)[NA], float gmin, float gmax, int g, int& best) const {
    const float fg = static_cast<float>(g);
    const float m = static_cast<float>((g + 1) / 2 + 1);  // roundings in a slot's path through its sum
    const float gam_p = mul_rn(m * 1.001f, kU);              // the proxy's sums (two halves, then their sum)
    const float gam_e = mul_rn(fg * 1.001f, kU);             // the spec's sum of g terms in order
    float C[NA], R[NA];
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a) {
      const float s = scale[a], s2 = mul_rn(s, s);
      const float avmin = quotient(gmin, a), avmax = quotient(gmax, a);
      const float ci = abs_f(c0[a]);
      const float amax = max_f(abs_f(avmin), abs_f(avmax));
      // |av - q| <= 2^-24 (2.01 |q| + 1.01 |c0|) for q = (x - lo) / scale exactly; with |c0|, |av| <= 2^20
      // every |q| of the group is below amax + 1 (q is monotonic in x)
      if (!(ci <= 0x1p20f && amax <= 0x1p20f && s > 0.0f)) return false;
      const float qm = amax + 1.0f;
      const float eu = kU * (2.01f * qm + 1.01f * ci) + 0x1p-120f;  // (+ a subnormal's absolute error)
      // largest distance to a code (0.5 inside the range, more for a clipped end)
      const float beyond = max_f(max_f(-avmin, avmax - levels), 0.0f) + eu;
      const float dm = max_f(0.5f, beyond) + eu;
      // the proxy: each |d| within eta of the exact distance; the squares' sum within ep of P
      const float eta = eu + kU * (dm + eu);
      const float P = add_rn(even[a], odd[a]);
      const float ep = gam_p * P * 1.001f + fg * (2.0f * dm * eta + eta * eta);
      // the spec: codes from RN(RN(x - lo) / scale) (within epsq of q), reconstructions rounded twice,
      // differences and squares rounded, g terms summed in order (a subnormal square: 2^-149 off)
      const float epsq = 2.01f * kU * qm + 0x1p-120f;
      const float rho = kU * (2.01f * levels * s + abs_f(lo[a]));
      const float em = s * (dm + 2.0f * epsq);
      const float etas = rho + kU * (em + rho);
      const float term = 2.0f * em * etas + etas * etas + kU * (em + etas) * (em + etas) +
                         s2 * (4.0f * dm * epsq + 4.0f * epsq * epsq) + 0x1p-140f;
      const float nup = s2 * (P + ep);
      const float ec = fg * term + gam_e * (nup + fg * term);
      C[a] = mul_rn(s2, P);
      // every term above is a sum or product of non-negative values: a 2^-10 slack covers their roundings
      R[a] = (s2 * ep + ec) * (1.0f + 0x1p-10f) + 4.0f * kU * C[a];
      if (!(R[a] < 0x1p100f && C[a] < 0x1p100f)) return false;
    }
    int b = 0;
SKVQ_UNROLL
    for (int a = 1; a < NA; ++a)
      if (C[a] < C[b]) b = a;
    const float top = C[b] + R[b];
    // the chosen sum well above the smallest normal float times g (so sum * 1/g keeps the order)
    if (!(C[b] - R[b] > 0x1p-95f)) return false;
    bool ok = true;
SKVQ_UNROLL
    for (int a = 0; a < NA; ++a)
      if (a != b) ok = ok && (C[a] - R[a]) - top > 0x1p-19f * (C[a] + C[b]);
    best = b;
    return ok;
  }
};

}  // namespace skvq::cuda::clip

#undef SKVQ_HD
#undef SKVQ_UNROLL
