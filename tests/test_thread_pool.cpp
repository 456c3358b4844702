// The thread pool behind attention (core/thread_pool.hpp): every index run
// exactly once whatever the thread count, jobs back to back (workers still
// spinning from the last one) and after the workers have gone to sleep, the
// first exception rethrown and the pool usable after it, nested calls inline.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.hpp"

using skvq::detail::ThreadPool;

namespace {

void expect_each_once(ThreadPool& pool, std::int64_t n, int threads) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  pool.parallel_for(n, threads, [&](std::int64_t i) { hits[static_cast<std::size_t>(i)].fetch_add(1); });
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << "n " << n << " threads " << threads << " i " << i;
}

}  // namespace

TEST(ThreadPool, RunsEveryIndexOnceBackToBackAndAfterSleeping) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 4);
  for (int round = 0; round < 300; ++round) {  // back to back: workers taken while they spin
    expect_each_once(pool, 1 + round % 37, 1 + round % 6);
  }
  for (int round = 0; round < 3; ++round) {  // after the spin window: workers woken from sleep
    std::this_thread::sleep_for(ThreadPool::kSpin * 5);
    expect_each_once(pool, 100, 4);
  }
  pool.parallel_for(0, 4, [](std::int64_t) { FAIL() << "no index for n = 0"; });
}

TEST(ThreadPool, RethrowsAndStaysUsable) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(50, 3,
                                 [&](std::int64_t i) {
                                   ran.fetch_add(1);
                                   if (i == 7) throw std::runtime_error("task 7");
                                 }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 50);  // the other tasks still ran
  expect_each_once(pool, 64, 3);
}

// A parallel_for from inside a task (a cache flush inside an attention task,
// say) runs inline instead of waiting for the job it is part of; the pool
// runs jobs in parallel again after.
TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(20 * 30);
  pool.parallel_for(20, 4, [&](std::int64_t i) {
    const std::thread::id outer = std::this_thread::get_id();
    pool.parallel_for(30, 4, [&](std::int64_t j) {
      EXPECT_EQ(std::this_thread::get_id(), outer);
      hits[static_cast<std::size_t>(i * 30 + j)].fetch_add(1);
    });
  });
  for (std::size_t k = 0; k < hits.size(); ++k) ASSERT_EQ(hits[k].load(), 1) << k;
  expect_each_once(pool, 100, 4);
}

// parallel_ranges: contiguous, non-empty ranges covering [0, n) once, at most 4 a thread, of
// sizes within one of each other; fewer items than ranges give a range an item.
TEST(ThreadPool, RangesCoverEveryIndexOnce) {
  ThreadPool pool(3);
  for (std::int64_t n : {1, 2, 7, 16, 17, 1000, 2049})
    for (int threads : {1, 2, 4}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      std::atomic<std::int64_t> ranges{0}, smallest{n}, largest{0};
      pool.parallel_ranges(n, threads, [&](std::int64_t b, std::int64_t e) {
        ASSERT_LT(b, e);
        ranges.fetch_add(1);
        std::int64_t s = smallest.load();
        while (e - b < s && !smallest.compare_exchange_weak(s, e - b)) {
        }
        std::int64_t l = largest.load();
        while (e - b > l && !largest.compare_exchange_weak(l, e - b)) {
        }
        for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
      });
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << n << " " << i;
      EXPECT_EQ(ranges.load(), std::min<std::int64_t>(n, 4 * threads)) << n;
      EXPECT_LE(largest.load() - smallest.load(), 1) << n;
    }
  pool.parallel_ranges(0, 4, [](std::int64_t, std::int64_t) { FAIL() << "no range for n = 0"; });
}

// parallel_rows: every (head, row) once, in items of one head's consecutive rows; where heads are
// fewer than twice the threads a head's rows are cut into several items (so that every thread has
// work), else each head is one item.
TEST(ThreadPool, RowsCoverEveryHeadAndRowOnce) {
  ThreadPool pool(3);
  for (std::int64_t heads : {1, 3, 8, 40})
    for (std::int64_t rows : {1, 5, 1000})
      for (int threads : {1, 4}) {
        std::vector<std::atomic<int>> hits(static_cast<std::size_t>(heads * rows));
        std::atomic<std::int64_t> items{0};
        pool.parallel_rows(heads, rows, threads, [&](std::int64_t bh, std::int64_t r0, std::int64_t r1) {
          ASSERT_TRUE(bh >= 0 && bh < heads && r0 >= 0 && r0 < r1 && r1 <= rows) << bh << " " << r0 << " " << r1;
          items.fetch_add(1);
          for (std::int64_t i = r0; i < r1; ++i) hits[static_cast<std::size_t>(bh * rows + i)].fetch_add(1);
        });
        for (std::size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << heads << " " << rows << " " << i;
        const std::int64_t parts = threads == 1 || heads >= 2 * threads ? 1 : std::min(rows, (2 * threads + heads - 1) / heads);
        EXPECT_EQ(items.load(), heads * parts) << heads << " " << rows << " " << threads;
      }
  pool.parallel_rows(0, 5, 4, [](std::int64_t, std::int64_t, std::int64_t) { FAIL() << "no item without heads"; });
  pool.parallel_rows(5, 0, 4, [](std::int64_t, std::int64_t, std::int64_t) { FAIL() << "no item without rows"; });
}

#if defined(__linux__)
#include <sched.h>

// The global pool's size follows the process's CPU affinity (taskset, cpusets),
// not the machine's hardware threads: one allowed CPU gives 1, and the full
// mask gives its count.
TEST(ThreadPool, UsableCpusFollowsTheAffinityMask) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(skvq::detail::usable_cpus(), CPU_COUNT(&all));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int n = skvq::detail::usable_cpus();
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(n, 1);
}
#endif
