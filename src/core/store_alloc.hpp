// Memory of the packed store's chunk buffers.
//
// Attention reads every chunk of a long history once per step, so the store's
// pages matter: on 4 KiB pages each step walks tens of thousands of page
// tables and the hardware prefetchers stop at every page. Buffers of at least
// kStoreHugeMin bytes therefore come from regions of virtual memory aligned to
// 2 MiB and advised for transparent huge pages (Linux `madvise` mode), handed
// out one after another; a freed buffer is reused by the next of the same size
// and a region is returned to the system when its last buffer is freed.
// Smaller buffers, other systems and sanitizer builds use operator new.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace skvq::detail {

inline constexpr std::size_t kStoreHugeMin = std::size_t{16} << 10;

// 64-byte aligned; bytes > 0. Throws std::bad_alloc.
void* store_allocate(std::size_t bytes);
// p from store_allocate(bytes).
void store_deallocate(void* p, std::size_t bytes) noexcept;

// Bytes of the regions mapped now (for tests and reports).
std::size_t store_region_bytes() noexcept;
// Whether buffers allocated from now on may come from the regions (default
// true; benchmarks switch it off to measure what the regions bring).
void store_use_regions(bool on) noexcept;

template <class T>
struct StoreAllocator {
  using value_type = T;
  StoreAllocator() noexcept = default;
  template <class U>
  StoreAllocator(const StoreAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(store_allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { store_deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const StoreAllocator<U>&) const noexcept {
    return true;
  }
};

using StoreBytes = std::vector<std::uint8_t, StoreAllocator<std::uint8_t>>;

}  // namespace skvq::detail
