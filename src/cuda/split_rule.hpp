// How many splits (blocks per KV head) the pipelined attention kernels take
// over a packed body of `tiles` tiles: blocks run in waves of `slots` resident
// at once (SMs x blocks an SM, from the occupancy calculator), and a block
// costs its tiles plus a fixed part (prologue, the first copies' latency, the
// merge, the combine's work for its partial) of about `block_tiles` tiles
// (session 21's sweep at B=32 Hkv=8 32k grew by ~7 ns a block, about two
// tiles' work). The count chosen is the one, as launched (a split holds
// ceil(tiles / s) whole tiles, so some counts launch as fewer), with the
// fewest waves x (block_tiles + tiles a split); the fewer splits on a tie.
// Host-only and free of CUDA so that the host tests check it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace skvq::cuda {

struct SplitChoice {
  int splits = 1;
  std::int64_t tiles_per_split = 1, waves = 1;
  double cost = 0;
};

// The cost of s splits (tiles per split as launched; waves of heads x s blocks).
inline SplitChoice split_cost(std::int64_t heads, std::int64_t tiles, std::int64_t slots, int s, double block_tiles) {
  SplitChoice c;
  c.splits = s;
  c.tiles_per_split = (tiles + s - 1) / s;
  c.waves = (heads * s + slots - 1) / slots;
  c.cost = static_cast<double>(c.waves) * (block_tiles + static_cast<double>(c.tiles_per_split));
  return c;
}

inline SplitChoice choose_split_count(std::int64_t heads, std::int64_t tiles, std::int64_t slots, double block_tiles = 2.0,
                                      int max_splits = 256) {
  heads = std::max<std::int64_t>(1, heads), tiles = std::max<std::int64_t>(1, tiles), slots = std::max<std::int64_t>(1, slots);
  SplitChoice best = split_cost(heads, tiles, slots, 1, block_tiles);
  const std::int64_t top = std::min<std::int64_t>(max_splits, tiles);
  for (std::int64_t s = 2; s <= top; ++s) {
    const SplitChoice c = split_cost(heads, tiles, slots, static_cast<int>(s), block_tiles);
    if ((tiles + c.tiles_per_split - 1) / c.tiles_per_split != s) continue;  // launched as fewer splits: counted there
    if (c.cost < best.cost) best = c;
  }
  return best;
}

// choose_split_count's splits (default cost model) for the calling thread's recent questions: a
// direct-mapped table of 16 entries a thread. Each attention call asks before it launches its body
// kernel, and the loop over 256 candidates (three 64-bit divisions each) took ~1.2 us of host time
// (dev CPU, session 30), all of it in front of the launch; a decode step asks the same question once
// a layer, and the answer changes at most once every 128 tokens (a tile). Answers are the loop's,
// whatever was asked before (tests/test_cuda.cpp).
inline int cached_split_count(std::int64_t heads, std::int64_t tiles, std::int64_t slots) {
  struct Entry {
    std::int64_t heads = -1, tiles = -1, slots = -1;
    int splits = 1;
  };
  thread_local Entry table[16];
  const auto h = static_cast<std::uint64_t>(heads) * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(tiles) * 0xC2B2AE3D27D4EB4Full ^
                 static_cast<std::uint64_t>(slots) * 0x165667B19E3779F9ull;
  Entry& e = table[(h >> 60) & 15u];
  if (e.heads != heads || e.tiles != tiles || e.slots != slots) e = Entry{heads, tiles, slots, choose_split_count(heads, tiles, slots).splits};
  return e.splits;
}

// The rule before session 23, kept for benchmarks (SKVQ_CUDA_SPLIT_RULE=fill): the count, up to
// min(256, whole tiles), whose last wave is fullest (blocks / (waves x slots)), less 0.002 a split
// (the smaller count on a tie).
inline int fill_split_count(std::int64_t heads, std::int64_t whole_tiles, std::int64_t slots) {
  heads = std::max<std::int64_t>(1, heads), slots = std::max<std::int64_t>(1, slots);
  const std::int64_t max_splits = std::max<std::int64_t>(1, std::min<std::int64_t>(256, whole_tiles));
  int best = 1;
  double best_score = -1e30;
  for (std::int64_t s = 1; s <= max_splits; ++s) {
    const std::int64_t blocks = heads * s, waves = (blocks + slots - 1) / slots;
    const double score = static_cast<double>(blocks) / static_cast<double>(waves * slots) - 0.002 * static_cast<double>(s);
    if (score > best_score) best_score = score, best = static_cast<int>(s);
  }
  return best;
}

}  // namespace skvq::cuda
