// Thread pool: workers spin briefly for the next region (regions come back to back in
// training), then sleep on a condition variable so idle ranks do not burn the other core.
#include "kiln/core/thread_pool.h"

#include <immintrin.h>

#include <cstdlib>
#include <memory>

#include "kiln/core/cpu_features.h"
#include "kiln/core/status.h"

namespace kiln {
namespace {
thread_local bool t_in_pool_task = false;
// Spin iterations before sleeping: ~20-50 us of pause instructions on a 2-core Zen-class VM,
// long enough to catch the next kernel of a training step, short enough not to starve an
// oversubscribed MPI rank.
constexpr int kSpinIterations = 4000;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  KILN_CHECK(num_threads >= 1);
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::work(int thread) {
  t_in_pool_task = true;
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) break;
    thunk_(ctx_, task, thread);
  }
  t_in_pool_task = false;
}

void ThreadPool::worker_loop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && i < kSpinIterations; ++i) {
      _mm_pause();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    work(thread);
    busy_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run_impl(int64_t num_tasks, Thunk thunk, void* ctx) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1 || t_in_pool_task) {
    const bool outer = t_in_pool_task;
    t_in_pool_task = true;
    for (int64_t t = 0; t < num_tasks; ++t) thunk(ctx, t, 0);
    t_in_pool_task = outer;
    return;
  }
  std::lock_guard<std::mutex> region(run_mu_);
  num_tasks_ = num_tasks;
  thunk_ = thunk;
  ctx_ = ctx;
  next_task_.store(0, std::memory_order_relaxed);
  busy_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  work(0);
  for (int i = 0; busy_.load(std::memory_order_acquire) != 0; ++i) {
    if (i < kSpinIterations) {
      _mm_pause();
    } else {
      std::this_thread::yield();  // oversubscribed (e.g. more MPI ranks than cores)
    }
  }
}

namespace {
int default_threads() {
  if (const char* env = std::getenv("KILN_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n >= 1) return n;
  }
  return cpu_features().num_logical_cpus;
}
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool = std::make_unique<ThreadPool>(default_threads());
  return pool;
}
}  // namespace

ThreadPool& thread_pool() { return *pool_slot(); }
int num_threads() { return thread_pool().num_threads(); }
void set_num_threads(int n) {
  if (n < 1) n = 1;
  if (n == num_threads()) return;
  pool_slot() = std::make_unique<ThreadPool>(n);
}

}  // namespace kiln
