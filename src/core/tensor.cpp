// TensorView and Tensor helpers.
#include "skvq/tensor.hpp"

#include <cstring>
#include <sstream>

#include "skvq/error.hpp"

namespace skvq {

TensorView TensorView::contiguous(void* data, DType dtype, Shape4 shape) {
  TensorView v;
  v.data = static_cast<std::byte*>(data);
  v.dtype = dtype;
  v.shape = shape;
  v.strides = {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
  return v;
}

bool TensorView::is_contiguous() const {
  return strides[3] == 1 && strides[2] == shape[3] && strides[1] == shape[2] * shape[3] &&
         strides[0] == shape[1] * shape[2] * shape[3];
}

TensorView TensorView::slice_tokens(std::int64_t t0, std::int64_t n) const {
  if (t0 < 0 || n < 0 || t0 + n > shape[2]) {
    throw Error("skvq: slice_tokens [" + std::to_string(t0) + ", " + std::to_string(t0 + n) +
                ") is outside T=" + std::to_string(shape[2]));
  }
  TensorView v = *this;
  v.data = data + t0 * strides[2] * static_cast<std::int64_t>(dtype_size(dtype));
  v.shape[2] = n;
  return v;
}

std::string shape_string(const Shape4& s) {
  std::ostringstream os;
  os << '[' << s[0] << ", " << s[1] << ", " << s[2] << ", " << s[3] << ']';
  return os.str();
}

Tensor::Tensor(DType dtype, Shape4 shape) {
  for (auto n : shape) {
    if (n < 0) throw Error("skvq: Tensor shape " + shape_string(shape) + " has a negative extent");
  }
  storage_.assign(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]) * dtype_size(dtype),
                  std::byte{0});
  view_ = TensorView::contiguous(storage_.data(), dtype, shape);
}

Tensor Tensor::copy_of(const TensorView& src, DType dtype) {
  Tensor t(dtype, src.shape);
  copy_into(src, t.view());
  return t;
}

void copy_into(const TensorView& src, const TensorView& dst) {
  if (src.shape != dst.shape) {
    throw Error("skvq: copy_into shape mismatch " + shape_string(src.shape) + " vs " +
                shape_string(dst.shape));
  }
  const auto& s = src.shape;
  const bool rows_dense = src.strides[3] == 1 && dst.strides[3] == 1 && src.dtype == dst.dtype;
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t h = 0; h < s[1]; ++h)
      for (std::int64_t t = 0; t < s[2]; ++t) {
        if (rows_dense) {
          std::memcpy(dst.ptr(b, h, t, 0), src.ptr(b, h, t, 0),
                      static_cast<std::size_t>(s[3]) * dtype_size(src.dtype));
          continue;
        }
        for (std::int64_t d = 0; d < s[3]; ++d) {
          if (src.dtype == dst.dtype) {
            std::memcpy(dst.ptr(b, h, t, d), src.ptr(b, h, t, d), dtype_size(src.dtype));
          } else {
            dst.set(b, h, t, d, src.at(b, h, t, d));
          }
        }
      }
}

}  // namespace skvq
