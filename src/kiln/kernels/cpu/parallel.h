// How the fast non-GEMM kernels spread work over kiln's thread pool: rows, aligned element
// ranges, or column ranges of a reduction, with a grain that keeps small inputs on one thread.
// Internal to kiln::cpu; only the baseline-compiled cpu/*.cpp wrappers include it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kiln/core/thread_pool.h"

namespace kiln::cpu {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Runs fn(task) for task in [0, n) on the pool (serially when one thread or one task): the
// GEMM drivers' tiles, each task a fixed piece of the output.
template <class F>
void run_tasks(int64_t n, F&& fn) {
  if (n <= 0) return;
  if (n == 1 || num_threads() == 1) {
    for (int64_t t = 0; t < n; ++t) fn(t);
    return;
  }
  thread_pool().run(n, [&](int64_t t, int) { fn(t); });
}

// Rows (or elements) per parallel task so that a task has at least this many floats of work:
// a pool wake-up costs a few µs, and ~16K floats of a streaming op take ~5-20 µs on the 2-core
// Zen 5 dev machines, so smaller inputs stay on one thread. Not tuned beyond that estimate.
inline constexpr int64_t kMinFloatsPerTask = 16384;
inline int64_t grain_for(int64_t floats_per_item) {
  if (floats_per_item < 1) floats_per_item = 1;
  const int64_t g = kMinFloatsPerTask / floats_per_item;
  return g < 1 ? 1 : g;
}

// Work is split in units of kSplitUnit floats (a multiple of every target's lane count, so
// only the very last unit has a masked tail).
inline constexpr int64_t kSplitUnit = 64;

// fn(begin, end) over [0, n) elements, spread over threads in kSplitUnit-aligned pieces.
template <class F>
void parallel_elems(int64_t n, F&& fn) {
  const int64_t units = (n + kSplitUnit - 1) / kSplitUnit;
  parallel_for(units, grain_for(kSplitUnit),
               [&](int64_t b, int64_t e) { fn(b * kSplitUnit, std::min(e * kSplitUnit, n)); });
}

// fn(col_begin, col_end) over [0, cols) columns of a (rows, cols) reduction, spread over
// threads in kSplitUnit-column pieces, at least min_cols columns per task. Each column is reduced
// by one task, so the result does not depend on the thread count.
template <class F>
void parallel_cols(int64_t rows, int64_t cols, F&& fn, int64_t min_cols = 0) {
  const int64_t units = (cols + kSplitUnit - 1) / kSplitUnit;
  parallel_for(units, std::max(grain_for(rows * kSplitUnit), min_cols / kSplitUnit),
               [&](int64_t b, int64_t e) { fn(b * kSplitUnit, std::min(e * kSplitUnit, cols)); });
}

}  // namespace kiln::cpu
