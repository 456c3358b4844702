// Input checks shared by the cache kinds.
#include "core/input_check.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/thread_pool.hpp"
#include "cpu/convert_simd.hpp"
#include "ref/meta.hpp"
#include "skvq/error.hpp"

namespace skvq::detail {

namespace {

std::string pos(const char* name, std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) {
  return std::string(name) + "[" + std::to_string(b) + ", " + std::to_string(h) + ", " +
         std::to_string(t) + ", " + std::to_string(d) + "]";
}

void check_one(const TensorView& t, const char* name) {
  if (t.dtype != DType::f16 && t.dtype != DType::bf16 && t.dtype != DType::f32) {
    throw Error("skvq: " + std::string(name) + " dtype code " +
                std::to_string(static_cast<int>(t.dtype)) + " is not float16, bfloat16 or float32");
  }
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 1) {
      throw Error("skvq: " + std::string(name) + " shape " + shape_string(t.shape) +
                  " must have every extent >= 1");
    }
    if (t.strides[i] < 0) {
      throw Error("skvq: " + std::string(name) + " strides " + shape_string(t.strides) +
                  " must be non-negative");
    }
  }
  if (t.data == nullptr) throw Error("skvq: " + std::string(name) + " has no data (null pointer)");
}

}  // namespace

void check_kv_pair(const TensorView& keys, const TensorView& values) {
  check_one(keys, "keys");
  check_one(values, "values");
  if (keys.dtype != values.dtype) {
    throw Error("skvq: keys dtype " + std::string(dtype_name(keys.dtype)) + " and values dtype " +
                std::string(dtype_name(values.dtype)) + " differ");
  }
  for (int i = 0; i < 3; ++i) {
    if (keys.shape[i] != values.shape[i]) {
      throw Error("skvq: values shape " + shape_string(values.shape) + " does not match keys shape " +
                  shape_string(keys.shape) + " in [B, H, S]");
    }
  }
}

float value_limit(MetaType m, std::string* why) {
  switch (m) {
    case MetaType::fp16: *why = "the range of fp16 metadata; use metadata=fp32"; return ref::kMaxF16;
    case MetaType::fp8_e4m3:
      *why = "the range of fp8_e4m3 metadata; use metadata=fp16 or fp32";
      return ref::kMaxE4M3;
    case MetaType::fp32: *why = "the quantizer's float32 range"; return 0x1p126f;
  }
  return 0.0f;
}

namespace {

// Rows [r0, r1) of head (b, h): throws for the first element (in row-major order) that is not
// finite or exceeds `limit`.
void check_rows(const TensorView& t, const char* name, std::int64_t b, std::int64_t h, std::int64_t r0, std::int64_t r1,
                float limit, std::uint16_t f16_limit, const std::string& why, std::vector<float>& row) {
  const auto& s = t.shape;
  row.resize(static_cast<std::size_t>(s[3]));
  for (std::int64_t i = r0; i < r1; ++i) {
    if (t.strides[3] == 1 && t.dtype == DType::f16 &&
        cpu::max_abs_bits16(reinterpret_cast<const std::uint16_t*>(t.ptr(b, h, i, 0)), s[3]) <= f16_limit) {
      continue;
    }
    cpu::load_view_rows(t, b, h, i, 1, row.data());
    if (cpu::max_abs(row.data(), s[3]) <= limit) continue;  // false for NaN: find the culprit below
    for (std::int64_t d = 0; d < s[3]; ++d) {
      const float x = row[static_cast<std::size_t>(d)];
      if (!std::isfinite(x)) {
        std::ostringstream os;
        os << "skvq: " << pos(name, b, h, i, d) << " = " << x
           << " is not finite (NaN and infinity cannot be quantized)";
        throw Error(os.str());
      }
      if (std::fabs(x) > limit) {
        std::ostringstream os;
        os << "skvq: " << pos(name, b, h, i, d) << " = " << x << " is outside " << why << " (|x| <= " << limit
           << ")";
        throw Error(os.str());
      }
    }
  }
}

}  // namespace

void check_values(const TensorView& t, const char* name, float limit, const std::string& why, int threads) {
  const auto& s = t.shape;
  // fp16 rows: compare magnitude bits, no conversion (|x| <= limit <=> bits(|x|) <= bits(limit)
  // where limit rounds down to an fp16; infinity and NaN sort above every finite value).
  std::uint16_t f16_limit = 0x7bff;  // 65504
  if (limit < 65504.0f) {
    f16_limit = f32_to_f16(limit);
    if (f16_to_f32(f16_limit) > limit) --f16_limit;
  }
  // Items of a head's rows (in parallel for large tensors: ThreadPool::parallel_rows), each noting
  // whether it holds a bad element; the first of those, in row-major order, is then checked again
  // for its message.
  const std::int64_t heads = s[0] * s[1];
  if (t.numel() < kParallelElements) threads = 1;
  std::vector<std::array<std::int64_t, 3>> bad;  // (head, first row, end row)
  std::mutex mu;
  ThreadPool::global().parallel_rows(heads, s[2], threads, [&](std::int64_t bh, std::int64_t r0, std::int64_t r1) {
    thread_local std::vector<float> row;
    try {
      check_rows(t, name, bh / s[1], bh % s[1], r0, r1, limit, f16_limit, why, row);
    } catch (const Error&) {
      const std::lock_guard<std::mutex> lk(mu);
      bad.push_back({bh, r0, r1});
    }
  });
  if (bad.empty()) return;
  const auto first = *std::min_element(bad.begin(), bad.end());
  std::vector<float> row;
  check_rows(t, name, first[0] / s[1], first[0] % s[1], first[1], first[2], limit, f16_limit, why, row);
}

}  // namespace skvq::detail
