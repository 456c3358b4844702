// Parameters of the attention kernel family (ref and cpu SIMD): where the
// token rows come from and the shapes.
#pragma once

#include <cstdint>

#include "core/skvq_state.hpp"
#include "skvq/tensor.hpp"

namespace skvq {

struct AttendParams {
  // Token rows: a packed SKVQ cache (st != nullptr) or dense views.
  const detail::SkvqState* st = nullptr;
  TensorView k;  // [B, H, kv_len, D]  dense mode only
  TensorView v;  // [B, H, kv_len, Dv] dense mode only
  TensorView q;    // [B, Hq, Sq, D]
  TensorView out;  // [B, Hq, Sq, Dv]
  float scale = 1.0f;
  std::int64_t batch = 0, num_q_heads = 0, num_kv_heads = 0, sq = 0, kv_len = 0, head_dim = 0, v_head_dim = 0;
  int num_threads = 1;
};

}  // namespace skvq
