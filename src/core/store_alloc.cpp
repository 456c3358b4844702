#include "core/store_alloc.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>

#if defined(__SANITIZE_ADDRESS__)
#define SKVQ_STORE_REGIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define SKVQ_STORE_REGIONS 0
#endif
#endif
#if !defined(SKVQ_STORE_REGIONS) && defined(__linux__)
#define SKVQ_STORE_REGIONS 1
#endif
#if !defined(SKVQ_STORE_REGIONS)
#define SKVQ_STORE_REGIONS 0
#endif

#if SKVQ_STORE_REGIONS
#include <sys/mman.h>
#endif

namespace skvq::detail {

namespace {

constexpr std::align_val_t kAlign{64};

void* heap_allocate(std::size_t bytes) { return ::operator new(std::max<std::size_t>(bytes, 1), kAlign); }
void heap_deallocate(void* p) noexcept { ::operator delete(p, kAlign); }

#if SKVQ_STORE_REGIONS

constexpr std::size_t kHuge = std::size_t{2} << 20;
constexpr std::size_t kRegion = std::size_t{32} << 20;  // virtual; pages are touched as buffers are written

std::size_t round_up(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

struct Region {
  std::size_t size = 0;  // mapped bytes
  std::size_t used = 0;  // handed out from the start, in order
  std::size_t live = 0;  // buffers not freed
};

// Regions by start address; free buffers by size (reused as they are).
class Pool {
 public:
  void* allocate(std::size_t bytes) {
    const std::size_t b = round_up(bytes, 64);
    std::lock_guard<std::mutex> lk(mu_);
    if (auto f = free_.find(b); f != free_.end() && !f->second.empty()) {
      char* p = f->second.back();
      f->second.pop_back();
      ++region_of(p)->second.live;
      return p;
    }
    if (last_ == nullptr || regions_.at(last_).used + b > regions_.at(last_).size) {
      char* base = map_region(std::max(kRegion, round_up(b, kHuge)));
      if (base == nullptr) return nullptr;
      last_ = base;
    }
    Region& r = regions_.at(last_);
    char* p = last_ + r.used;
    r.used += b;
    ++r.live;
    return p;
  }

  // false: p is not from a region.
  bool deallocate(void* ptr, std::size_t bytes) noexcept {
    char* p = static_cast<char*>(ptr);
    std::lock_guard<std::mutex> lk(mu_);
    const auto it = region_of(p);
    if (it == regions_.end()) return false;
    if (--it->second.live > 0) {
      try {
        free_[round_up(bytes, 64)].push_back(p);
      } catch (...) {  // could not record it: the buffer stays unused until its region goes
      }
      return true;
    }
    // The region's last buffer: drop its free buffers and return it.
    char* base = it->first;
    const std::size_t size = it->second.size;
    for (auto& [b, list] : free_) {
      list.erase(std::remove_if(list.begin(), list.end(), [&](char* q) { return q >= base && q < base + size; }), list.end());
    }
    munmap(base, size);
    regions_.erase(it);
    if (last_ == base) last_ = nullptr;
    return true;
  }

  std::size_t mapped() noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    std::size_t n = 0;
    for (const auto& [base, r] : regions_) n += r.size;
    return n;
  }

 private:
  std::map<char*, Region>::iterator region_of(char* p) {
    auto it = regions_.upper_bound(p);
    if (it == regions_.begin()) return regions_.end();
    --it;
    return p < it->first + it->second.size ? it : regions_.end();
  }

  // size bytes at a 2 MiB boundary, advised for huge pages; nullptr when the
  // system gives none.
  char* map_region(std::size_t size) {
    void* m = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    char* raw = static_cast<char*>(m);
    char* base = reinterpret_cast<char*>(round_up(reinterpret_cast<std::uintptr_t>(raw), kHuge));
    if (base > raw) munmap(raw, static_cast<std::size_t>(base - raw));
    munmap(base + size, static_cast<std::size_t>(raw + size + kHuge - (base + size)));
#ifdef MADV_HUGEPAGE
    madvise(base, size, MADV_HUGEPAGE);  // advice only: without it the region keeps 4 KiB pages
#endif
    regions_.emplace(base, Region{size, 0, 0});
    return base;
  }

  std::mutex mu_;
  std::map<char*, Region> regions_;
  std::unordered_map<std::size_t, std::vector<char*>> free_;
  char* last_ = nullptr;  // the region buffers are handed out from
};

std::atomic<bool> g_use_regions{true};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: buffers may be freed during static destruction
  return *p;
}

#endif  // SKVQ_STORE_REGIONS

}  // namespace

void* store_allocate(std::size_t bytes) {
#if SKVQ_STORE_REGIONS
  if (bytes >= kStoreHugeMin && g_use_regions.load(std::memory_order_relaxed)) {
    if (void* p = pool().allocate(bytes)) return p;
  }
#endif
  return heap_allocate(bytes);
}

void store_deallocate(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
#if SKVQ_STORE_REGIONS
  if (bytes >= kStoreHugeMin && pool().deallocate(p, bytes)) return;
#else
  (void)bytes;
#endif
  heap_deallocate(p);
}

void store_use_regions(bool on) noexcept {
#if SKVQ_STORE_REGIONS
  g_use_regions.store(on, std::memory_order_relaxed);
#else
  (void)on;
#endif
}

std::size_t store_region_bytes() noexcept {
#if SKVQ_STORE_REGIONS
  return pool().mapped();
#else
  return 0;
#endif
}

}  // namespace skvq::detail
