// Metadata number formats (lo and scale): rounding to the storage type and
// bit encodings. Rounding is to nearest, ties to even, saturating at the
// largest finite value so that no group can ever reconstruct to inf or NaN.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "skvq/config.hpp"
#include "skvq/dtype.hpp"

namespace skvq::ref {

// Round |v| to a binary float format with `mant` stored mantissa bits, minimum
// normal exponent `emin` and largest finite value `maxv`; keep the sign.
inline float round_to_format(float v, int mant, int emin, float maxv) {
  const float a = std::fabs(v);
  if (a == 0.0f) return v;
  const int e = std::max(std::ilogb(a), emin);
  const float q = std::ldexp(1.0f, e - mant);  // spacing of representable values near a
  const float r = std::min(std::nearbyint(a / q) * q, maxv);  // a / q is exact: q is a power of 2
  return std::copysign(r, v);
}

constexpr float kMaxF16 = 65504.0f;
constexpr float kMaxE4M3 = 448.0f;
constexpr float kMinScaleF16 = 0x1p-24f;   // smallest positive fp16 subnormal
constexpr float kMinScaleE4M3 = 0x1p-9f;   // smallest positive e4m3 subnormal
constexpr float kMinScaleF32 = 1e-8f;      // the spec's floor

// lo as it will be stored.
inline float meta_round_lo(float lo, MetaType m) {
  switch (m) {
    case MetaType::fp32: return lo;
    case MetaType::fp16: return round_to_format(lo, 10, -14, kMaxF16);
    case MetaType::fp8_e4m3: return round_to_format(lo, 3, -6, kMaxE4M3);
  }
  return lo;
}

// scale as it will be stored; `scale` already has the spec's 1e-8 floor.
inline float meta_round_scale(float scale, MetaType m) {
  switch (m) {
    case MetaType::fp32: return scale;
    case MetaType::fp16: return std::max(round_to_format(scale, 10, -14, kMaxF16), kMinScaleF16);
    case MetaType::fp8_e4m3:
      return std::max(round_to_format(scale, 3, -6, kMaxE4M3), kMinScaleE4M3);
  }
  return scale;
}

// e4m3 (OCP "fn" variant: bias 7, no infinities, 0x7f/0xff are NaN).
inline std::uint8_t e4m3_encode(float v) {  // v must already be representable
  const std::uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const float a = std::fabs(v);
  if (a == 0.0f) return sign;
  int e = std::ilogb(a);
  if (e < -6) {  // subnormal: a = m * 2^-9
    return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(a * 512.0f));
  }
  const int m = static_cast<int>(std::ldexp(a, -e) * 8.0f) - 8;  // 3 mantissa bits
  return static_cast<std::uint8_t>(sign | ((e + 7) << 3) | m);
}

inline float e4m3_decode(std::uint8_t b) {
  const int e = (b >> 3) & 0xf;
  const int m = b & 0x7;
  float a = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                   : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  if (e == 15 && m == 7) a = std::nanf("");
  return (b & 0x80) ? -a : a;
}

// Store / load one metadata value of type m at p (meta_bytes(m) bytes).
inline void meta_store(std::uint8_t* p, MetaType m, float v) {
  switch (m) {
    case MetaType::fp32: std::memcpy(p, &v, 4); return;
    case MetaType::fp16: {
      const std::uint16_t h = f32_to_f16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case MetaType::fp8_e4m3: *p = e4m3_encode(v); return;
  }
}

inline float meta_load(const std::uint8_t* p, MetaType m) {
  switch (m) {
    case MetaType::fp32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case MetaType::fp16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    case MetaType::fp8_e4m3: return e4m3_decode(*p);
  }
  return 0.0f;
}

}  // namespace skvq::ref
