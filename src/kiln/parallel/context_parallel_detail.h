// What the context-parallel attention files share (not for callers): argument checks, the
// stats clock, and transfers on the communication thread.
#pragma once

#include <functional>

#include "kiln/comm/communicator.h"
#include "kiln/comm/work.h"
#include "kiln/parallel/context_parallel.h"

namespace kiln::parallel::detail {

// Message tags of the ring (apart from the collectives' tags in comm/detail.h).
inline constexpr int kTagCpKv = 40;
inline constexpr int kTagCpGrad = 41;

// check_attention(local) plus what every context-parallel call needs: q_len = kv_len = the
// layout's rows per rank, no sliding window, a layout over `ranks`. `op` names the call.
Expected<AttentionParams> check_cp_params(const char* op, const SequenceLayout& layout, int ranks,
                                          const AttentionParams& local);

// Times the compute thread: compute() and wait() add to the stats' seconds.
class CpClock {
 public:
  explicit CpClock(CpStats& s) : s_(s) {}
  template <class F>
  void compute(F&& f) {
    const double t0 = comm::now_seconds();
    f();
    s_.compute_seconds += comm::now_seconds() - t0;
  }
  // Waits for `w`, counting the wait as exposed and the transfer as communication.
  Status wait(const comm::Work& w) {
    const double t0 = comm::now_seconds();
    Status st = w.wait();
    s_.exposed_seconds += comm::now_seconds() - t0;
    s_.comm_seconds += w.end_seconds() - w.start_seconds();
    return st;
  }

 private:
  CpStats& s_;
};

// One ring step's transfers, on comm's communication thread: every send goes to `to`, every
// receive comes from `from`, message i of each list with tag tags[i].
struct RingMessage {
  const float* send = nullptr;
  float* recv = nullptr;
  int64_t count = 0;  // floats each way
  int tag = 0;
};
comm::Work ring_exchange(comm::Communicator& comm, std::vector<RingMessage> messages, int to, int from,
                         CpStats& stats);

}  // namespace kiln::parallel::detail
