// Launchers of the CUDA kernels (called by the host-side device cache).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/device_state.cuh"
#include "skvq/dtype.hpp"

namespace skvq::cuda {

// Split-K attention + combine enqueued on `stream`; out [B, Hq, Sq, Dv] of p.out_type (device).
void run_attention(AttnParams p, bool dense, int requested_splits, void* out, cudaStream_t stream);
int choose_splits(const AttnParams& p, int requested);
bool mma_enabled();
// The general attention path (attend_general.cu): head dims other than 128 and the code widths the
// tuned kernels do not take; every token of a split in one kernel, then its own combine. Head dims
// D and Dv each a multiple of 16 in [16, kGeneralMaxHeadDim]. p's splits, split_len and workspace
// set by run_attention.
constexpr int kGeneralMaxHeadDim = 256;
bool head_dim_supported(std::int64_t d);  // a multiple of 16 in [16, kGeneralMaxHeadDim]
bool general_shape_supported(std::int64_t D, std::int64_t Dv);
void launch_general(const AttnParams& p, bool dense, void* out, cudaStream_t stream);
// The general path's tensor-core kernel for the packed body (attend_tc.cu): tc_shape_ok says whether
// it takes p's shape (head dims 32, 64, 96, 128 or 256 for keys and values alike, codes of 2 or 4
// bits a side or of 1, 3, 5, 6 or 7 bits both sides, and at head dim 128 any other pair of 1-8-bit
// keys and 1-8-bit values (their widths read at run time), metadata groups of 32, 64 or 128 dividing the row or 96 at head dim 96, the window a
// multiple of 16, packed rows present; SKVQ_CUDA_GENERAL=float: never), plan_tc sets p's splits
// for it, launch_tc enqueues it (launch_general does, and the exact tokens' splits and the combine
// after it).
bool tc_shape_ok(const AttnParams& p);
void plan_tc(AttnParams& p, int requested_splits);
void launch_tc(const AttnParams& p, cudaStream_t stream);

// The chunk kernel (attend_chunk.cu): the packed body for many query rows a KV head (chunked
// prefill), kChunkRows rows a block, through the pipelined kernels' tile ring; run_attention takes
// it where body_kernel picks it (attend.cu). chunk_shape_ok: head dim 128, metadata groups of 32, 64
// or 128, values of 2 to 8 bits among the tuned pairs of code widths. chunk_kernel: the kernel for
// p's widths, metadata and group (nullptr where the shape is not taken), launched as the other
// body kernels (grid (splits, Hkv, B x row groups), 128 threads, chunk_smem_bytes(p) of dynamic
// shared memory, (p, first row)).
using BodyKernelFn = void (*)(AttnParams, int);
constexpr int kChunkRows = 64;
bool chunk_shape_ok(const AttnParams& p);
BodyKernelFn chunk_kernel(const AttnParams& p);
int chunk_smem_bytes(const AttnParams& p);

// Flush parameters: n_chunks whole windows of rows read from `src` ([B, H, src_tokens, D] of
// src_type, token t of the window c at row first + c * window + t).
struct FlushParams {
  // (typed as fp16 whatever src_type says: with `const void*` ptxas spilled more in the 8-bit
  // flush kernel without the search, 24 bytes against 4)
  const __half* src = nullptr;
  std::int64_t src_tokens = 0, first = 0;
  int n_chunks = 0;
  std::int64_t slot0 = 0;  // slot of the first chunk (= its chunk index)
  int B = 0, H = 0, window = 0, n_sink = 0;
  int group = 0, meta = 0, meta_bytes = 0;
  static constexpr int kMaxGrid = 8;
  float grid[kMaxGrid] = {};  // the clip factors (the first n_grid), passed by value with the launch
  int n_grid = 0;
  // 4- and 8-bit codes by the exact quotient only (no certified shortcut):
  // SKVQ_CUDA_FLUSH=quotients, for tests and side-by-side benchmarks
  bool quotients_only = false;
  // the clip search's errors summed exactly for every group (no certified
  // estimate first): SKVQ_CUDA_FLUSH=exact, for tests and benchmarks
  bool exact_search = false;
  signed char src_type = kTypeF16;  // kTypeF16, kTypeBF16 (rounded to fp16 as they are read) or kTypeF32 (likewise)
};

// Rows [first, first + n) of each of rows_bh entries of src ([rows_bh][src_tokens][D], bf16 or fp32,
// aligned to its element) rounded to fp16 (to nearest, ties to even, as the host conversion rounds)
// into rows [dst_first, dst_first + n) of dst ([rows_bh][dst_tokens][D], 16-byte aligned rows); D a
// multiple of 8. One launch on `stream` (convert.cu).
void run_rows_to_half(const void* src, DType src_type, std::int64_t rows_bh, std::int64_t src_tokens, std::int64_t first,
                      std::int64_t n, __half* dst, std::int64_t dst_tokens, std::int64_t dst_first, int D,
                      cudaStream_t stream);

// Permutations from chunk 0's rows (all `window` rows, sinks included).
void run_perm(const FlushParams& f, DevSide& side, cudaStream_t stream);
// Quantize and pack the chunks' rows (sink rows of chunk 0 skipped) into their slots.
void run_flush(const FlushParams& f, DevSide& side, cudaStream_t stream);

}  // namespace skvq::cuda
