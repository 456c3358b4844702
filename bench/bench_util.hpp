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

// Medians of several functions timed in turns (fn0, fn1, ..., fn0, fn1, ...),
// after one warm-up call each, so that every one of them sees the same
// machine: on a VM whose memory bandwidth drifts over minutes, timings taken
// one after another are not comparable.
inline std::vector<double> interleaved_medians(int rounds, const std::vector<std::function<void()>>& fns) {
  for (const auto& fn : fns) fn();
  std::vector<std::vector<double>> t(fns.size());
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < fns.size(); ++i) {
      const auto a = std::chrono::steady_clock::now();
      fns[i]();
      t[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    }
  }
  std::vector<double> med;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace skvq::bench
