// Thread pool: workers spin briefly for the next region (regions come back to back in
// training), then sleep on a condition variable so idle ranks do not burn the other core; the
// caller waits only for workers that joined its region (the join/close protocol below).
#include "kiln/core/thread_pool.h"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include <fmt/format.h>

#include "kiln/core/cpu_features.h"
#include "kiln/core/env.h"
#include "kiln/core/status.h"
#include "kiln/core/trace.h"

namespace kiln {
namespace {
thread_local bool t_in_pool_task = false;
// Spin iterations before sleeping: ~20-50 us of pause instructions on a 2-core Zen-class VM,
// long enough to catch the next kernel of a training step, short enough not to starve an
// oversubscribed MPI rank.
constexpr int kSpinIterations = 4000;

uint32_t generation_of(uint64_t state) { return static_cast<uint32_t>(state >> 32); }

cpu_set_t process_mask() {
  static const cpu_set_t mask = [] {
    cpu_set_t m;
    CPU_ZERO(&m);
    if (sched_getaffinity(0, sizeof m, &m) != 0) CPU_ZERO(&m);
    return m;
  }();
  return mask;
}

void pin_to(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  sched_setaffinity(0, sizeof one, &one);  // advisory: on failure the thread stays unpinned
}

}  // namespace

int mpi_local_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return 1;
}

Expected<std::string> pin_mode_from_env() {
  const auto v = env_value("KILN_PIN_THREADS");
  if (!v || *v == "auto") return std::string("auto");
  if (*v == "on" || *v == "1") return std::string("on");
  if (*v == "off" || *v == "0") return std::string("off");
  return invalid_argument("KILN_PIN_THREADS='{}': expected auto, on or off", *v);
}

namespace {
// The pinning mode the pool uses: KILN_PIN_THREADS, or "auto" (with a warning) when it is bad.
std::string pin_mode() {
  auto m = pin_mode_from_env();
  if (m.ok()) return *m;
  static const bool warned = [&] {
    fmt::print(stderr, "kiln: warning: {}; using auto\n", m.status().message());
    return true;
  }();
  (void)warned;
  return "auto";
}
}  // namespace

bool should_pin_threads(int threads, int mask_cpus, const char* mode, int mpi_local_ranks) {
  const std::string m = mode && *mode ? mode : "auto";
  if (m == "off" || m == "0" || threads <= 1 || threads > mask_cpus) return false;
  if (m == "on" || m == "1") return true;
  return mpi_local_ranks <= 1;
}

const std::vector<int>& process_cpus() {
  static const std::vector<int> cpus = [] {
    std::vector<int> v;
    const cpu_set_t m = process_mask();
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &m)) v.push_back(c);
    return v;
  }();
  return cpus;
}

// The join/close protocol. A region is published by one store to state_ of
// (generation << 32) with kClosed clear and no one joined; the caller wrote the region data
// (num_tasks_, thunk_, ctx_, next_task_ = 0, done_ = 0) before that store.
//  * A worker that sees a new generation joins it with a CAS that adds 1 to the joined count,
//    and only while the state still holds that generation without kClosed. Success (acquire)
//    reads the caller's store or a later join in its release sequence, so the region data is
//    visible. A worker whose CAS fails for a newer generation or kClosed skips the region and
//    never touches its data.
//  * The caller runs tasks too; when it finds none left to claim it sets kClosed (fetch_or) and
//    reads the joined count j from the same RMW. The state's modification order decides every
//    race: a join ordered before the close is counted in j, one after it fails. The caller then
//    waits only until done_ (release increments by joined workers after their last task,
//    acquire loads here) reaches j, so it never waits for a sleeping or late worker.
//  * Late workers are harmless: the next region's data is written only after the close, and a
//    worker still holding the old state's value fails its CAS. done_ and next_task_ can be reset
//    at the next region's start because every joined worker finished before run() returned.
//    A join succeeds only on the current, open state, so the 32-bit generation wrapping cannot
//    make a worker join a stale region; at worst a worker misses one.
//  * Sleep/wake: a worker counts itself in sleepers_ and rechecks state_ under mu_ before
//    blocking; the caller stores state_ then reads sleepers_ (both seq_cst, a Dekker pair), and
//    only when someone sleeps passes through mu_ and notifies. Either the caller sees the
//    sleeper or the sleeper's recheck sees the new generation. A lost wake-up could only cost
//    parallelism (the caller never waits for unjoined workers), never a hang.

ThreadPool::ThreadPool(int num_threads) {
  KILN_CHECK(num_threads >= 1);
  const std::vector<int>& cpus = process_cpus();
  if (should_pin_threads(num_threads, static_cast<int>(cpus.size()), pin_mode().c_str(), mpi_local_ranks()))
    pin_cpus_.assign(cpus.begin(), cpus.begin() + num_threads);
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    ++generation_;
    state_.store((uint64_t{generation_} << 32) | kClosed);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

bool in_pool_task() { return t_in_pool_task; }

void ThreadPool::work(int thread) {
  t_in_pool_task = true;
  const int depth = trace::kernel_depth();
  trace::set_kernel_depth(trace_depth_);  // a task of a kernel is part of it (trace.h)
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) break;
    thunk_(ctx_, task, thread);
  }
  trace::set_kernel_depth(depth);
  t_in_pool_task = false;
}

void ThreadPool::worker_loop(int thread) {
  if (!pin_cpus_.empty()) pin_to(pin_cpus_[static_cast<size_t>(thread)]);
  trace::set_thread_name(fmt::format("pool worker {}", thread));
  uint32_t seen = 0;
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    for (int i = 0; generation_of(s) == seen && i < kSpinIterations; ++i) {
      _mm_pause();
      s = state_.load(std::memory_order_acquire);
    }
    if (generation_of(s) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] {
        s = state_.load(std::memory_order_seq_cst);
        return generation_of(s) != seen || stop_.load(std::memory_order_relaxed);
      });
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_of(s);
    // Join region `seen` if it is still open; on failure s is reloaded, and a newer generation
    // is taken up by the next turn of the outer loop.
    while ((s & kClosed) == 0 && generation_of(s) == seen) {
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire, std::memory_order_acquire)) {
        work(thread);
        done_.fetch_add(1, std::memory_order_release);
        break;
      }
    }
  }
}

void ThreadPool::steer_caller() const {
  const int cpu = sched_getcpu();
  if (std::find(pin_cpus_.begin() + 1, pin_cpus_.end(), cpu) == pin_cpus_.end()) return;
  // On a worker's CPU: hop to the first CPU, then restore this thread's own mask (the move
  // stays; only the load balancer would undo it, and the next region checks again).
  cpu_set_t mine;
  if (sched_getaffinity(0, sizeof mine, &mine) != 0 || !CPU_ISSET(pin_cpus_[0], &mine)) return;
  pin_to(pin_cpus_[0]);
  sched_setaffinity(0, sizeof mine, &mine);
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
  if (!pin_cpus_.empty()) steer_caller();
  std::lock_guard<std::mutex> region(run_mu_);
  num_tasks_ = num_tasks;
  thunk_ = thunk;
  ctx_ = ctx;
  trace_depth_ = trace::kernel_depth();
  next_task_.store(0, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  ++generation_;
  state_.store(uint64_t{generation_} << 32, std::memory_order_seq_cst);  // publish (release)
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(mu_); }
    wake_.notify_all();
  }
  work(0);
  const uint64_t closed = state_.fetch_or(kClosed, std::memory_order_acq_rel);
  const int joined = static_cast<int>(closed & kJoinedMask);
  for (int i = 0; done_.load(std::memory_order_acquire) != joined; ++i) {
    if (i < kSpinIterations) {
      _mm_pause();
    } else {
      std::this_thread::yield();  // a joined worker was preempted (e.g. more MPI ranks than cores)
    }
  }
}

namespace {
int default_threads() {
  auto env = env_int("KILN_NUM_THREADS", 1, kMaxThreads);
  if (!env.ok()) {  // `kiln` refuses this before any kernel runs; other programs get a warning
    fmt::print(stderr, "kiln: warning: {}; using {} threads\n", env.status().message(), cpu_features().num_logical_cpus);
    return cpu_features().num_logical_cpus;
  }
  return env->has_value() ? static_cast<int>(**env) : cpu_features().num_logical_cpus;
}
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool = std::make_unique<ThreadPool>(default_threads());
  return pool;
}
}  // namespace

ThreadPool& thread_pool() { return *pool_slot(); }

std::string thread_placement() {
  const int threads = num_threads();
  const int cpus = static_cast<int>(process_cpus().size());
  const std::string mode = pin_mode();
  if (!should_pin_threads(threads, cpus, mode.c_str(), mpi_local_ranks())) {
    return fmt::format("not pinned ({} threads, {} CPUs in the affinity mask, KILN_PIN_THREADS={}{})",
                       threads, cpus, mode,
                       mpi_local_ranks() > 1 ? ", several MPI ranks on this node" : "");
  }
  std::string workers;
  for (int t = 1; t < threads; ++t) workers += fmt::format("{}{}", t > 1 ? "," : "", process_cpus()[static_cast<size_t>(t)]);
  return fmt::format("workers pinned to CPU {}, caller steered to CPU {}", workers, process_cpus()[0]);
}
int num_threads() { return thread_pool().num_threads(); }
void set_num_threads(int n) {
  if (n < 1) n = 1;
  if (n == num_threads()) return;
  pool_slot() = std::make_unique<ThreadPool>(n);
}

}  // namespace kiln
