// attend(): argument checks, then the reference or SIMD kernel.
#include "skvq/attention.hpp"

#include <algorithm>
#include <thread>

#include "core/attend_params.hpp"
#include "core/thread_pool.hpp"
#include "cpu/attend_simd.hpp"
#include "ref/attend.hpp"
#include "skvq/error.hpp"

namespace skvq {

namespace {

void check_view(const TensorView& t, const char* name) {
  if (t.dtype != DType::f16 && t.dtype != DType::bf16 && t.dtype != DType::f32) {
    throw Error(std::string("skvq: attend ") + name + " dtype is not float16, bfloat16 or float32");
  }
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 1) throw Error(std::string("skvq: attend ") + name + " shape " + shape_string(t.shape) + " has an empty axis");
    if (t.strides[i] < 0) throw Error(std::string("skvq: attend ") + name + " has negative strides");
  }
  if (t.data == nullptr) throw Error(std::string("skvq: attend ") + name + " has no data (null pointer)");
}

void run(AttendParams& p, const AttendOptions& o) {
  const std::int64_t G = p.num_kv_heads > 0 ? p.num_q_heads / p.num_kv_heads : 0;
  if (p.q.shape[0] != p.batch) {
    throw Error("skvq: attend queries batch B=" + std::to_string(p.q.shape[0]) + " differs from the cache's B=" +
                std::to_string(p.batch));
  }
  if (G < 1 || p.num_q_heads % p.num_kv_heads != 0) {
    throw Error("skvq: attend queries heads Hq=" + std::to_string(p.num_q_heads) + " must be a multiple of the cache's H=" +
                std::to_string(p.num_kv_heads));
  }
  if (p.q.shape[3] != p.head_dim) {
    throw Error("skvq: attend queries head dim D=" + std::to_string(p.q.shape[3]) + " differs from the keys' D=" +
                std::to_string(p.head_dim));
  }
  if (p.sq > p.kv_len) {
    throw Error("skvq: attend queries Sq=" + std::to_string(p.sq) + " exceeds the " + std::to_string(p.kv_len) +
                " tokens held (query rows must already be in the cache)");
  }
  const Shape4 want{p.batch, p.num_q_heads, p.sq, p.v_head_dim};
  if (p.out.shape != want) {
    throw Error("skvq: attend out shape " + shape_string(p.out.shape) + " must be " + shape_string(want));
  }
  if (!(p.scale == p.scale) || p.scale == INFINITY || p.scale == -INFINITY) {
    throw Error("skvq: attend scale=" + std::to_string(p.scale) + " must be finite");
  }
  const int hw = std::max(1, detail::ThreadPool::global().size());
  p.num_threads = o.num_threads > 0 ? std::min(o.num_threads, hw) : hw;
  if (o.kernel == Kernel::reference) ref::attend(p);
  else cpu::attend(p);
}

}  // namespace

void attend(const LayerCache& cache, const TensorView& queries, float scale, const TensorView& out,
            const AttendOptions& options) {
  check_view(queries, "queries");
  check_view(out, "out");
  AttendParams p;
  p.q = queries;
  p.out = out;
  p.scale = scale;
  p.num_q_heads = queries.shape[1];
  p.sq = queries.shape[2];
  if (const auto* s = dynamic_cast<const SkvqCache*>(&cache)) {
    const detail::SkvqState& st = s->state();
    if (!st.initialized || st.offset == 0) throw Error("skvq: attend on an empty cache");
    p.st = &st;
    p.batch = st.batch;
    p.num_kv_heads = st.heads;
    p.kv_len = st.offset;
    p.head_dim = st.k.head_dim;
    p.v_head_dim = st.v.head_dim;
  } else if (const auto* pc = dynamic_cast<const PlainCache*>(&cache)) {
    if (pc->offset() == 0) throw Error("skvq: attend on an empty cache");
    p.k = pc->keys();
    p.v = pc->values();
    p.batch = p.k.shape[0];
    p.num_kv_heads = p.k.shape[1];
    p.kv_len = p.k.shape[2];
    p.head_dim = p.k.shape[3];
    p.v_head_dim = p.v.shape[3];
  } else {
    throw Error("skvq: attend does not support cache kind '" + cache.kind() + "'");
  }
  run(p, options);
}

Tensor attend(const LayerCache& cache, const TensorView& queries, float scale, const AttendOptions& options) {
  std::int64_t dv = 0;
  if (const auto* s = dynamic_cast<const SkvqCache*>(&cache)) dv = s->state().v.head_dim;
  else if (const auto* pc = dynamic_cast<const PlainCache*>(&cache)) dv = pc->values().shape[3];
  Tensor out(queries.dtype, {queries.shape[0], queries.shape[1], queries.shape[2], std::max<std::int64_t>(dv, 1)});
  attend(cache, queries, scale, out.view(), options);
  return out;
}

void attend_dense(const TensorView& queries, const TensorView& keys, const TensorView& values, float scale,
                  const TensorView& out, const AttendOptions& options) {
  check_view(queries, "queries");
  check_view(keys, "keys");
  check_view(values, "values");
  check_view(out, "out");
  if (keys.shape[0] != values.shape[0] || keys.shape[1] != values.shape[1] || keys.shape[2] != values.shape[2]) {
    throw Error("skvq: attend_dense values shape " + shape_string(values.shape) + " does not match keys " +
                shape_string(keys.shape) + " in [B, H, T]");
  }
  AttendParams p;
  p.q = queries;
  p.out = out;
  p.k = keys;
  p.v = values;
  p.scale = scale;
  p.batch = keys.shape[0];
  p.num_kv_heads = keys.shape[1];
  p.kv_len = keys.shape[2];
  p.head_dim = keys.shape[3];
  p.v_head_dim = values.shape[3];
  p.num_q_heads = queries.shape[1];
  p.sq = queries.shape[2];
  run(p, options);
}

}  // namespace skvq
