// Thread pool: every task runs exactly once, for any task count and pool size, also when
// workers sleep between regions or wake too late for one (the join/close protocol); nested
// regions run serially; parallel_for covers [0, n) without overlap; pools are destroyed idle.
#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <thread>
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

// Regions of varied sizes back to back and with sleeps in between, so workers are caught
// spinning, asleep, or waking up after the caller already closed the region. Every task of
// every region must run once, the thread index must be in range, and the region's results
// must be complete when run() returns (a late task would show as a wrong count).
TEST(ThreadPool, RegionsWithSleepingWorkers) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    const int64_t sizes[] = {2, 3, 1, 17, 4, 64, 2, 9};
    std::vector<std::atomic<int>> hits(64);
    std::atomic<int> bad_thread{0};
    for (int region = 0; region < 48; ++region) {
      const int64_t n = sizes[region % 8];
      for (int64_t t = 0; t < n; ++t) hits[t].store(0, std::memory_order_relaxed);
      std::vector<int> plain(static_cast<size_t>(n), 0);  // non-atomic: needs the join's ordering
      pool.run(n, [&](int64_t t, int thread) {
        if (thread < 0 || thread >= threads) bad_thread++;
        if (region % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        plain[t] += 1;
        hits[t]++;
      });
      for (int64_t t = 0; t < n; ++t) {
        ASSERT_EQ(hits[t].load(), 1) << threads << " threads, region " << region << " task " << t;
        ASSERT_EQ(plain[t], 1) << threads << " threads, region " << region << " task " << t;
      }
      // Every few regions let the workers spin out and block on the condition variable.
      if (region % 4 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    EXPECT_EQ(bad_thread.load(), 0);
  }
}

// Many tiny regions in a row: the caller usually finishes before a worker joins, so workers
// keep arriving late; a worker that joined a closed region would run a task twice or touch the
// next region's data.
TEST(ThreadPool, ManyTinyRegions) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  int64_t expect = 0;
  for (int region = 0; region < 20000; ++region) {
    const int64_t n = 2 + region % 5;
    expect += n;
    pool.run(n, [&](int64_t, int) { total.fetch_add(1, std::memory_order_relaxed); });
    ASSERT_EQ(total.load(), expect) << "region " << region;
  }
}

// Both threads must be able to work in one region (the worker joins when it is awake): a task
// that waits for another task to start can only finish if two threads run it.
TEST(ThreadPool, WorkerJoinsOpenRegion) {
  ThreadPool pool(2);
  std::atomic<int> started{0};
  std::atomic<bool> both{false};
  pool.run(2, [&](int64_t, int) {
    started++;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    if (started.load() == 2) both = true;
  });
  EXPECT_TRUE(both.load());
}

TEST(ThreadPool, NestedRegionsRunSerially) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.run(4, [&](int64_t, int) { pool.run(3, [&](int64_t, int) { total++; }); });
  EXPECT_EQ(total.load(), 12);
  // A nested region runs inline on the thread of the outer task, with that task's index.
  std::atomic<int> mismatched{0};
  pool.run(8, [&](int64_t, int outer) {
    const std::thread::id me = std::this_thread::get_id();
    pool.run(5, [&](int64_t, int inner) {
      if (inner != 0 || std::this_thread::get_id() != me) mismatched++;
    });
    (void)outer;
  });
  EXPECT_EQ(mismatched.load(), 0);
}

TEST(ThreadPool, DestroyIdle) {
  for (int threads : {1, 2, 4}) {
    // Destroyed right after construction, after a region while workers still spin, and after
    // the workers fell asleep.
    { ThreadPool pool(threads); }
    {
      ThreadPool pool(threads);
      std::atomic<int> n{0};
      pool.run(10, [&](int64_t, int) { n++; });
      EXPECT_EQ(n.load(), 10);
    }
    {
      ThreadPool pool(threads);
      std::atomic<int> n{0};
      pool.run(10, [&](int64_t, int) { n++; });
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_EQ(n.load(), 10);
    }
  }
}

TEST(ThreadPool, SetNumThreadsBetweenRegions) {
  for (int threads : {2, 1, 3, 2, 2, 4, 1, 2}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    std::vector<std::atomic<int>> hits(37);
    std::atomic<int> max_thread{0};
    thread_pool().run(37, [&](int64_t t, int thread) {
      hits[t]++;
      int m = max_thread.load();
      while (thread > m && !max_thread.compare_exchange_weak(m, thread)) {
      }
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << threads << " threads";
    EXPECT_LT(max_thread.load(), threads);
  }
  set_num_threads(2);
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

// The placement policy: auto pins 1 < threads <= CPUs unless several MPI ranks share the node;
// on ignores the MPI ranks; off never pins; more threads than CPUs are never pinned.
TEST(ThreadPlacement, Policy) {
  EXPECT_TRUE(should_pin_threads(2, 2, nullptr, 1));
  EXPECT_TRUE(should_pin_threads(2, 8, "auto", 1));
  EXPECT_FALSE(should_pin_threads(1, 2, "on", 1));
  EXPECT_FALSE(should_pin_threads(3, 2, "on", 1));
  EXPECT_FALSE(should_pin_threads(2, 2, "auto", 4));
  EXPECT_TRUE(should_pin_threads(2, 2, "on", 4));
  EXPECT_FALSE(should_pin_threads(2, 2, "off", 1));
  EXPECT_FALSE(should_pin_threads(2, 2, "0", 1));
}

int cpus_in_mask_of_this_thread() {
  cpu_set_t m;
  CPU_ZERO(&m);
  if (sched_getaffinity(0, sizeof m, &m) != 0) return -1;
  return CPU_COUNT(&m);
}

// A pinned pool: each worker runs on its own CPU of the process mask, narrowed to it; the caller
// runs its regions on the first CPU (steered there even when it starts on a worker's CPU) and
// keeps its whole mask; an unpinned pool narrows nobody.
TEST(ThreadPlacement, PinnedWorkersAndSteeredCaller) {
  const std::vector<int>& cpus = process_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 CPUs in the affinity mask";
  const int all = static_cast<int>(cpus.size());
  std::thread([&] {
    setenv("KILN_PIN_THREADS", "on", 1);
    ThreadPool pool(2);
    unsetenv("KILN_PIN_THREADS");
    // Start the caller on the worker's CPU, keeping its whole mask.
    cpu_set_t one, mine;
    CPU_ZERO(&one);
    CPU_SET(cpus[1], &one);
    ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    ASSERT_EQ(sched_getcpu(), cpus[1]);
    ASSERT_EQ(sched_setaffinity(0, sizeof mine, &mine), 0);
    std::vector<int> seen(2, -1), width(2, -1);
    for (int rep = 0; rep < 3; ++rep) {
      pool.run(2, [&](int64_t, int thread) {
        seen[static_cast<size_t>(thread)] = sched_getcpu();
        width[static_cast<size_t>(thread)] = cpus_in_mask_of_this_thread();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // both threads join
      });
    }
    EXPECT_EQ(width[0], all);
    EXPECT_EQ(seen[0], cpus[0]);
    if (seen[1] >= 0) {  // the worker joined at least one region
      EXPECT_EQ(width[1], 1);
      EXPECT_EQ(seen[1], cpus[1]);
    }
  }).join();
  std::thread([&] {
    setenv("KILN_PIN_THREADS", "off", 1);
    ThreadPool pool(2);
    unsetenv("KILN_PIN_THREADS");
    std::atomic<int> narrowed{0};
    pool.run(2, [&](int64_t, int) {
      if (cpus_in_mask_of_this_thread() != all) narrowed.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    });
    EXPECT_EQ(narrowed.load(), 0);
  }).join();
}

}  // namespace
}  // namespace kiln
