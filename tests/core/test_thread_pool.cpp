// Thread pool: every task runs exactly once, for any task count and pool size; nested
// regions run serially; parallel_for covers [0, n) without overlap.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "kiln/core/thread_pool.h"

namespace kiln {
namespace {

TEST(ThreadPool, EveryTaskOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      for (int rep = 0; rep < 3; ++rep) pool.run(n, [&](int64_t t, int) { hits[t]++; });
      for (auto& h : hits) ASSERT_EQ(h.load(), 3) << threads << " threads, n=" << n;
    }
  }
}

TEST(ThreadPool, NestedRegionsRunSerially) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.run(4, [&](int64_t, int) { pool.run(3, [&](int64_t, int) { total++; }); });
  EXPECT_EQ(total.load(), 12);
}

TEST(ThreadPool, ParallelForCoversRange) {
  for (int threads : {1, 2, 4}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    for (int64_t n : {1, 5, 64, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
  set_num_threads(2);
}

}  // namespace
}  // namespace kiln
