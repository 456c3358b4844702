// Internal state of an SkvqCache: the packed store, the exact tail and sinks,
// the frozen permutations and the counters. Save/load and the attention
// kernels read it directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/store_alloc.hpp"
#include "ref/pack.hpp"
#include "skvq/config.hpp"
#include "skvq/dtype.hpp"
#include "skvq/layer_cache.hpp"

namespace skvq::detail {

// One flushed window of one side (keys or values), for every (b, h).
//
//   codes: [B*H][codes_per_head]  one bit stream per (b, h) (layout in
//          ref/pack.hpp) holding n_rows * D codes, row-major, channels in
//          the side's permuted order; codes_per_head = ceil(n_rows*D*bits/8)
//   lo:    [B*H][n_rows][G]       metadata values, meta_bytes(metadata) each,
//   scale: [B*H][n_rows][G]       little-endian; G = ceil(D / group_size)
//
// Chunk 0 holds rows [n_sink, window) (its sink rows live apart, exact);
// every other chunk holds all `window` rows. Nothing else is allocated, so
// the bytes held equal the spec's accounting exactly.
struct PackedChunk {
  std::int64_t n_rows = 0;
  StoreBytes codes;  // store_alloc.hpp: large buffers on huge pages
  StoreBytes lo;
  StoreBytes scale;
  bool operator==(const PackedChunk&) const = default;
};

// Keys or values.
struct Side {
  int head_dim = 0;
  int bits = 0;
  std::vector<PackedChunk> chunks;
  std::vector<std::int32_t> perm;  // [H, D] xp[j] = x[perm[h*D + j]]; empty when absent
  std::vector<std::int32_t> inv;   // [H, D] inverse of perm; empty when absent
  std::vector<std::byte> sinks;    // [B, H, min(n_sink, q_end), D] in the input dtype, exact
  std::vector<std::byte> tail;     // [B, H, window, D] in the input dtype; rows [0, offset - q_end) live
  std::vector<std::byte> dense;    // [B, H, dense_cap, D] dense view (empty in packed-only mode)
};

struct SkvqState {
  Config cfg;
  Kernel kernel = Kernel::simd;
  int threads = 0;           // set_num_threads: 0 is every CPU of the pool
  bool initialized = false;  // B, H, Dv and dtype are fixed by the first accepted call
  DType dtype = DType::f16;
  std::int64_t batch = 0;
  std::int64_t heads = 0;
  std::int64_t offset = 0;     // tokens held
  std::int64_t q_end = 0;      // flush frontier, multiple of window
  std::int64_t dense_cap = 0;  // token capacity of the dense view
  std::int64_t reserved = 0;   // capacity asked for by reserve()
  std::int64_t fp16_key_bytes = 0;
  std::int64_t fp16_value_bytes = 0;
  std::int64_t tokens_seen = 0;
  Side k, v;

  std::int64_t esize() const { return static_cast<std::int64_t>(dtype_size(dtype)); }
  int groups(const Side& s) const { return (s.head_dim + cfg.group_size - 1) / cfg.group_size; }
  std::int64_t codes_per_head(const Side& s, std::int64_t n_rows) const {
    return ref::packed_bytes(n_rows * s.head_dim, s.bits);
  }
  std::int64_t meta_per_head(const Side& s, std::int64_t n_rows) const {
    return n_rows * groups(s) * meta_bytes(cfg.metadata);
  }
  std::int64_t sinks_held() const { return cfg.n_sink < q_end ? cfg.n_sink : q_end; }
  // Rows of chunk c in the packed store; the first is token c*window + first_row(c).
  std::int64_t first_row(std::size_t c) const { return c == 0 ? cfg.n_sink : 0; }

  // Reconstructs rows [i0, i0 + n) of chunk c for head (b, h) into out[n][D]
  // (original channel order; the SIMD dequantizer unless `reference` or
  // `kernel` asks for the reference, the same values either way).
  void dequantize(const Side& s, std::size_t c, std::int64_t bh, std::int64_t i0, std::int64_t n, float* out,
                  bool reference = false) const;
};

}  // namespace skvq::detail
