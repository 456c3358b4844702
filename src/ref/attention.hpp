// Reference dense attention (float64 accumulation): the oracle for every
// attention kernel, and what the demo and the model runner compare against.
#pragma once

#include "skvq/tensor.hpp"

namespace skvq::ref {

// out[b, hq, i, :] = softmax_j(scale * q[b, hq, i, :] . k[b, hq / G, j, :]) v[b, hq / G, j, :]
// over j < kv_len - Sq + i + 1 (causal: query i sits at position kv_len - Sq + i),
// with G = Hq / Hkv (grouped-query attention).
//   q   [B, Hq, Sq, D]   any dtype and strides
//   k   [B, Hkv, kv_len, D]
//   v   [B, Hkv, kv_len, Dv]
//   out [B, Hq, Sq, Dv]  written in its own dtype
void dense_attention(const TensorView& q, const TensorView& k, const TensorView& v, float scale,
                     const TensorView& out);

}  // namespace skvq::ref
