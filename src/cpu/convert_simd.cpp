// Highway SIMD conversions (see convert_simd.hpp).
#include "cpu/convert_simd.hpp"

#include <algorithm>
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/convert_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace skvq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void LoadRowF32(const std::byte* p, DType t, std::int64_t n, float* out) {
  const hn::ScalableTag<float> d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t j = 0;
  if (t == DType::f16) {
    const hn::Rebind<hwy::float16_t, decltype(d)> dh;
    const auto* h = reinterpret_cast<const hwy::float16_t*>(p);
    for (; j + L <= n; j += L) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, h + j)), d, out + j);
  } else if (t == DType::bf16) {
    const hn::Rebind<hwy::bfloat16_t, decltype(d)> db;
    const auto* h = reinterpret_cast<const hwy::bfloat16_t*>(p);
    for (; j + L <= n; j += L) hn::StoreU(hn::PromoteTo(d, hn::LoadU(db, h + j)), d, out + j);
  }
  skvq::load_row_f32(p + j * static_cast<std::int64_t>(dtype_size(t)), t, n - j, out + j);
}

float MaxAbs(const float* x, std::int64_t n) {
  const hn::ScalableTag<float> d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  auto m = hn::Zero(d);
  auto nan = hn::Zero(d);
  std::int64_t j = 0;
  for (; j + L <= n; j += L) {
    const auto v = hn::LoadU(d, x + j);
    m = hn::Max(m, hn::Abs(v));
    nan = hn::Or(nan, hn::VecFromMask(d, hn::IsNaN(v)));
  }
  float r = hn::GetLane(hn::MaxOfLanes(d, m));
  bool any_nan = !hn::AllTrue(d, hn::Eq(nan, hn::Zero(d)));
  for (; j < n; ++j) {
    any_nan |= std::isnan(x[j]);
    r = std::fmax(r, std::fabs(x[j]));
  }
  return any_nan ? NAN : r;
}

std::uint16_t MaxAbsBits16(const std::uint16_t* h, std::int64_t n) {
  const hn::ScalableTag<std::uint16_t> d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  const auto mask = hn::Set(d, static_cast<std::uint16_t>(0x7fff));
  auto m = hn::Zero(d);
  std::int64_t j = 0;
  for (; j + L <= n; j += L) m = hn::Max(m, hn::And(hn::LoadU(d, h + j), mask));
  std::uint16_t r = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; j < n; ++j) r = std::max<std::uint16_t>(r, static_cast<std::uint16_t>(h[j] & 0x7fff));
  return r;
}

}  // namespace skvq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace skvq::cpu {

HWY_EXPORT(LoadRowF32);
HWY_EXPORT(MaxAbs);
HWY_EXPORT(MaxAbsBits16);

void load_row_f32(const std::byte* p, DType t, std::int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(LoadRowF32)(p, t, n, out);
}

float max_abs(const float* x, std::int64_t n) { return HWY_DYNAMIC_DISPATCH(MaxAbs)(x, n); }

std::uint16_t max_abs_bits16(const std::uint16_t* h, std::int64_t n) {
  return HWY_DYNAMIC_DISPATCH(MaxAbsBits16)(h, n);
}

}  // namespace skvq::cpu
#endif  // HWY_ONCE
