// A small persistent thread pool for data-parallel loops (attention splits,
// heads). parallel_for runs fn(i) for i in [0, n) on up to `threads` threads
// (the caller included) and rethrows the first exception a task threw; called
// from inside a task it runs the loop inline on that thread.
// After a job a worker spins for up to kSpin before it sleeps, and the caller
// spins as long for the last tasks, so that back-to-back calls (one a layer
// in a decode step) do not wait for a thread to wake (tens of microseconds on
// a VM, the whole of a short context's attention).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace skvq::detail {

// The CPUs this process may run on: its affinity mask (taskset, cgroup
// cpusets, a container's CPU list) where the system gives one, else every
// hardware thread. The global pool has this many threads (the caller included).
int usable_cpus();

class ThreadPool {
 public:
  static ThreadPool& global();
  explicit ThreadPool(int workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  static constexpr std::chrono::microseconds kSpin{100};
  void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn);
  // [0, n) cut into at most 4 * threads contiguous ranges of near-equal size, fn(begin, end) once
  // each, on up to `threads` threads: for many small items (a decode step's rows), where a task
  // each would cost more in claiming than in work.
  void parallel_ranges(std::int64_t n, int threads, const std::function<void(std::int64_t, std::int64_t)>& fn);
  // Rows [0, rows) of each of `heads` heads as items of one head's consecutive rows, fn(head, r0, r1)
  // once an item, on up to `threads` threads: a head's rows are cut into parts where there are fewer
  // heads than threads (a prefill of one sequence with few KV heads), so that every thread has work.
  // Items in row-major order: head by head, rows ascending.
  void parallel_rows(std::int64_t heads, std::int64_t rows, int threads,
                     const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& fn);

 private:
  void worker_loop();
  void run_tasks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::mutex job_mu_;  // one parallel_for at a time
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(std::int64_t)>* fn_ = nullptr;
  std::int64_t n_ = 0, next_ = 0, done_ = 0;
  int active_limit_ = 0, active_ = 0;
  std::uint64_t generation_ = 0;
  std::atomic<std::uint64_t> posted_{0};  // generation_, read without the lock by spinning workers
  std::atomic<bool> finished_{false};     // done_ == n_ for the current job, read by the spinning caller
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace skvq::detail
