// Tensor views [B, H, T, D] over caller memory (any element strides) and an
// owning contiguous tensor. The cache reads inputs through views and returns
// views of its own buffers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "skvq/dtype.hpp"

namespace skvq {

using Shape4 = std::array<std::int64_t, 4>;

// A non-owning 4-d view. strides are in elements, not bytes; any
// non-negative strides are accepted (non-contiguous input is fine).
struct TensorView {
  std::byte* data = nullptr;
  DType dtype = DType::f32;
  Shape4 shape{0, 0, 0, 0};    // [B, H, T, D]
  Shape4 strides{0, 0, 0, 0};  // elements

  static TensorView contiguous(void* data, DType dtype, Shape4 shape);

  std::int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  bool is_contiguous() const;
  std::byte* ptr(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) const {
    const std::int64_t e = b * strides[0] + h * strides[1] + t * strides[2] + d * strides[3];
    return data + e * static_cast<std::int64_t>(dtype_size(dtype));
  }
  float at(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) const {
    return load_as_f32(ptr(b, h, t, d), dtype);
  }
  void set(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d, float v) const {
    store_from_f32(ptr(b, h, t, d), dtype, v);
  }
  // Rows [t0, t0 + n) along the token axis, same strides.
  TensorView slice_tokens(std::int64_t t0, std::int64_t n) const;
};

std::string shape_string(const Shape4& s);

// An owning, contiguous, zero-initialised tensor.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape4 shape);

  TensorView view() { return view_; }
  TensorView view() const { return view_; }
  const Shape4& shape() const { return view_.shape; }
  DType dtype() const { return view_.dtype; }
  std::int64_t numel() const { return view_.numel(); }
  std::byte* data() { return storage_.data(); }
  const std::byte* data() const { return storage_.data(); }
  std::size_t nbytes() const { return storage_.size(); }

  // Element-wise copy (with dtype conversion) of any view of the same shape.
  static Tensor copy_of(const TensorView& src, DType dtype);
  static Tensor copy_of(const TensorView& src) { return copy_of(src, src.dtype); }

 private:
  std::vector<std::byte> storage_;
  TensorView view_;
};

// Copy `src` into `dst` (same shape), converting dtype element by element.
void copy_into(const TensorView& src, const TensorView& dst);

}  // namespace skvq
