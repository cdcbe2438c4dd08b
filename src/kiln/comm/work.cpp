// The communication thread and the nonblocking collectives (work.h).
#include "kiln/comm/work.h"

#include <chrono>

#include "kiln/core/trace.h"

namespace kiln::comm {

namespace detail {
struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  double start = 0, end = 0;
};
}  // namespace detail

double now_seconds() {
  static const auto epoch = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

bool Work::test() const {
  if (!s_) return true;
  std::lock_guard lock(s_->mu);
  return s_->done;
}

Status Work::wait() const {
  if (!s_) return {};
  std::unique_lock lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->done; });
  return s_->status;
}

double Work::start_seconds() const {
  if (!s_) return 0;
  std::lock_guard lock(s_->mu);
  return s_->start;
}

double Work::end_seconds() const {
  if (!s_) return 0;
  std::lock_guard lock(s_->mu);
  return s_->end;
}

CommThread::CommThread(Communicator& comm) : comm_(comm), threaded_(thread_multiple()) {
  if (threaded_) thread_ = std::thread([this] { loop(); });
}

CommThread::~CommThread() {
  if (!threaded_) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

namespace {
void run_one(const std::function<Status()>& fn, detail::WorkState& s, double& busy) {
  const double t0 = now_seconds();
  Status st = fn();
  const double t1 = now_seconds();
  busy += t1 - t0;
  {
    std::lock_guard lock(s.mu);
    s.status = std::move(st);
    s.start = t0;
    s.end = t1;
    s.done = true;
  }
  s.cv.notify_all();
}
}  // namespace

Work CommThread::submit(std::function<Status()> fn) {
  auto state = std::make_shared<detail::WorkState>();
  if (!threaded_) {
    run_one(fn, *state, busy_seconds_);
    return Work(state);
  }
  {
    std::lock_guard lock(mu_);
    queue_.emplace_back(std::move(fn), state);
  }
  cv_.notify_one();
  return Work(state);
}

double CommThread::take_busy_seconds() {
  std::lock_guard lock(mu_);
  const double b = busy_seconds_;
  busy_seconds_ = 0;
  return b;
}

void CommThread::loop() {
  set_polite_waiting(true);
  trace::set_thread_name(fmt::format("comm thread ({} ranks)", comm_.size()));
  for (;;) {
    std::pair<std::function<Status()>, std::shared_ptr<detail::WorkState>> item;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    double busy = 0;
    run_one(item.first, *item.second, busy);
    std::lock_guard lock(mu_);
    busy_seconds_ += busy;
  }
}

Work all_reduce_async(Communicator& comm, const void* send, void* recv, int64_t count, DType dtype,
                      ReduceOp op, Algo algo) {
  return comm.comm_thread().submit(
      [&comm, send, recv, count, dtype, op, algo] { return all_reduce(comm, send, recv, count, dtype, op, algo); });
}

Work all_gather_async(Communicator& comm, const void* send, void* recv, int64_t count_per_rank, DType dtype,
                      Algo algo) {
  return comm.comm_thread().submit(
      [&comm, send, recv, count_per_rank, dtype, algo] { return all_gather(comm, send, recv, count_per_rank, dtype, algo); });
}

Work reduce_scatter_async(Communicator& comm, const void* send, void* recv, int64_t count_per_rank, DType dtype,
                          ReduceOp op, Algo algo) {
  return comm.comm_thread().submit([&comm, send, recv, count_per_rank, dtype, op, algo] {
    return reduce_scatter(comm, send, recv, count_per_rank, dtype, op, algo);
  });
}

Work broadcast_async(Communicator& comm, void* buf, int64_t count, DType dtype, int root, Algo algo) {
  return comm.comm_thread().submit(
      [&comm, buf, count, dtype, root, algo] { return broadcast(comm, buf, count, dtype, root, algo); });
}

Work all_to_all_v_async(Communicator& comm, const void* send, std::span<const int64_t> send_counts,
                        std::span<const int64_t> send_displs, void* recv,
                        std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                        DType dtype) {
  return comm.comm_thread().submit(
      [&comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype] {
        return all_to_all_v(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                            dtype);
      });
}

}  // namespace kiln::comm
