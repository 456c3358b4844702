// Attention straight from a layer cache: exact sinks, packed body and exact
// tail are read in place, never materialized as a dense history.
#pragma once

#include "skvq/layer_cache.hpp"
#include "skvq/tensor.hpp"

namespace skvq {

struct AttendOptions {
  Kernel kernel = Kernel::simd;  // Kernel::reference: the scalar reference (src/ref)
  int num_threads = 0;           // 0: every CPU the process may run on (its affinity mask)
};

// out[b, hq, i, :] = sum_j softmax_j(scale * q[b, hq, i, :] . k[b, h, j, :]) v[b, h, j, :]
// with h = hq / (Hq / H) (grouped-query attention) and j <= offset - Sq + i:
// query row i sits at position offset - Sq + i, so Sq new rows appended to
// the cache just before attend get causal attention over the history and
// each other.
//   queries [B, Hq, Sq, D]  Hq a multiple of the cache's H, 1 <= Sq <= offset
//   out     [B, Hq, Sq, Dv] any dtype (float32 accumulation inside)
// Throws skvq::Error naming the argument on any mismatch; the cache is never changed.
void attend(const LayerCache& cache, const TensorView& queries, float scale, const TensorView& out,
            const AttendOptions& options = {});

// Same, returning the output as a new tensor in the queries' dtype.
Tensor attend(const LayerCache& cache, const TensorView& queries, float scale,
              const AttendOptions& options = {});

// The same kernel over dense keys [B, H, T, D] and values [B, H, T, Dv]
// (fp16, bf16 or fp32): the fp16 baseline of the benchmarks.
void attend_dense(const TensorView& queries, const TensorView& keys, const TensorView& values, float scale,
                  const TensorView& out, const AttendOptions& options = {});

}  // namespace skvq
