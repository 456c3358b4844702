// ThreadPool implementation.
#include "core/thread_pool.hpp"

#include <algorithm>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SKVQ_SPIN_PAUSE() _mm_pause()
#else
#define SKVQ_SPIN_PAUSE() std::this_thread::yield()
#endif

namespace skvq::detail {

namespace {

// Spins until done() or kSpin has passed; true if done() came.
template <typename Done>
bool spin_for(Done&& done) {
  const auto t0 = std::chrono::steady_clock::now();
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    if (i % 64 == 0 && std::chrono::steady_clock::now() - t0 > ThreadPool::kSpin) return false;
    SKVQ_SPIN_PAUSE();
  }
}

// Set while this thread runs a task of some parallel_for: a parallel_for
// called from inside one runs inline (one job at a time: it would otherwise
// wait for the job it is part of).
thread_local bool tl_in_task = false;

struct InTask {
  bool saved = tl_in_task;
  InTask() { tl_in_task = true; }
  ~InTask() { tl_in_task = saved; }
  InTask(const InTask&) = delete;
  InTask& operator=(const InTask&) = delete;
};

}  // namespace

int usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool(usable_cpus() - 1);
  return pool;
}

ThreadPool::ThreadPool(int workers) {
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_tasks() {
  for (;;) {
    std::int64_t i;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (next_ >= n_) return;
      i = next_++;
    }
    try {
      const InTask in_task;
      (*fn_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lk(mu_);
    if (++done_ == n_) {
      finished_.store(true, std::memory_order_release);
      cv_done_.notify_all();
    }
  }
}

void ThreadPool::worker_loop() {
  std::uint64_t seen = 0;
  for (;;) {
    // a new job soon after the last one is taken without sleeping
    if (seen != 0) spin_for([&] { return posted_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || (generation_ != seen && active_ < active_limit_); });
      if (stop_) return;
      seen = generation_;
      ++active_;
    }
    run_tasks();
    std::lock_guard<std::mutex> lk(mu_);
    --active_;
  }
}

void ThreadPool::parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  if (threads <= 1 || workers_.empty() || n == 1 || tl_in_task) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> job(job_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    done_ = 0;
    error_ = nullptr;
    active_limit_ = std::min(threads - 1, static_cast<int>(workers_.size()));
    ++generation_;
    finished_.store(false, std::memory_order_relaxed);
    posted_.store(generation_, std::memory_order_release);
  }
  cv_work_.notify_all();
  run_tasks();
  spin_for([&] { return finished_.load(std::memory_order_acquire); });
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return done_ == n_; });
  active_limit_ = 0;
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::parallel_ranges(std::int64_t n, int threads,
                                 const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  const std::int64_t parts = std::min<std::int64_t>(n, 4 * static_cast<std::int64_t>(std::max(threads, 1)));
  parallel_for(parts, threads, [&](std::int64_t i) { fn(i * n / parts, (i + 1) * n / parts); });
}

void ThreadPool::parallel_rows(std::int64_t heads, std::int64_t rows, int threads,
                               const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& fn) {
  if (heads <= 0 || rows <= 0) return;
  // parts a head: at least two items a thread where heads alone give fewer (one thread: one a head)
  const std::int64_t t = threads;
  const std::int64_t parts = t <= 1 || heads >= 2 * t ? 1 : std::min<std::int64_t>(rows, (2 * t + heads - 1) / heads);
  parallel_ranges(heads * parts, threads, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::int64_t bh = i / parts, part = i % parts;
      fn(bh, part * rows / parts, (part + 1) * rows / parts);
    }
  });
}

}  // namespace skvq::detail
