// Element types skvq accepts and returns, and exact conversions between them.
// All conversions round to nearest, ties to even (IEEE 754 default).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace skvq {

enum class DType : std::uint8_t { f16, bf16, f32 };

constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f32: return "float32";
  }
  return "?";
}

// IEEE binary16 <-> binary32. Overflow becomes infinity, NaN stays NaN.
inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float mag = static_cast<float>(man) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(mag) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

inline std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN (keep NaN quiet and non-zero)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  }
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {  // below 2^-14: subnormal half, quantum 2^-24
    const float mag = std::bit_cast<float>(ax);
    const auto q = static_cast<std::uint16_t>(std::nearbyint(mag * 0x1p24f));  // exact scaling, RNE
    return static_cast<std::uint16_t>(sign | q);
  }
  // normal: drop 13 mantissa bits with round-to-nearest-even
  const std::uint32_t lsb = (ax >> 13) & 1u;
  const std::uint32_t rounded = ax + 0xfffu + lsb;
  return static_cast<std::uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

inline float bf16_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

inline std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t lsb = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
}

// Read / write one element of type `t` at `p` as float32.
inline float load_as_f32(const std::byte* p, DType t) {
  switch (t) {
    case DType::f32: {
      float v;
      __builtin_memcpy(&v, p, 4);
      return v;
    }
    case DType::f16: {
      std::uint16_t h;
      __builtin_memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    case DType::bf16: {
      std::uint16_t h;
      __builtin_memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
  }
  return 0.0f;
}

inline void store_from_f32(std::byte* p, DType t, float v) {
  switch (t) {
    case DType::f32: __builtin_memcpy(p, &v, 4); return;
    case DType::f16: {
      const std::uint16_t h = f32_to_f16(v);
      __builtin_memcpy(p, &h, 2);
      return;
    }
    case DType::bf16: {
      const std::uint16_t h = f32_to_bf16(v);
      __builtin_memcpy(p, &h, 2);
      return;
    }
  }
}

// n contiguous elements of type t at p into out[0..n) as float32.
inline void load_row_f32(const std::byte* p, DType t, std::int64_t n, float* out) {
  switch (t) {
    case DType::f32: __builtin_memcpy(out, p, static_cast<std::size_t>(n) * 4); return;
    case DType::f16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        __builtin_memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      return;
    case DType::bf16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        __builtin_memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      return;
  }
}

// out[0..n) as n contiguous elements of type t at p (round to nearest even).
inline void store_row_f32(std::byte* p, DType t, std::int64_t n, const float* in) {
  switch (t) {
    case DType::f32: __builtin_memcpy(p, in, static_cast<std::size_t>(n) * 4); return;
    case DType::f16:
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint16_t h = f32_to_f16(in[i]);
        __builtin_memcpy(p + 2 * i, &h, 2);
      }
      return;
    case DType::bf16:
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint16_t h = f32_to_bf16(in[i]);
        __builtin_memcpy(p + 2 * i, &h, 2);
      }
      return;
  }
}

}  // namespace skvq
