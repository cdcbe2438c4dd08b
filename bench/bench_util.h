// Timing helpers shared by benchmarks: a monotonic clock, median/min/max of repetitions,
// interleaved timing of several implementations.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace kiln::bench {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Summary {
  double median = 0, min = 0, max = 0;
};

inline Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return s;
}

// Seconds per call of each fns[i]() over reps rounds (median, min, max); every round runs one
// batch of each in turn (interleaved, so drift hits all alike). A batch is the same number of
// calls for every fn, >= ~20 ms of fns[0] as timed on a warm-up call of each.
inline std::vector<Summary> time_interleaved(int reps,
                                             const std::vector<std::function<void()>>& fns) {
  std::vector<Summary> out(fns.size());
  if (fns.empty()) return out;
  double t_first = 0;
  for (size_t i = 0; i < fns.size(); ++i) {
    const double t0 = now_seconds();
    fns[i]();
    if (i == 0) t_first = now_seconds() - t0;
  }
  const double batch = std::ceil(0.02 / std::max(t_first, 1e-7));
  const auto inner = static_cast<int64_t>(std::clamp(batch, 1.0, 10000.0));
  std::vector<std::vector<double>> samples(fns.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < fns.size(); ++i) {
      const double t0 = now_seconds();
      for (int64_t q = 0; q < inner; ++q) fns[i]();
      samples[i].push_back((now_seconds() - t0) / static_cast<double>(inner));
    }
  }
  for (size_t i = 0; i < fns.size(); ++i) out[i] = summarize(samples[i]);
  return out;
}

}  // namespace kiln::bench
