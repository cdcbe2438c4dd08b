// kiln's own thread pool, used by every parallel kernel; `--threads` sets its size.
// Why not OpenMP: the pool is persistent and small enough to read, its size changes at run
// time from one setting, it never fights OpenBLAS/oneDNN's runtimes in benchmarks or MPI
// ranks in distributed runs, and a task's index (not the thread that ran it) decides what it
// computes, so results do not depend on scheduling.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "kiln/core/status.h"

namespace kiln {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task, thread) for every task in [0, num_tasks); the caller is thread 0 and works
  // too. Tasks are claimed dynamically; a worker that wakes too late for a region skips it, so
  // the call never waits for a sleeping worker. Returns when all are done. A call from inside a
  // task runs serially on the calling thread.
  template <class F>
  void run(int64_t num_tasks, F&& fn) {
    auto thunk = [](void* ctx, int64_t task, int thread) { (*static_cast<F*>(ctx))(task, thread); };
    run_impl(num_tasks, thunk, &fn);
  }

 private:
  using Thunk = void (*)(void*, int64_t, int);
  void run_impl(int64_t num_tasks, Thunk thunk, void* ctx);
  void worker_loop(int thread);
  void work(int thread);
  void steer_caller() const;

  // Region state (see thread_pool.cpp): (generation << 32) | kClosed | number of workers joined.
  static constexpr uint64_t kClosed = uint64_t{1} << 31;
  static constexpr uint64_t kJoinedMask = kClosed - 1;

  std::vector<std::thread> workers_;
  alignas(64) std::atomic<uint64_t> state_{kClosed};  // generation 0, closed: nothing to join
  // Region data: written by the caller before it publishes a generation, read only by workers
  // that joined that generation.
  int64_t num_tasks_ = 0;
  Thunk thunk_ = nullptr;
  void* ctx_ = nullptr;
  uint32_t generation_ = 0;  // the caller's count of regions (under run_mu_)
  int trace_depth_ = 0;      // the caller's trace::kernel_depth(), given to the region's workers
  alignas(64) std::atomic<int64_t> next_task_{0};
  alignas(64) std::atomic<int> done_{0};  // joined workers finished with this region
  std::atomic<int> sleepers_{0};          // workers blocked (or about to block) on wake_
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // guards the sleep/wake hand-off only
  std::condition_variable wake_;
  std::mutex run_mu_;  // one parallel region at a time
  // Placement (see should_pin_threads): CPU of thread t, empty when not pinned.
  std::vector<int> pin_cpus_;
};

// Thread placement. On a 2-vCPU VM the scheduler sometimes leaves the caller and the worker on
// one CPU for a whole process (wake-affine placement of the woken worker), so every region runs
// at half speed: 40% of launches of a 512^3 f32 GEMM on 2 threads ran at ~97 instead of ~190
// GFLOP/s. A pool that pins places worker t on the t-th CPU of the process's affinity mask, and
// steers the caller: at each region it reads its CPU (sched_getcpu, no system call) and, when
// that is a worker's CPU, moves itself to the first CPU and gives itself its own mask back.
// The caller's mask never stays narrowed, so threads it starts later (OpenMP runtimes of the
// benchmark peers, the serving threads) keep every CPU.
// Policy (KILN_PIN_THREADS = auto | on | off, default auto): "auto" pins when
// 1 < threads <= CPUs in the mask and the process is not one of several MPI ranks on this node
// (OMPI_COMM_WORLD_LOCAL_SIZE / MPI_LOCALNRANKS > 1: unbound ranks would all pin to the same
// CPUs; bound ranks have a one-CPU mask anyway); "on" pins whenever 1 < threads <= CPUs.
bool should_pin_threads(int threads, int mask_cpus, const char* mode, int mpi_local_ranks);
// Ranks of this job on this machine (OMPI_COMM_WORLD_LOCAL_SIZE / MPI_LOCALNRANKS), 1 outside mpirun.
int mpi_local_ranks();
// KILN_PIN_THREADS as one of "auto" (also when unset), "on", "off" ("1" and "0" mean on and off);
// InvalidArgument for anything else (the library then warns and uses "auto").
Expected<std::string> pin_mode_from_env();
// The CPUs of the process's affinity mask, read once (before any worker is pinned).
const std::vector<int>& process_cpus();
// One line for `kiln info`: e.g. "workers pinned to CPU 1, caller steered to CPU 0".
std::string thread_placement();

// The process-wide pool. Default size: KILN_NUM_THREADS (1..kMaxThreads, see env.h; a bad value
// warns), else the number of online CPUs.
ThreadPool& thread_pool();
int num_threads();
// True on a thread running one of the pool's tasks (there a nested region runs serially).
bool in_pool_task();
// Resizes the global pool (call between parallel regions, e.g. from `--threads`).
void set_num_threads(int n);

// Splits [0, n) into contiguous chunks of at least `grain` items, at most a few per thread,
// and calls fn(begin, end) for each.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  const int threads = num_threads();
  if (grain < 1) grain = 1;
  int64_t chunks = (n + grain - 1) / grain;
  if (chunks > 4 * threads) chunks = 4 * threads;
  if (threads == 1 || chunks <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t per = n / chunks, extra = n % chunks;
  thread_pool().run(chunks, [&](int64_t c, int) {
    const int64_t begin = c * per + (c < extra ? c : extra);
    const int64_t end = begin + per + (c < extra ? 1 : 0);
    fn(begin, end);
  });
}

}  // namespace kiln
