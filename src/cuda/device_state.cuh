// The device-resident state of one layer cache and the parameter structs of
// the kernels that read it.
#pragma once

#include <cstdint>

#include "cuda/fast_div.hpp"

namespace skvq::cuda {

// One side (keys or values) of the device cache.
struct DevSide {
  unsigned char* codes = nullptr;  // [slots][B*H][window * row_bytes]
  unsigned char* lo = nullptr;     // [slots][B*H][window][G] meta_bytes each
  unsigned char* scale = nullptr;  // [slots][B*H][window][G]
  __half* sinks = nullptr;         // [B, H, n_sink, D]
  __half* tail = nullptr;          // [B, H, window, D]
  int* perm = nullptr;             // [H, D] (null: identity)
  int D = 0, bits = 0, G = 0;
  std::int64_t row_bytes = 0;      // D * bits / 8
  std::int64_t slot_codes = 0;     // B*H*window*row_bytes
  std::int64_t slot_meta = 0;      // B*H*window*G*meta_bytes
};

// Element types of the attention's queries and output, as skvq::DType numbers them.
constexpr int kTypeF16 = 0, kTypeBF16 = 1, kTypeF32 = 2;

// Parameters of the split-K decode/prefill attention kernel.
struct AttnParams {
  const float* q = nullptr;   // [B, Hq, Sq, D] fp32 (16-byte aligned), what the kernels read
  // Queries as the caller gave them when they are 16-bit (q_type kTypeF16 or kTypeBF16): run_attention
  // widens them into its workspace and points q there.
  const void* q16 = nullptr;
  int q_type = kTypeF32;
  int out_type = kTypeF32;    // the output's element type (the combine kernels' store_out)
  float* ws_m = nullptr;      // [B*Hq*Sq][splits]
  float* ws_l = nullptr;      // [B*Hq*Sq][splits]
  float* ws_acc = nullptr;    // [B*Hq*Sq][splits][Dv] in the values' permuted order
  DevSide k, v;
  const __half* dense_k = nullptr;  // dense mode: [B, Hkv, T, D]
  const __half* dense_v = nullptr;
  int B = 0, Hq = 0, Hkv = 0, Sq = 0, D = 0;
  int Dv = 0;  // the values' head dim (0: D)
  int group = 0, meta = 0, meta_bytes = 0, window = 0;  // group: the keys' metadata group, min(group_size, D)
  int group_v = 0;  // the values' metadata group, min(group_size, Dv) (0: group)
  std::int64_t sinks = 0, q_end = 0, kv_len = 0;  // [0, sinks) exact, [sinks, q_end) packed, [q_end, kv_len) tail
  float scale = 1.0f;
  unsigned long long div_magic = 1;  // t / window == (t * div_magic) >> div_shift
  int div_shift = 32;
  FastDiv window_tiles;  // tiles of kFastTile tokens a window, where the window is a multiple of it
  int splits = 1;              // partials per query row in the workspace
  std::int64_t split_len = 0;  // tokens per split (multiple of 64)
  // Balanced tile claiming (attn_tmma_kernel; docs/performance.md): a KV head's tiles in chunks of
  // chunk_tiles; block `split` takes chunk `split` first, then chunks [splits, ..) claimed one at a
  // time through claims[b * Hkv + h] (zero before the body launch; the combine kernel zeroes the
  // first n_claims counters after its wait). chunk_tiles = split_len / tile and balance = 0: each
  // block its own split's tiles, as the other kernels take them.
  // (balance: chunks to claim exist; tiles and chunks: the head's, ceil(q_end / tile) and
  // ceil(tiles / chunk_tiles), worked out by the host so that a block keeps no register for them)
  // The head's last tiles go in small chunks (the step's tail): chunks [big_chunks, head_chunks) hold
  // small_tiles each, chunk c from tile c small_tiles + small_base (big_chunks = head_chunks: none).
  unsigned* claims = nullptr;
  int n_claims = 0, chunk_tiles = 0, balance = 0, head_tiles = 0, head_chunks = 0;
  int big_chunks = 0, small_tiles = 0, small_base = 0;
  // The general path's tensor-core kernel (attend_tc.cu): splits [0, body_splits) of the packed
  // body, split_len tokens each; the exact sinks and tail in splits [body_splits, splits), exact_len
  // tail tokens each (the first also the sinks). body_splits = 0: not that kernel.
  int body_splits = 0;
  std::int64_t exact_len = 0;
  // query rows a KV head serves: its Hq / Hkv query heads times Sq rows each
  __host__ __device__ int query_rows() const { return (Hq / Hkv) * Sq; }
};

}  // namespace skvq::cuda
