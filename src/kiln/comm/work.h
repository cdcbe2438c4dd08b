// Nonblocking collectives: `all_reduce_async(...)` returns a Work handle at once; the call runs
// on the communicator's communication thread, which owns every MPI call made on that
// communicator while it runs, so compute (backward, the next unit's forward) continues while
// the bytes move. Results are bitwise those of the blocking calls: the thread runs the same
// functions, in the order they were submitted (every rank submits in the same order, as MPI
// requires of collectives on one communicator).
//
// MPI thread level: comm::init asks for MPI_THREAD_MULTIPLE. Each communicator has its own
// thread (a DeviceMesh has one per axis: dp, tp, ...), so two threads can be inside MPI at
// the same time on different communicators; FUNNELED or SERIALIZED would forbid that. Where
// the library provides less, submit() runs the call on the caller's thread and the Work is
// complete when returned (correct, only not overlapped).
//
// Waiting: the communication thread polls its requests with MPI_Test and sleeps between polls
// (polite waiting, communicator.h) instead of spinning in MPI_Wait, so on a machine with as
// many compute threads as cores it does not take the core backward runs on. It gives up after
// comm_timeout_seconds() (KILN_COMM_TIMEOUT, default 60 s) and ends the job with a message:
// a rank that hangs never hangs the others.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kiln/comm/collectives.h"
#include "kiln/comm/communicator.h"

namespace kiln::comm {

namespace detail {
struct WorkState;
}

// Seconds since a process-wide epoch (steady clock): the timestamps of Work and of the
// compute thread share it, so exposed communication is computed from both.
double now_seconds();

// A handle to one submitted call. Copyable; a default Work is complete.
class Work {
 public:
  Work() = default;
  // True once the call has finished (never blocks).
  bool test() const;
  // Blocks until the call has finished; returns its status. Safe to call more than once.
  Status wait() const;
  // When the communication thread started and finished it (now_seconds()); 0 until then.
  double start_seconds() const;
  double end_seconds() const;

 private:
  friend class CommThread;
  explicit Work(std::shared_ptr<detail::WorkState> s) : s_(std::move(s)) {}
  std::shared_ptr<detail::WorkState> s_;
};

// The communication thread of one communicator (Communicator::comm_thread()).
class CommThread {
 public:
  explicit CommThread(Communicator& comm);
  ~CommThread();  // finishes every submitted call, then joins
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `fn` (which makes MPI calls on this thread's communicator, and may make them on
  // others that no other thread uses meanwhile); returns at once.
  Work submit(std::function<Status()> fn);
  // True on the communication thread itself (or always, where calls run on the caller).
  bool is_current() const { return !threaded_ || std::this_thread::get_id() == thread_.get_id(); }
  // Seconds this thread spent running calls since the last take_busy_seconds().
  double take_busy_seconds();

 private:
  void loop();
  Communicator& comm_;
  bool threaded_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<Status()>, std::shared_ptr<detail::WorkState>>> queue_;
  bool stop_ = false;
  double busy_seconds_ = 0;
  std::thread thread_;
};

// The nonblocking collectives: arguments and in-place rules as the blocking ones
// (collectives.h). Buffers must stay valid and untouched until the Work completes.
Work all_reduce_async(Communicator& comm, const void* send, void* recv, int64_t count, DType dtype,
                      ReduceOp op, Algo algo = Algo::kAuto);
Work all_gather_async(Communicator& comm, const void* send, void* recv, int64_t count_per_rank,
                      DType dtype, Algo algo = Algo::kAuto);
Work reduce_scatter_async(Communicator& comm, const void* send, void* recv, int64_t count_per_rank,
                          DType dtype, ReduceOp op, Algo algo = Algo::kAuto);
Work broadcast_async(Communicator& comm, void* buf, int64_t count, DType dtype, int root,
                     Algo algo = Algo::kAuto);
// all_to_all_v on the communication thread. The four spans are not copied: buffers AND the
// count and displacement arrays must stay valid and untouched until the Work completes.
Work all_to_all_v_async(Communicator& comm, const void* send, std::span<const int64_t> send_counts,
                        std::span<const int64_t> send_displs, void* recv,
                        std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                        DType dtype);

}  // namespace kiln::comm
