// The packed store's buffer allocator (core/store_alloc.hpp): alignment,
// contents kept apart, reuse of freed buffers, regions returned when empty.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "core/store_alloc.hpp"

using namespace skvq::detail;

namespace {

struct Block {
  std::uint8_t* p;
  std::size_t n;
  std::uint8_t tag;
};

void fill(const Block& b) { std::fill(b.p, b.p + b.n, b.tag); }
bool intact(const Block& b) { return std::all_of(b.p, b.p + b.n, [&](std::uint8_t v) { return v == b.tag; }); }

}  // namespace

TEST(StoreAlloc, BuffersAreAlignedDisjointAndKeepTheirContents) {
  const std::size_t before = store_region_bytes();
  std::mt19937 rng(7);
  // Sizes on both sides of the huge-page threshold, odd ones included.
  const std::vector<std::size_t> sizes = {1, 63, 4096, kStoreHugeMin - 1, kStoreHugeMin, 131072, 131072 + 40, 32768,
                                          (std::size_t{3} << 20) + 5, std::size_t{6} << 20};
  std::vector<Block> live;
  for (int round = 0; round < 200; ++round) {
    if (!live.empty() && rng() % 3 == 0) {  // free one at random, after checking it
      const std::size_t i = rng() % live.size();
      ASSERT_TRUE(intact(live[i])) << "buffer of " << live[i].n << " bytes overwritten";
      store_deallocate(live[i].p, live[i].n);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    const std::size_t n = sizes[rng() % sizes.size()];
    Block b{static_cast<std::uint8_t*>(store_allocate(n)), n, static_cast<std::uint8_t>(round)};
    ASSERT_NE(b.p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.p) % 64, 0u) << n << " bytes";
    fill(b);
    live.push_back(b);
  }
  for (const Block& b : live) {
    EXPECT_TRUE(intact(b)) << "buffer of " << b.n << " bytes overwritten";
    store_deallocate(b.p, b.n);
  }
  EXPECT_EQ(store_region_bytes(), before) << "regions left mapped after every buffer was freed";
}

TEST(StoreAlloc, FreedBufferIsReusedAndEmptyRegionReturned) {
  const std::size_t before = store_region_bytes();
  void* a = store_allocate(200000);
  const std::size_t with_a = store_region_bytes();
  if (with_a == before) {
    store_deallocate(a, 200000);
    GTEST_SKIP() << "no huge-page regions in this build (sanitizer or non-Linux)";
  }
  void* b = store_allocate(200000);
  EXPECT_EQ(store_region_bytes(), with_a) << "a second buffer should come from the same region";
  store_deallocate(a, 200000);
  void* c = store_allocate(200000);
  EXPECT_EQ(c, a) << "a freed buffer of the same size should be handed out again";
  store_deallocate(b, 200000);
  store_deallocate(c, 200000);
  EXPECT_EQ(store_region_bytes(), before);
}

TEST(StoreAlloc, VectorOfStoreBytesBehavesAsAVector) {
  StoreBytes v(100000, 3);
  v.insert(v.end(), 5000, 4);
  EXPECT_EQ(v.size(), 105000u);
  EXPECT_EQ(v[99999], 3);
  EXPECT_EQ(v[104999], 4);
  StoreBytes w = v;
  EXPECT_EQ(w, v);
  v.assign(10, 1);
  EXPECT_EQ(v.size(), 10u);
  EXPECT_EQ(w.size(), 105000u);
}
