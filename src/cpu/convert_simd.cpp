// Highway SIMD conversions (see convert_simd.hpp).
#include "cpu/convert_simd.hpp"
#include "cpu/byte_codes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ref/dequantize.hpp"
#include "ref/meta.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/convert_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

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

void StoreRowF32(std::byte* p, DType t, std::int64_t n, const float* in) {
  const hn::ScalableTag<float> d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t j = 0;
  // (x86 targets with F16C only: Highway's software conversion elsewhere does
  // not round subnormals and overflow as the scalar store does)
  if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && t == DType::f16) {
    const hn::Rebind<hwy::float16_t, decltype(d)> dh;
    auto* h = reinterpret_cast<hwy::float16_t*>(p);
    for (; j + L <= n; j += L) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, in + j)), dh, h + j);
  }
  skvq::store_row_f32(p + j * static_cast<std::int64_t>(dtype_size(t)), t, n - j, in + j);
}

void StreamCopy(std::byte* dst, const std::byte* src, std::size_t bytes) {
  const hn::ScalableTag<std::uint8_t> d;
  const std::size_t N = hn::Lanes(d);
  const auto* in = reinterpret_cast<const std::uint8_t*>(src);
  auto* out = reinterpret_cast<std::uint8_t*>(dst);
  // the bytes before dst's first vector-aligned address, then whole aligned vectors, then the rest
  const std::size_t head = std::min(bytes, (N - reinterpret_cast<std::uintptr_t>(out) % N) % N);
  std::memcpy(out, in, head);
  std::size_t i = head;
  for (; i + N <= bytes; i += N) hn::Stream(hn::LoadU(d, in + i), d, out + i);
  std::memcpy(out + i, in + i, bytes - i);
  hwy::FlushStream();
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

void DequantizeRows(const std::uint8_t* stream, std::int64_t stream_bytes, std::int64_t row0, std::int64_t n, int D,
                    int bits, int g, MetaType meta, const std::uint8_t* lo, const std::uint8_t* scale, std::int64_t mrow,
                    const std::int32_t* perm, float* out) {
  if ((bits != 1 && bits != 2 && bits != 4 && bits != 8) || (static_cast<std::int64_t>(D) * bits) % 8 != 0) {
    for (std::int64_t i = 0; i < n; ++i) {
      ref::dequantize_row(stream, stream_bytes, row0 + i, D, bits, g, meta, lo + i * mrow, scale + i * mrow, perm,
                          out + i * D);
    }
    return;
  }
  const float* table = byte_codes(bits);  // nullptr at 8 bits (read directly)
  const hn::ScalableTag<float> d;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d)), per = 8 / bits, rb = D * bits / 8;
  const int mb = meta_bytes(meta);
  thread_local std::vector<float> buf;
  buf.resize(static_cast<std::size_t>(D));
  float* c = buf.data();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint8_t* src = stream + (row0 + i) * rb;
    float* row = out + i * D;
    float* x = perm ? c : row;  // the permuted row, scattered at the end
    if (bits == 8) {
      for (std::int64_t j = 0; j < D; ++j) x[j] = static_cast<float>(src[j]);
    } else {
      for (std::int64_t k = 0; k < rb; ++k) {
        std::memcpy(x + k * per, table + src[k] * per, static_cast<std::size_t>(per) * sizeof(float));
      }
    }
    for (std::int64_t k = 0, j0 = 0; j0 < D; ++k, j0 += g) {  // per group: the product rounded, then the sum
      const float lo_f = ref::meta_load(lo + i * mrow + k * mb, meta), sc_f = ref::meta_load(scale + i * mrow + k * mb, meta);
      const std::int64_t j1 = std::min<std::int64_t>(D, j0 + g);
      std::int64_t j = j0;
      const auto vs = hn::Set(d, sc_f), vl = hn::Set(d, lo_f);
      for (; j + L <= j1; j += L) hn::StoreU(hn::Add(hn::Mul(hn::LoadU(d, x + j), vs), vl), d, x + j);
      for (; j < j1; ++j) {
        const float prod = x[j] * sc_f;
        x[j] = prod + lo_f;
      }
    }
    if (perm) {
      for (std::int64_t j = 0; j < D; ++j) row[perm[j]] = c[j];
    }
  }
}

}  // namespace skvq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace skvq::cpu {

HWY_EXPORT(LoadRowF32);
HWY_EXPORT(StoreRowF32);

void store_row_f32(std::byte* p, DType t, std::int64_t n, const float* in) {
  HWY_DYNAMIC_DISPATCH(StoreRowF32)(p, t, n, in);
}
HWY_EXPORT(StreamCopy);
void stream_copy(std::byte* dst, const std::byte* src, std::size_t bytes) {
  HWY_DYNAMIC_DISPATCH(StreamCopy)(dst, src, bytes);
}
HWY_EXPORT(MaxAbs);
HWY_EXPORT(MaxAbsBits16);
HWY_EXPORT(DequantizeRows);

void dequantize_rows(const std::uint8_t* stream, std::int64_t stream_bytes, std::int64_t row0, std::int64_t n, int D,
                     int bits, int g, MetaType meta, const std::uint8_t* lo, const std::uint8_t* scale,
                     std::int64_t mrow, const std::int32_t* perm, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeRows)(stream, stream_bytes, row0, n, D, bits, g, meta, lo, scale, mrow, perm, out);
}

void load_row_f32(const std::byte* p, DType t, std::int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(LoadRowF32)(p, t, n, out);
}

void load_view_rows(const TensorView& v, std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t n, float* out) {
  const std::int64_t D = v.shape[3];
  if (v.strides[3] == 1 && (v.strides[2] == D || n == 1)) {
    cpu::load_row_f32(v.ptr(b, h, t, 0), v.dtype, n * D, out);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    if (v.strides[3] == 1) {
      cpu::load_row_f32(v.ptr(b, h, t + i, 0), v.dtype, D, out + i * D);
    } else {
      for (std::int64_t d = 0; d < D; ++d) out[i * D + d] = v.at(b, h, t + i, d);
    }
  }
}

float max_abs(const float* x, std::int64_t n) { return HWY_DYNAMIC_DISPATCH(MaxAbs)(x, n); }

std::uint16_t max_abs_bits16(const std::uint16_t* h, std::int64_t n) {
  return HWY_DYNAMIC_DISPATCH(MaxAbsBits16)(h, n);
}

}  // namespace skvq::cpu
#endif  // HWY_ONCE
