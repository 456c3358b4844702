// GPU flush: chunk-0 permutations and the clipped min/max group quantizer,
// giving the same codes and metadata as ref::quantize_rows. Every float
// operation goes through an explicitly rounded intrinsic (__fadd_rn, ...),
// which nvcc never contracts into FMAs; the spec's correctly rounded
// quotient (x - lo) / scale is formed without a division (quotient_rn,
// checked against the host's division in tests/test_cuda.cpp).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/clip_proxy.hpp"
#include "cuda/common.cuh"
#include "cuda/fast_div.hpp"
#include "cuda/kernels.cuh"
#include "cuda/selfcheck.hpp"
#include "skvq/cuda.hpp"

namespace skvq::cuda {

namespace {

__device__ __forceinline__ float round_fmt(float v, int mant, int emin, float maxv) {
  const float a = fabsf(v);
  if (a == 0.0f) return v;
  const int e = max(static_cast<int>((__float_as_uint(a) >> 23) & 0xffu), emin + 127);
  const float q = __uint_as_float(static_cast<unsigned>(e - mant) << 23);
  const float inv_q = __uint_as_float(static_cast<unsigned>(254 - (e - mant)) << 23);  // 1/q, exact
  const float r = fminf(__fmul_rn(rintf(__fmul_rn(a, inv_q)), q), maxv);
  return copysignf(r, v);
}

// round_fmt(v, 10, -14, 65504) by the hardware's conversion: IEEE fp16 rounds to nearest, ties to
// even, with the same quanta (2^-24 below 2^-14); where it overflows to infinity (|v| >= 65520), or
// v is NaN, round_fmt saturates at 65504 with v's sign. Two conversions and a test instead of ~12
// operations, ten times a group of the clip search.
__device__ __forceinline__ float round_fp16_sat(float v) {
  const float r = __half2float(__float2half_rn(v));
  return fabsf(r) <= 65504.0f ? r : copysignf(65504.0f, v);
}

__device__ __forceinline__ void round_meta(int meta, float& lo, float& scale) {
  if (meta == 0) {
    lo = round_fp16_sat(lo);
    scale = fmaxf(round_fp16_sat(scale), 5.9604644775390625e-08f);
  } else if (meta == 2) {
    lo = round_fmt(lo, 3, -6, 448.0f);
    scale = fmaxf(round_fmt(scale, 3, -6, 448.0f), 0.001953125f);
  }
}

__device__ __forceinline__ unsigned char e4m3_encode(float v) {
  const unsigned char sign = signbit(v) ? 0x80 : 0x00;
  const float a = fabsf(v);
  if (a == 0.0f) return sign;
  const int e = static_cast<int>((__float_as_uint(a) >> 23) & 0xffu) - 127;
  if (e < -6) return sign | static_cast<unsigned char>(a * 512.0f);
  const int m = static_cast<int>(ldexpf(a, -e) * 8.0f) - 8;
  return sign | static_cast<unsigned char>(((e + 7) << 3) | m);
}

__device__ __forceinline__ void store_meta(unsigned char* p, int meta, float v) {
  if (meta == 0) *reinterpret_cast<__half*>(p) = __float2half_rn(v);
  else if (meta == 1) *reinterpret_cast<float*>(p) = v;
  else *p = e4m3_encode(v);
}

// RN(num / scale) without a division, given inv = RN(1 / scale): q0 =
// RN(num * inv) is within 1.5 ulp of the quotient; one Newton correction
// with an FMA residual makes it faithful (within 1 ulp); then the residual
// num - q1 * scale is exact and RN(q1 + r * inv) is the correctly rounded
// quotient (Markstein's theorem), provided nothing overflows or underflows:
// for finite fp16 x, lo and scale as the flush forms them (scale >= 1e-8,
// num = x - lo zero or above 2^-60) nothing does. Every operation is
// explicitly rounded, so nvcc contracts nothing else into FMAs. Groups with
// a non-finite value take the division (code_by_division).
__device__ __forceinline__ float quotient_rn(float num, float scale, float inv) {
  const float q0 = __fmul_rn(num, inv);
  const float q1 = __fmaf_rn(__fmaf_rn(-q0, scale, num), inv, q0);
  return __fmaf_rn(__fmaf_rn(-q1, scale, num), inv, q1);
}

// x + kRound rounds x (|x| < 2^22) to an integer, ties to even, held in the
// low mantissa bits of the sum; subtracting kRound again gives rint(x).
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23

// RN((x - lo) / scale), the spec's quotient, without the division.
__device__ __forceinline__ float code_quotient(float x, float lo, float scale, float inv) {
  return quotient_rn(__fsub_rn(x, lo), scale, inv);
}

// clamp(rint(RN((x - lo) / scale)), 0, levels) + kRound: the code in the low
// bits. rint and clamp commute (the bounds are integers), so the clamp comes
// first and keeps the sum exact. (A NaN x gives code 0, as the division does.)
// !kClamp: the caller knows the quotient lies in [-0.5, levels + 0.5), where
// rint alone lands in [0, levels] (see quant_kernel).
template <bool kClamp = true>
__device__ __forceinline__ float code_plus_round(float x, float lo, float scale, float inv, float levels) {
  const float q = code_quotient(x, lo, scale, inv);
  return __fadd_rn(kClamp ? fminf(fmaxf(q, 0.0f), levels) : q, kRound);
}

__device__ __forceinline__ float code_by_division(float x, float lo, float scale, float levels) {
  return fminf(fmaxf(rintf(__fdiv_rn(__fsub_rn(x, lo), scale)), 0.0f), levels);
}

// (code * scale + lo - x)^2 for one slot, each operation rounded.
__device__ __forceinline__ float sq_error(float code, float x, float lo, float scale) {
  const float d = __fsub_rn(__fadd_rn(__fmul_rn(code, scale), lo), x);
  return __fmul_rn(d, d);
}

// Element i of the flush's input rounded to fp16 (to nearest, ties to even: the value the host
// conversion, and convert.cu's kernel for the tail, give), as float.
__device__ __forceinline__ float src_as_half(const FlushParams& f, std::int64_t i) {
  if (f.src_type == kTypeF16) return __half2float(f.src[i]);
  const float x = f.src_type == kTypeBF16 ? to_float(reinterpret_cast<const __nv_bfloat16*>(f.src)[i])
                                          : reinterpret_cast<const float*>(f.src)[i];
  return __half2float(__float2half_rn(x));
}

__global__ void perm_kernel(const FlushParams f, DevSide s) {
  extern __shared__ float rg[];
  const int h = blockIdx.x, D = s.D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float mn = INFINITY, mx = -INFINITY;
    for (int b = 0; b < f.B; ++b)
      for (int t = 0; t < f.window; ++t) {
        const float x = src_as_half(f, ((static_cast<std::int64_t>(b) * f.H + h) * f.src_tokens + f.first + t) * D + c);
        mn = fminf(mn, x);
        mx = fmaxf(mx, x);
      }
    rg[c] = __fsub_rn(mx, mn);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    const float r = rg[c];
    int rank = 0;
    for (int c2 = 0; c2 < D; ++c2) {  // stable ascending, NaN last
      const float r2 = rg[c2];
      const bool tie = (r2 == r) || (isnan(r2) && isnan(r));
      rank += (!isnan(r2) && (isnan(r) || r2 < r)) || (tie && c2 < c);
    }
    s.perm[h * D + rank] = c;
  }
}

__device__ __forceinline__ __half2 u32_as_half2(unsigned u) {
  __half2 h;
  memcpy(&h, &u, sizeof(h));
  return h;
}

// Whether the flush stages rows in 8-byte units (FlushLayout): at 4 and 8
// bits without the search (K4V4 g128: 6% faster); at 2 bits, and with the
// search, they measured 1-5% slower (probably their 2- and 4-byte accesses:
// two threads a bank). Decided alike by quant_kernel and its launch.
__host__ __device__ constexpr bool flush_in_units(int bits, int n_factors) { return (bits == 4 || bits == 8) && n_factors == 1; }

// A group's slots as stored in shared memory (fp16, exact), read two at a time.
struct GroupSlots {
  const __half* xs;
  int g;
  bool units8 = false;  // rows in 8-byte units (FlushLayout::units): groups of whole units read 4 slots a load
  __device__ __forceinline__ bool units() const { return units8 && g % 4 == 0; }
  template <typename F>
  __device__ __forceinline__ void each(F&& f) const {
    const __half2* x2 = reinterpret_cast<const __half2*>(xs);
#pragma unroll 4
    for (int i = 0; i < g / 2; ++i) {
      const float2 v = __half22float2(x2[i]);
      f(v.x);
      f(v.y);
    }
    if (g & 1) f(__half2float(xs[g - 1]));
  }
  // The slots in pairs (f2: slots 2i and 2i + 1), a last odd slot through f1,
  // the loop unrolled kUnroll times.
  template <int kUnroll, typename F2, typename F1>
  __device__ __forceinline__ void pairs(F2&& f2, F1&& f1) const {
    const __half2* x2 = reinterpret_cast<const __half2*>(xs);
#pragma unroll kUnroll
    for (int i = 0; i < g / 2; ++i) {
      const float2 v = __half22float2(x2[i]);
      f2(v.x, v.y);
    }
    if (g & 1) f1(__half2float(xs[g - 1]));
  }
  // Smallest and largest slot, compared as fp16 pairs (exact): the minimum
  // skips NaN slots (as fminf does), the maximum is NaN if any slot is (so a
  // group with a NaN slot is not finite and takes the NaN-safe division).
  __device__ __forceinline__ void min_max(float& mn, float& mx) const {
    const __half2* x2 = reinterpret_cast<const __half2*>(xs);
    __half2 lo2 = __halves2half2(xs[0], xs[0]), hi2 = lo2;
    if (units()) {
      const uint2* x4 = reinterpret_cast<const uint2*>(xs);
#pragma unroll 8
      for (int i = 0; i < g / 4; ++i) {
        const uint2 w = x4[i];
        const __half2 a = u32_as_half2(w.x), b = u32_as_half2(w.y);
        lo2 = __hmin2(lo2, __hmin2(a, b));
        hi2 = __hmax2_nan(hi2, __hmax2_nan(a, b));
      }
    } else {
#pragma unroll 8
      for (int i = 0; i < g / 2; ++i) {
        lo2 = __hmin2(lo2, x2[i]);
        hi2 = __hmax2_nan(hi2, x2[i]);
      }
    }
    mn = fminf(__low2float(lo2), __high2float(lo2));
    const float h0 = __low2float(hi2), h1 = __high2float(hi2);
    mx = (isnan(h0) || isnan(h1)) ? NAN : fmaxf(h0, h1);
    if (g & 1) {
      const float x = __half2float(xs[g - 1]);
      mn = fminf(mn, x);
      mx = isnan(x) ? NAN : fmaxf(mx, x);
    }
    // A group of signed zeros alone: the reference (std::min and std::max
    // over the slots in order, ties keeping the earlier) makes both the first
    // slot's zero, so lo takes its sign; the min and max above may pick either.
    if (mn == 0.0f && mx == 0.0f) mn = mx = __half2float(xs[0]);
  }
};

// The lo and scale of every clip factor of a group (the spec's float ops,
// then the metadata rounding).
template <int NA>
struct Factors {
  float lo[NA], scale[NA], inv[NA];
  Factors() = default;
  // tt / levels correctly rounded by quotient_rn (levels a constant; a tt
  // small enough to underflow in it gives a quotient far below the 1e-8 floor)
  __device__ __forceinline__ Factors(const FlushParams& f, float mid, float rng, float levels) {
    const float inv_levels = 1.0f / levels;
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const float tt = __fmul_rn(f.grid[a], rng);  // (the factors came with the launch: constant memory)
      lo[a] = __fsub_rn(mid, __fmul_rn(tt, 0.5f));
      scale[a] = fmaxf(quotient_rn(tt, levels, inv_levels), 1e-8f);
      round_meta(f.meta, lo[a], scale[a]);
      inv[a] = __frcp_rn(scale[a]);
    }
  }
};

// The code of x for one factor: division-free, or (kDivide: groups with a
// non-finite value) by the correctly rounded division itself.
template <bool kDivide>
__device__ __forceinline__ float code_of(float x, float lo, float scale, float inv, float levels) {
  if constexpr (kDivide) return code_by_division(x, lo, scale, levels);
  return __fsub_rn(code_plus_round(x, lo, scale, inv, levels), kRound);
}

// The factor with the smallest mean error (sum * 1/g, rounded), ties to the
// earlier factor: the spec's choice, whichever way the sums were formed.
template <int NA>
__device__ __forceinline__ int best_factor(const float (&err)[NA], float inv_g) {
  int best = 0;
  float best_err = __fmul_rn(err[0], inv_g);
#pragma unroll
  for (int a = 1; a < NA; ++a) {
    const float e = __fmul_rn(err[a], inv_g);
    if (e < best_err) best_err = e, best = a;
  }
  return best;
}

// rint of the spec's quotient q = RN(RN(x - lo) / scale) from an
// approximate one, certified (docs/numerics.md): a = RN(x * inv - c) with
// c = RN(lo * inv) is within 2^-24 (4.02 |q| + 1.02 |c|) of q, so rint(a) =
// rint(q) wherever a - rint(a) (exact) is below thr = 0.5 - 2^-21 (qmax + 1
// + |c|) in size, given |q| <= qmax + 0.5 for the group's values (thr <= 0,
// nothing certified, when qmax or |c| reaches 2^20: also where the rounding
// by 1.5 * 2^23 would no longer be exact).
struct CertifiedRint {
  float c = 0.0f, thr = 0.0f;
  CertifiedRint() = default;
  __device__ __forceinline__ CertifiedRint(float lo, float inv, float qmax) {
    c = __fmul_rn(lo, inv);
    thr = __fsub_rd(0.5f, __fmul_ru(__fadd_ru(__fadd_ru(qmax, 1.0f), fabsf(c)), 0x1p-21f));
  }
  __device__ __forceinline__ float approx(float x, float inv) const { return __fmaf_rn(x, inv, -c); }
  // rint(a) + 1.5 * 2^23; ok becomes false unless certified
  __device__ __forceinline__ float round_plus(float x, float inv, bool& ok) const {
    const float a = approx(x, inv);
    const float t = __fadd_rn(a, kRound);
    ok &= fabsf(__fsub_rn(a, __fsub_rn(t, kRound))) < thr;
    return t;
  }
};

// The spec's choice with finite values and no division: each factor's codes
// by CertifiedRint (the quotient's rint, then the clamp: they commute, the
// bounds being integers), a slot whose code any factor cannot certify coded
// again by the quotients; the errors as in choose_factor. ~12 operations a
// slot and factor instead of ~15.
template <int NA>
__device__ __forceinline__ int choose_factor_certified(const Factors<NA>& F, const GroupSlots& xs, float gmin, float gmax,
                                                       float levels, float inv_g) {
  float err[NA];
  CertifiedRint cr[NA];
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    err[a] = 0.0f;
    const CertifiedRint c0(F.lo[a], F.inv[a], 0.0f);  // |q| is monotonic in x between its ends' bounds
    const float qmax = fmaxf(fabsf(c0.approx(gmin, F.inv[a])), fabsf(c0.approx(gmax, F.inv[a])));
    cr[a] = CertifiedRint(F.lo[a], F.inv[a], qmax);
  }
  xs.each([&](float x) {
    float code[NA];
    bool ok = true;
#pragma unroll
    for (int a = 0; a < NA; ++a) code[a] = fminf(fmaxf(__fsub_rn(cr[a].round_plus(x, F.inv[a], ok), kRound), 0.0f), levels);
    if (!ok) {
#pragma unroll
      for (int a = 0; a < NA; ++a) code[a] = code_of<false>(x, F.lo[a], F.scale[a], F.inv[a], levels);
    }
#pragma unroll
    for (int a = 0; a < NA; ++a) err[a] = __fadd_rn(err[a], sq_error(code[a], x, F.lo[a], F.scale[a]));
  });
  return best_factor(err, inv_g);
}

// The spec's choice: every factor's error summed in slot order with each
// operation rounded (the factors' chains side by side, no branch per value),
// the smallest mean error, ties to the earlier factor.
template <int NA, bool kDivide>
__device__ __forceinline__ int choose_factor(const Factors<NA>& F, const GroupSlots& xs, float levels, float inv_g) {
  float err[NA];
#pragma unroll
  for (int a = 0; a < NA; ++a) err[a] = 0.0f;
  xs.each([&](float x) {
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const float code = code_of<kDivide>(x, F.lo[a], F.scale[a], F.inv[a], levels);
      err[a] = __fadd_rn(err[a], sq_error(code, x, F.lo[a], F.scale[a]));
    }
  });
  return best_factor(err, inv_g);
}

// The spec's choice for the groups of the lanes that `need` it (finite
// groups the estimate did not certify): every factor's error summed exactly,
// in slot order (as choose_factor), but spread over the warp: lane j of a
// pass sums factor j % NA of the (j / NA)-th such group, and that group's
// lane takes the smallest (ties to the earlier factor). Every lane of
// `lanes` (the warp's) calls it with its own group. A warp of fewer than NA
// lanes sums each factor on the group's own lane.
template <int NA>
__device__ __forceinline__ void exact_choices(const Factors<NA>& F, const GroupSlots& xs, bool need, unsigned lanes, float levels,
                                              float inv_g, int& a, bool& chosen) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int per = __popc(lanes) / NA;  // groups a pass
  if (per == 0) {
    if (need) a = choose_factor<NA, false>(F, xs, levels, inv_g), chosen = true;
    return;
  }
  for (;;) {
    const unsigned todo = __ballot_sync(lanes, need && !chosen);  // the same on every lane
    if (todo == 0) return;
    // this lane's share: factor fa of the task-th group of the pass (its lane: the task-th bit of todo)
    const int task = lane / NA, fa = lane % NA;
    unsigned m = todo;
    for (int i = 0; i < task && m != 0; ++i) m &= m - 1;
    const bool busy = task < per && m != 0;
    const int owner = busy ? __ffs(static_cast<int>(m)) - 1 : lane;
    float lo = 0.0f, scale = 1.0f, inv = 1.0f;
#pragma unroll
    for (int b = 0; b < NA; ++b) {
      const float l = __shfl_sync(lanes, F.lo[b], owner), sc = __shfl_sync(lanes, F.scale[b], owner),
                  iv = __shfl_sync(lanes, F.inv[b], owner);
      if (b == fa) lo = l, scale = sc, inv = iv;
    }
    const auto* slots = reinterpret_cast<const __half*>(
        __shfl_sync(lanes, static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(xs.xs)), owner));
    float err = 0.0f;
    if (busy) {
      const GroupSlots os{slots, xs.g, xs.units8};
      os.each([&](float x) { err = __fadd_rn(err, sq_error(code_of<false>(x, lo, scale, inv, levels), x, lo, scale)); });
    }
    // this lane's group, if it is in the pass: its task is its rank among todo's lanes
    const int rank = __popc(todo & ((1u << lane) - 1u));
    const bool mine = ((todo >> lane) & 1u) != 0 && rank < per;
    float e[NA];
#pragma unroll
    for (int b = 0; b < NA; ++b) e[b] = __shfl_sync(lanes, err, mine ? rank * NA + b : lane);
    if (mine) a = best_factor(e, inv_g), chosen = true;
  }
}

// The codes of a row overwrite its slots behind the reads: no memory access
// of a pack loop moves across this (compiler only; no instruction).
__device__ __forceinline__ void code_barrier() { asm volatile("" ::: "memory"); }

// Packs the codes of n slots (n * BITS a multiple of 16) into out16, 16 bits a word.
// !kClamp: every quotient lies in [-0.5, levels + 0.5) (code_plus_round).
template <int BITS, bool kDivide, bool kClamp = true>
__device__ __forceinline__ void pack_codes(const __half* xs, int n, float lo, float scale, float inv, unsigned short* out16) {
  constexpr int kPer = 16 / BITS;  // codes per 16-bit word
  constexpr float levels = static_cast<float>((1 << BITS) - 1);
  const __half2* x2 = reinterpret_cast<const __half2*>(xs);
  // Without the division the code comes as the bits of code + 1.5 * 2^23:
  // the code in the low bits, the constant's bits from bit 22 up, so shifted
  // (by at most 15) and summed they stay above the word's 16 bits and one
  // shift-and-add (LEA) a code packs it.
  const auto bits_of = [&](float x) {
    if constexpr (kDivide) return static_cast<unsigned>(code_by_division(x, lo, scale, levels));
    return __float_as_uint(code_plus_round<kClamp>(x, lo, scale, inv, levels));
  };
  if constexpr (16 % BITS != 0) {
    // 3, 5, 6 and 7 bits: 16 slots make BITS words, codes crossing words; each code taken from
    // its bits (the constant's bits above it masked off) into a 64-bit window, a word written as
    // soon as its 16 bits are in (every shift a constant: the loop is unrolled)
    constexpr unsigned kMask = (1u << BITS) - 1u;
    for (int v = 0; v < n / 16; ++v) {
      unsigned long long acc = 0;
      int have = 0, w = 0;
#pragma unroll
      for (int e = 0; e < 16; e += 2) {
        const float2 x = __half22float2(x2[(v * 16 + e) / 2]);
        acc |= static_cast<unsigned long long>(bits_of(x.x) & kMask) << have;
        acc |= static_cast<unsigned long long>(bits_of(x.y) & kMask) << (have + BITS);
        have += 2 * BITS;
        for (; have >= 16; have -= 16, acc >>= 16) out16[v * BITS + w++] = static_cast<unsigned short>(acc);
      }
      code_barrier();
    }
  } else {
    for (int w = 0; w < n / kPer; ++w) {
      unsigned acc = 0;
#pragma unroll
      for (int e = 0; e < kPer; e += 2) {
        const float2 v = __half22float2(x2[(w * kPer + e) / 2]);
        acc += bits_of(v.x) << (e * BITS);
        acc += bits_of(v.y) << ((e + 1) * BITS);
      }
      out16[w] = static_cast<unsigned short>(acc);
      code_barrier();
    }
  }
}

// At 4 and 8 bits, codes of finite groups whose quotients all lie in
// [-0.5, levels + 0.5) (quant_kernel's in_range): a = RN(x * inv - c), with
// c = RN(lo * inv) once a group, is within e = 2^-24 (4.02 (levels + 0.5) +
// 1.02 |c|) of the spec's quotient q = RN(RN(x - lo) / scale) (inv, c, the
// FMA, RN(x - lo) and q each rounded once: relative errors of at most 2^-24
// on terms of size |q| and |c|). Where a is further than 2^-21 (levels + 1 +
// |c|) > e from every half-integer, q lies strictly between the same two
// half-integers and rint(q) = rint(a) (a - rint(a) is exact: Sterbenz). A
// value then costs an FMA, the rounding add, two subtractions and a
// comparison instead of the subtraction and the 5-operation correctly
// rounded quotient. A batch of 64 / BITS slots (8 bytes of codes) with a
// value too close to a half-integer (ties on coarse data) is coded again by
// the quotients before it is stored (its slots are still there).
// docs/numerics.md gives the bound's derivation.
template <int BITS>
__device__ __forceinline__ void pack_codes_certified(const __half* xs, int n, float lo, float scale, float inv, unsigned short* out16,
                                                     bool units) {
  static_assert(BITS == 4 || BITS == 8);
  constexpr int kPer = 16 / BITS;    // codes per 16-bit word
  constexpr int kSlots = 64 / BITS;  // slots of 8 bytes of codes
  constexpr float levels = static_cast<float>((1 << BITS) - 1);
  const CertifiedRint cr(lo, inv, levels);  // in range: |q| <= levels + 0.5
  // the codes of kSlots slots (pairs p[0..kSlots / 2)) into four 16-bit words: as in pack_codes, code +
  // 1.5 * 2^23 shifted into its word (the constant's bits stay above the word's 16)
  const auto pack = [&](const unsigned (&p)[kSlots / 2], unsigned (&word)[4]) {
    const auto fill = [&](auto&& code_bits) {
#pragma unroll
      for (int i = 0; i < 4; ++i) word[i] = 0;
#pragma unroll
      for (int e = 0; e < kSlots; ++e) {
        const __half2 h = u32_as_half2(p[e / 2]);
        word[e / kPer] += code_bits(e % 2 ? __high2float(h) : __low2float(h)) << (e % kPer * BITS);
      }
    };
    bool ok = true;
    fill([&](float x) { return __float_as_uint(cr.round_plus(x, inv, ok)); });
    // a value too close to a half-integer: these slots again by the quotients
    if (!ok) fill([&](float x) { return __float_as_uint(code_plus_round<false>(x, lo, scale, inv, levels)); });
  };
  // units: xs and out16 8-byte aligned (FlushLayout::units; the group's first slot a multiple of 16)
  for (int v = 0; v < n / kSlots; ++v) {
    unsigned p[kSlots / 2], word[4];
    if (units) {
#pragma unroll
      for (int j = 0; j < kSlots / 4; ++j) {
        const uint2 q = reinterpret_cast<const uint2*>(xs)[v * (kSlots / 4) + j];
        p[2 * j] = q.x, p[2 * j + 1] = q.y;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kSlots / 2; ++j) p[j] = reinterpret_cast<const unsigned*>(xs)[v * (kSlots / 2) + j];
    }
    pack(p, word);
    if (units) {
      reinterpret_cast<uint2*>(out16)[v] = make_uint2(__byte_perm(word[0], word[1], 0x5410), __byte_perm(word[2], word[3], 0x5410));
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) out16[4 * v + i] = static_cast<unsigned short>(word[i]);
    }
    code_barrier();
  }
}

// At 1 and 2 bits a code is a count of thresholds: the code of x,
// clamp(rint(RN((x - lo) / scale)), 0, levels), is monotonic in x (a rounded
// subtraction, a correctly rounded division by a positive scale, rint and a
// clamp), so among a group's fp16 values code(x) >= k exactly when x >= X_k,
// the smallest fp16 value whose code reaches k. X_k is certified by the exact
// codes of two adjacent fp16 values a < b on either side of the boundary:
// the estimate lo + (k - 0.5) * scale (a float rounding or two from it)
// rounded down and up to fp16, or, where the estimate is an fp16 value e (a
// tie at k - 0.5 may sit exactly there), e and the neighbour on the side the
// tie rounds away from (rint's ties to even: up for k even). Then a value
// costs 1-3 fp16 pair comparisons instead of the quotient's ~10 float
// operations. Comparisons need no special cases: -0 == +0 (their codes are
// equal too), and only finite groups come here.
template <int BITS>
struct CodeThresholds {
  static constexpr int kLevels = (1 << BITS) - 1;
  __half2 X[kLevels];  // X_k in both halves
  // false: the estimate was too far off to certify a threshold (the caller then codes value by value)
  __device__ __forceinline__ bool find(float gmin, float gmax, float lo, float scale, float inv) {
    constexpr float levels = static_cast<float>(kLevels);
    bool ok = true;
#pragma unroll
    for (int k = 1; k <= kLevels; ++k) {
      // code(x) >= k, exactly as pack_codes forms it (k >= 1: the clamps cannot matter); an infinite x
      // (an estimate past +-65504 rounded outwards) has a NaN quotient and reads as "no"
      const auto reaches = [&](__half x) {
        return code_plus_round<false>(__half2float(x), lo, scale, inv, levels) >= kRound + static_cast<float>(k);
      };
      const float est = __fmaf_rn(static_cast<float>(k) - 0.5f, scale, lo);
      __half a = __float2half_rd(est), b = __float2half_ru(est);
      if (__half_as_ushort(a) == __half_as_ushort(b)) {
        // est is the fp16 value e: step to e's neighbour below (k even) or above (k odd) through a float
        // strictly between them (the gap to either neighbour is at least |e| 2^-12 and at least 2^-24)
        const float step = fmaxf(__fmul_rn(fabsf(est), 0x1p-13f), 0x1p-26f);
        if (k % 2 == 0) a = __float2half_rd(__fsub_rn(est, step));
        else b = __float2half_ru(__fadd_rn(est, step));
      }
      const bool ra = reaches(a), rb = reaches(b);
      __half x = b;                                          // !ra && rb: b is the threshold
      if (ra) x = a;                                         // every value from gmin up reaches k, if a <= gmin
      else if (!rb) x = __ushort_as_half(0x7C00);            // no value up to gmax does, if b >= gmax (+inf)
      ok = ok && ((!ra && rb) || (ra && __half2float(a) <= gmin) || (!rb && __half2float(b) >= gmax));
      X[k - 1] = __half2half2(x);
    }
    return ok;
  }
};

// Packs the codes of n slots (n * BITS a multiple of 16) by comparing fp16
// pairs with the thresholds: a comparison gives a lane of ones or zeros per
// half, and with nested masks M1 >= M2 >= M3 the code's bits are M1 ^ M2 ^ M3
// and M2 (1 bit: M1). Pair j's low slot goes to bits (BITS * 2j ...) of the low
// half, its high slot to the same word position + BITS of the high half; one
// fold per word joins the halves.
template <int BITS>
__device__ __forceinline__ void pack_codes_by_thresholds(const __half* xs, int n, const CodeThresholds<BITS>& T, unsigned short* out16,
                                                         bool units) {  // units: xs 8-byte aligned
  static_assert(BITS == 1 || BITS == 2);
  constexpr int kPairs = 8 / BITS;  // fp16 pairs a 16-bit word
  for (int w = 0; w < n * BITS / 16; ++w) {
    unsigned acc = 0;
    unsigned pair[kPairs];
    if (units) {
#pragma unroll
      for (int j = 0; j < kPairs; j += 2) {
        const uint2 q = reinterpret_cast<const uint2*>(xs)[(w * kPairs + j) / 2];
        pair[j] = q.x, pair[j + 1] = q.y;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kPairs; ++j) pair[j] = reinterpret_cast<const unsigned*>(xs)[w * kPairs + j];
    }
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const __half2 h = u32_as_half2(pair[j]);
      const unsigned k0 = (1u << (2 * BITS * j)) | (1u << (16 + 2 * BITS * j + BITS));  // bit 0 of both slots' codes
      if constexpr (BITS == 1) {
        acc |= __hge2_mask(h, T.X[0]) & k0;
      } else {
        const unsigned m1 = __hge2_mask(h, T.X[0]), m2 = __hge2_mask(h, T.X[1]), m3 = __hge2_mask(h, T.X[2]);
        acc |= ((m1 ^ m3) & k0) ^ (m2 & (k0 | k0 << 1));
      }
    }
    out16[w] = static_cast<unsigned short>(acc | acc >> 16);
    code_barrier();
  }
}

// The spec's choice with every factor's codes from its thresholds (X, as
// floats): the code of x decides between the factor's levels + 1
// reconstructions code * scale + lo (each formed once a group, rounded as the
// spec rounds them; code 0 gives lo itself) by float comparisons, then each
// slot's error is summed in slot order as in choose_factor: 9 operations a
// slot and factor at 2 bits instead of ~15.
template <int NA, int BITS>
__device__ __forceinline__ int choose_factor_by_thresholds(const Factors<NA>& F, const float (&X)[NA][(1 << BITS) - 1],
                                                           const GroupSlots& xs, float inv_g) {
  constexpr int kLevels = (1 << BITS) - 1;
  float R[NA][kLevels], err[NA];  // R[a][c - 1]: the reconstruction of code c >= 1
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    err[a] = 0.0f;
#pragma unroll
    for (int c = 1; c <= kLevels; ++c) R[a][c - 1] = __fadd_rn(__fmul_rn(static_cast<float>(c), F.scale[a]), F.lo[a]);
  }
  xs.each([&](float x) {
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      float r;
      if constexpr (BITS == 1) r = x >= X[a][0] ? R[a][0] : F.lo[a];
      else r = x >= X[a][1] ? (x >= X[a][2] ? R[a][2] : R[a][1]) : (x >= X[a][0] ? R[a][0] : F.lo[a]);
      const float d = __fsub_rn(r, x);
      err[a] = __fadd_rn(err[a], __fmul_rn(d, d));
    }
  });
  return best_factor(err, inv_g);
}

// Shared-memory layout of one flush block: R rows of P fp16 slots (already
// permuted, padded) with a row stride of an odd number of words, so that the
// threads of a warp (one row each) read distinct banks, or (units:
// flush_in_units) of an odd number of 8-byte units, read 4 slots a load (a
// warp's 8-byte loads are served a half warp at a time, so again no bank
// twice), then the channel -> slot map. A row's packed codes are written over
// its own slots: a code takes at most a byte where its slot took two, so the
// codes of slots [0, s) end before slot s / 2 and never reach a slot not yet
// read (the pack loops keep the compiler from moving a store above a load:
// code_barrier).
// At P = 128: 33536 bytes (34048 in units), six blocks an SM at every code width.
struct FlushLayout {
  int R = 0, stride = 0;  // rows per block, row stride in halves
  int out_stride = 0;     // bytes from a row's codes to the next row's (the row stride)
  std::size_t inv_at = 0, out_at = 0, bytes = 0;
  bool units = false;     // rows of an odd number of 8-byte units (else of words)
  __host__ __device__ FlushLayout(int rows, int P, int D, bool want_units) : R(rows) {
    units = want_units && P % 4 == 0;
    if (units) {  // an odd number of 8-byte units: a warp's 8-byte reads (a row each) meet no bank twice
      stride = P;
      if ((stride / 4) % 2 == 0) stride += 4;
    } else {
      stride = (P + 1) / 2 * 2;
      if ((stride / 2) % 2 == 0) stride += 2;
    }
    out_at = 0;
    out_stride = stride * 2;  // a code row takes at most P bytes (8 bits a slot) of the row's 2 P
    inv_at = (static_cast<std::size_t>(R) * stride * 2 + 15) / 16 * 16;
    bytes = inv_at + static_cast<std::size_t>(D) * 2;
  }
};

// The staging of quant_kernel for its usual shape (D = 128, no padding, 128
// threads) with the strides as constants: thread tid keeps to the 8-channel
// column tid % 16 of rows tid / 16 + 8 k, kBatch rows' 16-byte loads in
// flight, and each value's store has its slot's address in a register and
// the row's offset as an immediate (one STS a value, no address arithmetic).
// The first batch is loaded before the slot map is built (its global reads
// and barrier overlap the loads), the rest after. T: the input's element
// type; bf16 and fp32 values are rounded to fp16 pairs before their stores
// (fp32: two loads a row, so half the rows a batch: 8 loads in flight for
// every type).
constexpr int kThreadsTarget = 128;  // threads (rows) a flush block at most
constexpr int kStride128Words = 130;  // FlushLayout's row stride (halves) for P = 128, in words
constexpr int kStride128Units = 132;  // and in 8-byte units
template <typename F, int... I>
__device__ __forceinline__ void static_for(std::integer_sequence<int, I...>, F&& f) {
  (f(std::integral_constant<int, I>{}), ...);
}

template <int kStride128, typename T = __half>
struct StageD128 {
  static constexpr int kL = static_cast<int>(sizeof(T)) * 8 / 16;       // 16-byte loads a thread's 8 channels (2 for fp32)
  static constexpr int kRow = 128 * static_cast<int>(sizeof(T)) / 16;  // 16-byte vectors a row
  static constexpr int kBatch = 8 / kL;                  // row passes (8 rows: 128 threads, 16 columns) a batch of loads
  static constexpr int kPasses = kThreadsTarget / 8;     // a tile has at most kThreadsTarget rows
  static constexpr unsigned kPass = 8 * kStride128 * 2;  // bytes from a row to the thread's next
  const uint4* col;
  int r0, nr;
  uint4 buf[kBatch][kL];
  __device__ __forceinline__ StageD128(const T* src, int rows)
      : col(reinterpret_cast<const uint4*>(src + (threadIdx.x % 16) * 8) + (threadIdx.x / 16) * kRow), r0(threadIdx.x / 16), nr(rows) {}
  template <int K0>
  __device__ __forceinline__ void load() {
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (r0 + 8 * (K0 + u) < nr) {
#pragma unroll
        for (int l = 0; l < kL; ++l) buf[u][l] = __ldg(col + (K0 + u) * 8 * kRow + l);
      }
  }
  template <int K0>
  __device__ __forceinline__ void store(const unsigned (&dst)[8]) {
    static_for(std::make_integer_sequence<int, kBatch>{}, [&](auto pass) {
      constexpr int u = decltype(pass)::value;
      if (r0 + 8 * (K0 + u) >= nr) return;
      unsigned w[4];  // the pass's 8 values as fp16 pairs (bf16 and fp32 rounded to nearest)
      if constexpr (std::is_same_v<T, __half>) {
        w[0] = buf[u][0].x, w[1] = buf[u][0].y, w[2] = buf[u][0].z, w[3] = buf[u][0].w;
      } else {
        const T* x = reinterpret_cast<const T*>(&buf[u][0]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const __half2 p = __floats2half2_rn(to_float(x[2 * i]), to_float(x[2 * i + 1]));
          w[i] = *reinterpret_cast<const unsigned*>(&p);
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const unsigned short v = static_cast<unsigned short>(w[e / 2] >> (16 * (e % 2)));
        asm volatile("st.shared.u16 [%0+%1], %2;\n" ::"r"(dst[e]), "n"((K0 + u) * kPass), "h"(v) : "memory");
      }
    });
  }
  // after load<0>() and the slot map's barrier: every pass's load and store offset a constant
  __device__ __forceinline__ void finish(__half* rows, const short* inv) {
    const int c8 = (threadIdx.x % 16) * 8;
    unsigned dst[8];  // shared-memory addresses of the column's slots in row r0
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[e] = static_cast<unsigned>(__cvta_generic_to_shared(rows + r0 * kStride128 + inv[c8 + e]));
    store<0>(dst);
    static_for(std::make_integer_sequence<int, kPasses / kBatch - 1>{}, [&](auto batch) {
      constexpr int k0 = (decltype(batch)::value + 1) * kBatch;
      if (r0 + 8 * k0 >= nr) return;
      load<k0>();
      store<k0>(dst);
    });
  }
};

// Block: rows [t0, t0 + R) of window c of one (b, h); thread: one row, its
// groups one after the other (a thread per row and group cost 34 instead of
// ~20 instructions a value at group 32: its own costs - indices, staging
// setup, barriers - weighed four times as much; and a block had a quarter of
// the rows, so a quarter of the bytes in flight).
// The rows are read with 16-byte loads (several in flight per thread) into
// shared memory, each value stored at its permuted slot; the codes are packed
// over the row's own slots (FlushLayout) and written out as whole rows. With one clip factor
// (search off) there is nothing to choose and no error is summed.
// At most kThreadsTarget threads (rows) a block; without the search 64
// registers a thread, so that registers never limit the blocks an SM below
// what shared memory allows.
// A block's place in the grid: blockIdx.x = (c * BH + bh) * per_head + rb.
struct FlushGrid {
  FastDiv per_head;  // blocks a window of one (b, h)
  FastDiv bh;        // B * H
  FastDiv heads;     // H
};

// With the search (NA > 1) at least six blocks an SM: 80 registers a thread
// instead of 94-105 (four blocks), with the largest shared-memory carveout (run_flush) (1% faster,
// session 27: the kernel is bound by its issue, not by its occupancy).
// NA: the number of clip factors; BITS: the side's code width; kChoose: with
// the search, every factor's codes by thresholds (1 and 2 bits, groups of 64
// or more slots; at 32 five factors' thresholds cost more than they save).
// kSrc: the input's element type (FlushParams::src_type). bf16 and fp32 rows
// are rounded to fp16 as they are staged (at D = 128 by StageD128, as fp16
// rows are; else eight channels a thread, by one or two 16-byte loads where
// the rows allow, else one element at a time), so that
// the staged rows, and everything after them, are those of the fp16 rows the
// host conversion gives; no fp16 copy of the input is ever written.
template <int NA, int BITS, bool kChoose = false, int kSrc = kTypeF16>
__global__ void __launch_bounds__(kThreadsTarget, NA == 1 ? 8 : 6) quant_kernel(const FlushParams f, DevSide s, int R, FlushGrid fg) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = s.D, G = s.G, g = f.group, bits = BITS, P = G * g;
  constexpr bool kUnits = flush_in_units(BITS, NA);
  constexpr int kStride128 = kUnits ? kStride128Units : kStride128Words;
  const FlushLayout L(R, P, D, kUnits);
  __half* rows = reinterpret_cast<__half*>(smem);
  short* inv = reinterpret_cast<short*>(smem + L.inv_at);
  unsigned char* out = smem + L.out_at;
  const int tid = threadIdx.x, nt = blockDim.x;
  // (32-bit index arithmetic: the grid has fewer than 2^31 blocks)
  const unsigned bid = blockIdx.x, q = fg.per_head.div(bid), cu = fg.bh.div(q);
  const int rb = static_cast<int>(bid - q * fg.per_head.d);
  const std::int64_t bh = q - cu * fg.bh.d;
  const int c = static_cast<int>(cu);
  const int h = static_cast<int>(bh - fg.heads.div(static_cast<unsigned>(bh)) * fg.heads.d);
  const int t0 = rb * R, nr = min(R, f.window - t0);
  const std::int64_t slot = f.slot0 + c;
  using T = std::conditional_t<kSrc == kTypeF16, __half, std::conditional_t<kSrc == kTypeBF16, __nv_bfloat16, float>>;
  const T* srt = reinterpret_cast<const T*>(f.src) + (bh * f.src_tokens + f.first + static_cast<std::int64_t>(c) * f.window + t0) * D;
  const __half* src = reinterpret_cast<const __half*>(srt);  // (read as such only for fp16 input)
  const bool aligned = (reinterpret_cast<std::uintptr_t>(srt) & 15) == 0;
  const bool d128 = aligned && D == 128 && L.stride == kStride128 && nt == 128;
  StageD128<kStride128, T> stage(srt, nr);
  if (d128) stage.template load<0>();
  for (int j = tid; j < D; j += nt) inv[s.perm ? s.perm[h * D + j] : j] = static_cast<short>(j);
  __syncthreads();
  const int vpr = max(1, D / 8);  // 16-byte vectors per row
  if (d128) {
    stage.finish(rows, inv);
  } else if constexpr (kSrc != kTypeF16) {
    constexpr int kPer = 16 / static_cast<int>(sizeof(T));  // elements a 16-byte load
    const bool vec = aligned && D % 8 == 0;
    const int items = nr * vpr;  // (row, 8-channel column) pairs, consecutive threads along a row
    auto put = [&](int i, const float (&v)[8]) {
      const int r = i / vpr, c8 = (i - r * vpr) * 8;
      __half* row = rows + r * L.stride;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (c8 + k < D) row[inv[c8 + k]] = __float2half_rn(v[k]);
    };
    if (vec) {
      // kV pairs a thread at a time, all their loads issued before any is used (8 16-byte loads in
      // flight, as StageD128 has)
      constexpr int kL = 8 / kPer, kV = 8 / kL;  // loads a pair; pairs at a time
      for (int i0 = tid; i0 < items; i0 += kV * nt) {
        uint4 w[kV][kL];
#pragma unroll
        for (int u = 0; u < kV; ++u) {
          const int i = i0 + u * nt;
          if (i < items) {
            const int r = i / vpr, c8 = (i - r * vpr) * 8;
            const uint4* x = reinterpret_cast<const uint4*>(srt + static_cast<std::int64_t>(r) * D + c8);
#pragma unroll
            for (int l = 0; l < kL; ++l) w[u][l] = __ldg(x + l);
          }
        }
#pragma unroll
        for (int u = 0; u < kV; ++u) {
          const int i = i0 + u * nt;
          if (i >= items) break;
          float v[8];
#pragma unroll
          for (int l = 0; l < kL; ++l) {
            const T* e = reinterpret_cast<const T*>(&w[u][l]);
#pragma unroll
            for (int k = 0; k < kPer; ++k) v[l * kPer + k] = to_float(e[k]);
          }
          put(i, v);
        }
      }
    }
    for (int i = vec ? items : tid; i < items; i += nt) {  // (rows not 16-byte aligned)
      const int r = i / vpr, c8 = (i - r * vpr) * 8;
      const T* x = srt + static_cast<std::int64_t>(r) * D + c8;
      float v[8] = {};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (c8 + k >= D) break;
        v[k] = to_float(x[k]);
      }
      put(i, v);
    }
  } else if (aligned && D % 8 == 0 && nt % vpr == 0) {
    // Each thread keeps to one 8-channel column (its slots in registers) and
    // has kV 16-byte loads in flight.
    constexpr int kV = 4;
    const int c8 = (tid % vpr) * 8, rstep = nt / vpr;
    int slot_of[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) slot_of[e] = inv[c8 + e];
    const uint4* col = reinterpret_cast<const uint4*>(src + c8);  // row r at col + r * vpr
    for (int r0 = tid / vpr; r0 < nr; r0 += kV * rstep) {
      uint4 buf[kV];
#pragma unroll
      for (int u = 0; u < kV; ++u) {
        const int r = r0 + u * rstep;
        if (r < nr) buf[u] = __ldg(col + r * vpr);
      }
#pragma unroll
      for (int u = 0; u < kV; ++u) {
        const int r = r0 + u * rstep;
        if (r < nr) {
          const __half* hv = reinterpret_cast<const __half*>(&buf[u]);
          __half* row = rows + r * L.stride;
#pragma unroll
          for (int e = 0; e < 8; ++e) row[slot_of[e]] = hv[e];
        }
      }
    }
  } else {
    for (int i = tid; i < nr * D; i += nt) {
      const int r = i / D, col = i - r * D;
      rows[r * L.stride + inv[col]] = src[i];
    }
  }
  if (P > D) {  // the padding repeats the row's last permuted value
    __syncthreads();
    for (int i = tid; i < nr * (P - D); i += nt) {
      const int r = i / (P - D);
      rows[r * L.stride + D + (i - r * (P - D))] = rows[r * L.stride + D - 1];
    }
  }
  __syncthreads();

  // a thread per row, over its groups
  const int rl = tid, t = t0 + rl;
  const bool row_live = rl < nr, sink_row = slot == 0 && t < f.n_sink;  // sinks stay exact: code bytes left zero
  // the lanes of this thread's warp (a block's last warp may be partial)
  const unsigned warp_lanes = nt - (tid & ~31) >= 32 ? 0xffffffffu : (1u << (nt - (tid & ~31))) - 1u;
  [[maybe_unused]] const float inv_g = __fdiv_rn(1.0f, static_cast<float>(g));  // the spec's 1/g (once, not a group)
  for (int k = 0; k < G; ++k) {  // every lane, every group: the warp meets at exact_choices
    const int j0 = k * g, j1 = min(D, j0 + g);
    auto* out16 = reinterpret_cast<unsigned short*>(out + rl * L.out_stride + j0 * bits / 8);
    if (row_live && sink_row) {
      for (int i = 0; i < (j1 - j0) * bits / 16; ++i) out16[i] = 0;
    }
    const bool work = row_live && !sink_row;
    const GroupSlots xs{rows + rl * L.stride + j0, g, L.units};
    constexpr float levels = static_cast<float>((1 << BITS) - 1);
    float gmin = 0.0f, gmax = 0.0f;
    Factors<NA> F{};  // (zeros on lanes without a group: exact_choices reads every lane's)
    bool finite = false;
    int a = 0;
    bool chosen = NA == 1;
    if (work) {
      xs.min_max(gmin, gmax);
      const float mid = __fmul_rn(__fadd_rn(gmax, gmin), 0.5f);
      const float rng = __fsub_rn(gmax, gmin);
      F = Factors<NA>(f, mid, rng, levels);
      finite = isfinite(gmin) && isfinite(gmax);  // false with a NaN slot (gmax is NaN then)
      if constexpr (NA > 1) {
        if (finite && !f.exact_search) {
          // every factor's error estimated (BITS + 2 float operations a slot and factor at 1 to 4
          // bits, 5 or 7 from 5), the choice certified (cuda/clip_proxy.hpp)
          using Proxy = clip::ClipProxy<NA, BITS>;
          Proxy px(F.lo, F.inv);
          // (the pairs unrolled 4 times, or at 4 and 8 bits, where a pair's work is 40% larger,
          // twice: K4V4 g128 6% faster, session 27; twice at 2 bits was 1% slower)
          constexpr int kUnroll = BITS >= 4 ? 2 : 4;
          // at 1 to 4 bits the folds need no clamp; from 5 bits it is left out where no quotient
          // reaches past the codes' half-integers
          if (Proxy::kFold || __all_sync(__activemask(), px.in_range(gmin, gmax))) {
            xs.template pairs<kUnroll>([&](float x0, float x1) { px.template add2<false>(x0, x1); },
                                       [&](float x) { px.template add1<false>(x); });
          } else {
            xs.template pairs<kUnroll>([&](float x0, float x1) { px.template add2<true>(x0, x1); },
                                       [&](float x) { px.template add1<true>(x); });
          }
          chosen = px.choose(F.lo, F.scale, gmin, gmax, g, a);
        }
      }
    }
    if constexpr (NA > 1) {
      // finite groups the estimate could not certify: every factor's error summed exactly, a lane a
      // factor (the whole warp, so a group costs one pass over its slots, not five)
      if (!f.exact_search) exact_choices<NA>(F, xs, work && finite && !chosen, warp_lanes, levels, inv_g, a, chosen);
    }
    if (work) {
      // At 1 and 2 bits, finite groups: codes by thresholds, unless one is not certified (then a quotient
      // a value); with kChoose every factor's thresholds choose the factor.
      constexpr bool kThresholds = BITS <= 2;
      constexpr int kL = kThresholds ? (1 << BITS) - 1 : 1;
      if constexpr (NA > 1) {
        if (!chosen && kChoose && kThresholds && finite) {
          float X[NA][kL];
          bool ok = true;
#pragma unroll
          for (int i = 0; i < NA; ++i) {
            CodeThresholds<kThresholds ? BITS : 1> Ti;
            ok = ok && Ti.find(gmin, gmax, F.lo[i], F.scale[i], F.inv[i]);
#pragma unroll
            for (int k = 0; k < kL; ++k) X[i][k] = __low2float(Ti.X[k]);
          }
          if (ok) a = choose_factor_by_thresholds<NA, kThresholds ? BITS : 1>(F, X, xs, inv_g), chosen = true;
        }
        if (!chosen) {
          // certified codes at 4 and 8 bits (K4V4 g128: 3.99 -> 3.53 ms); compiled into the 1- and 2-bit
          // kernels they cost those 3-8% (K2V2 g32 4.24 -> 4.44 ms), though they would save 3% there
          if (!finite) a = choose_factor<NA, true>(F, xs, levels, inv_g);
          else if (BITS <= 2 || f.quotients_only) a = choose_factor<NA, false>(F, xs, levels, inv_g);
          else a = choose_factor_certified<NA>(F, xs, gmin, gmax, levels, inv_g);
        }
      }
      float best_lo = F.lo[0], best_scale = F.scale[0], best_inv = F.inv[0];
#pragma unroll
      for (int i = 1; i < NA; ++i) {
        if (a == i) best_lo = F.lo[i], best_scale = F.scale[i], best_inv = F.inv[i];
      }
      // the group's real channels (j0 and j1 - j0 are multiples of 16); after the search at groups below 64
      // slots by quotients (there the thresholds of the chosen factor measured 6% slower, 4.28 -> 4.53 ms;
      // in session 27, at 3.14 ms, the same within 0.2%)
      bool packed = false;
      if constexpr (kThresholds && (NA == 1 || kChoose)) {
        CodeThresholds<kThresholds ? BITS : 1> T;
        packed = finite && T.find(gmin, gmax, best_lo, best_scale, best_inv);
        if (packed) pack_codes_by_thresholds<kThresholds ? BITS : 1>(xs.xs, j1 - j0, T, out16, L.units);
      }
      if (!packed) {
        // The quotient is monotonic in x, so when the group's extremes give
        // quotients in [-0.5, levels + 0.5) every slot does, and rint alone
        // lands in [0, levels] (-0.5 rounds to even 0; levels is odd, so
        // levels + 0.5 would not): no clamp a value. Chosen per warp, so the
        // warp runs one loop.
        const bool in_range = finite &&
                              code_quotient(gmin, best_lo, best_scale, best_inv) >= -0.5f &&
                              code_quotient(gmax, best_lo, best_scale, best_inv) < levels + 0.5f;
        if (__all_sync(__activemask(), in_range)) {
          if ((BITS == 4 || BITS == 8) && !f.quotients_only) pack_codes_certified<BITS == 8 ? 8 : 4>(xs.xs, j1 - j0, best_lo, best_scale,
                                                                                                     best_inv, out16, L.units);
          else pack_codes<BITS, false, false>(xs.xs, j1 - j0, best_lo, best_scale, best_inv, out16);
        }
        else if (finite) pack_codes<BITS, false>(xs.xs, j1 - j0, best_lo, best_scale, best_inv, out16);
        else pack_codes<BITS, true>(xs.xs, j1 - j0, best_lo, best_scale, best_inv, out16);
      }
      const std::int64_t mo = slot * s.slot_meta + ((bh * f.window + t) * G + k) * f.meta_bytes;
      store_meta(s.lo + mo, f.meta, best_lo);
      store_meta(s.scale + mo, f.meta, best_scale);
    }
  }
  // The block's code rows are contiguous in the slot. Rows of whole 16-byte
  // vectors (D = 128 at any width): each thread writes its own row (no
  // barrier; a warp's stores cover 32 consecutive rows); otherwise 4-byte
  // stores of rows a multiple of 4 bytes, 2-byte ones else.
  unsigned char* dst = s.codes + slot * s.slot_codes + (bh * f.window + t0) * s.row_bytes;
  if (((reinterpret_cast<std::uintptr_t>(dst) | s.row_bytes) & 15) == 0) {
    if (rl < nr) {
      const unsigned char* row = out + rl * L.out_stride;
      uint4* to = reinterpret_cast<uint4*>(dst + rl * s.row_bytes);
      if (L.units) {  // 8-byte loads (an odd number of 8-byte units a row)
        const uint2* r8 = reinterpret_cast<const uint2*>(row);
        for (int i = 0; i < static_cast<int>(s.row_bytes) / 16; ++i) {
          const uint2 a = r8[2 * i], b = r8[2 * i + 1];
          to[i] = make_uint4(a.x, a.y, b.x, b.y);
        }
      } else {
        const unsigned* r4 = reinterpret_cast<const unsigned*>(row);  // 4-byte aligned
        for (int i = 0; i < static_cast<int>(s.row_bytes) / 16; ++i) to[i] = make_uint4(r4[4 * i], r4[4 * i + 1], r4[4 * i + 2], r4[4 * i + 3]);
      }
    }
    return;
  }
  __syncthreads();
  const int rb4 = static_cast<int>(s.row_bytes) / 4;
  if (((reinterpret_cast<std::uintptr_t>(dst) | s.row_bytes) & 3) == 0 && nt % rb4 == 0) {
    const int w = tid % rb4;  // this thread's word of every row it writes
    for (int r = tid / rb4; r < nr; r += nt / rb4)
      reinterpret_cast<unsigned*>(dst)[r * rb4 + w] = reinterpret_cast<const unsigned*>(out + r * L.out_stride)[w];
  } else {
    const int rb2 = static_cast<int>(s.row_bytes) / 2;
    for (int i = tid; i < nr * rb2; i += nt) {
      const int r = i / rb2;
      reinterpret_cast<unsigned short*>(dst)[i] = reinterpret_cast<const unsigned short*>(out + r * L.out_stride)[i - r * rb2];
    }
  }
}

__global__ void quotient_kernel(const float* num, const float* scale, float* out, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = quotient_rn(num[i], scale[i], __frcp_rn(scale[i]));
}

}  // namespace

void flush_quotients(const float* num, const float* scale, float* out, std::int64_t n) {
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  auto* d = static_cast<float*>(device_alloc(3 * bytes));  // num, scale, quotients
  try {
    copy_to_device(d, num, bytes);
    copy_to_device(d + n, scale, bytes);
    quotient_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(d, d + n, d + 2 * n, n);
    SKVQ_CUDA_LAUNCH_CHECK();
    copy_to_host(out, d + 2 * n, bytes);
  } catch (...) {
    device_free(d);
    throw;
  }
  device_free(d);
}

void run_perm(const FlushParams& f, DevSide& side, cudaStream_t stream) {
  perm_kernel<<<f.H, 128, side.D * sizeof(float), stream>>>(f, side);
  SKVQ_CUDA_LAUNCH_CHECK();
}

// (kThreadsTarget: 32 to 256 threads a block measured the same in session 10,
// K2V2 g128 without the search: 1.21-1.22 ms for 2 x 131072 x 32 rows.)

// SKVQ_CUDA_FLUSH (tests and side-by-side benchmarks): "quotients", 4- and
// 8-bit codes by the exact quotient only; "exact", the clip search sums every
// factor's error exactly (no certified estimate first).
const std::string& flush_mode() {
  static const std::string v = env_switch("SKVQ_CUDA_FLUSH");
  return v;
}

void run_flush(const FlushParams& flush, DevSide& side, cudaStream_t stream) {
  FlushParams f = flush;
  f.quotients_only = flush_mode() == "quotients";
  f.exact_search = flush_mode() == "exact";
  const int P = side.G * f.group;
  // rows per block: a thread per row (looping over its groups), up to kThreadsTarget rows, at most 64 KiB of shared memory
  int R = std::max(1, std::min(f.window, kThreadsTarget));
  const bool units = flush_in_units(side.bits, f.n_grid);
  while (R > 1 && FlushLayout(R, P, side.D, units).bytes > 64 * 1024) --R;
  const FlushLayout L(R, P, side.D, units);
  const std::int64_t blocks = static_cast<std::int64_t>(f.n_chunks) * f.B * f.H * ((f.window + R - 1) / R);
  if (blocks >= (std::int64_t{1} << 31)) {
    throw Error("skvq: the GPU flush of " + std::to_string(f.n_chunks) + " windows at B*H=" + std::to_string(f.B * f.H) +
                " needs " + std::to_string(blocks) + " blocks, more than a launch takes (2^31 - 1): append fewer tokens a call");
  }
  auto launch = [&](auto kernel) {
    if (L.bytes > 48 * 1024) allow_smem(kernel, static_cast<int>(L.bytes));
    // The largest shared-memory carveout: with the search a block holds 80 registers a thread, so
    // six blocks an SM fit in the registers, and six blocks' rows (33.5 KiB each at P = 128) need
    // the carveout's top sizes (the driver's own choice left four blocks).
    raise_func_attribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
    const FlushGrid fg{FastDiv(static_cast<std::uint32_t>((f.window + R - 1) / R)), FastDiv(static_cast<std::uint32_t>(f.B * f.H)),
                         FastDiv(static_cast<std::uint32_t>(f.H))};
    kernel<<<static_cast<unsigned>(blocks), R, L.bytes, stream>>>(f, side, R, fg);
  };
  auto by_src = [&](auto na, auto bits, auto choose) {
    constexpr int NA = decltype(na)::value, BITS = decltype(bits)::value;
    constexpr bool kChoose = decltype(choose)::value;
    switch (f.src_type) {
      case kTypeF16: return launch(quant_kernel<NA, BITS, kChoose, kTypeF16>);
      case kTypeBF16: return launch(quant_kernel<NA, BITS, kChoose, kTypeBF16>);
      case kTypeF32: return launch(quant_kernel<NA, BITS, kChoose, kTypeF32>);
      default: throw Error("skvq: the GPU flush has no kernel for input type " + std::to_string(f.src_type));
    }
  };
  auto by_bits = [&](auto na) {
    constexpr int NA = decltype(na)::value;
    const bool choose = NA > 1 && f.group >= 64;  // quant_kernel's kChoose
    using Yes = std::true_type;
    using No = std::false_type;
    switch (side.bits) {
      case 1: choose ? by_src(na, std::integral_constant<int, 1>{}, Yes{}) : by_src(na, std::integral_constant<int, 1>{}, No{}); break;
      case 2: choose ? by_src(na, std::integral_constant<int, 2>{}, Yes{}) : by_src(na, std::integral_constant<int, 2>{}, No{}); break;
      case 3: by_src(na, std::integral_constant<int, 3>{}, No{}); break;
      case 4: by_src(na, std::integral_constant<int, 4>{}, No{}); break;
      case 5: by_src(na, std::integral_constant<int, 5>{}, No{}); break;
      case 6: by_src(na, std::integral_constant<int, 6>{}, No{}); break;
      case 7: by_src(na, std::integral_constant<int, 7>{}, No{}); break;
      case 8: by_src(na, std::integral_constant<int, 8>{}, No{}); break;
      default: throw Error("skvq: the GPU flush has no kernel for " + std::to_string(side.bits) + "-bit codes");
    }
  };
  // the spec's grid (5 factors) with the search on, one factor without it
  switch (f.n_grid) {
    case 1: by_bits(std::integral_constant<int, 1>{}); break;
    case 5: by_bits(std::integral_constant<int, 5>{}); break;
    default: throw Error("skvq: the GPU flush takes 1 or 5 clip factors, not " + std::to_string(f.n_grid));
  }
  SKVQ_CUDA_LAUNCH_CHECK();
}

}  // namespace skvq::cuda
