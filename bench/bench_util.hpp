// Timing helpers for the benchmark programs: medians of repeated runs,
// measured side by side in one process.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace skvq::bench {

// Median wall time in seconds of `reps` calls of fn (after one warm-up call).
inline double median_seconds(int reps, const std::function<void()>& fn, bool warmup = true) {
  if (warmup) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace skvq::bench
