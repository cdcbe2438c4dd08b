// Disaggregated prefill and decode over MPI (`mpirun -np P+1 kiln serve --disaggregate P:1`):
// rank 0 is the decode rank — the HTTP front end and an Engine that runs continuous batching over
// the sequences it holds — and ranks 1..P are prefill ranks, each a scheduler (chunked prefill,
// prefix caching) and a model executor of its own with no sampling and no front end.
//
// A request's path: the decode engine admits it with blocks for every prompt token but the last
// and hands those tokens to the prefill rank with the fewest queued tokens (MpiPrefillClient, a
// RemotePrefill). That rank prefills them in chunks beside its other prompts; after each layer of
// each step (PagedKvCache::on_layer_written) it sends that layer's new K/V rows of each prompt
// with a nonblocking send, so a layer's transfer overlaps the next layers' compute and the last
// chunk's transfer the next prompt's prefill; rows a prompt found in the prefix cache are sent
// in the step it is admitted. When the last rows are out it sends "done" (after them on the same
// tag, so it arrives after them). The decode engine writes each message's rows into the
// sequence's blocks as they come, and once done, runs the last prompt token as the sequence's
// first step, which samples with the request's own generator: the outputs are the colocated
// server's (greedy: the same tokens).
//
// Failure: a prefill rank that sends nothing for `timeout_s` while it holds prompts is given up
// on: its prompts' requests fail with an error naming it, and no prompt goes to it again; with no
// prefill rank left, the decode engine prefills prompts itself. (A rank that dies outright ends
// the mpirun job, and with it the server: its clients see the connection close, not a hang.)
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/comm/communicator.h"
#include "kiln/model/transformer.h"
#include "kiln/serve/engine.h"
#include "kiln/serve/remote_prefill.h"

namespace kiln {

struct DisaggregateOptions {
  int prefill_ranks = 0;  // P of "P:D"
  int decode_ranks = 0;   // D
  double timeout_s = 30;  // --disagg-timeout
};
// "P:D" for a job of world_size ranks: P >= 1 prefill ranks, D = 1 decode rank (more decode
// ranks are not implemented), P + D = world_size. The same verdict on every rank.
Expected<DisaggregateOptions> parse_disaggregate(std::string_view spec, int world_size);

class Outbox;  // nonblocking sends with their buffers (disaggregated.cpp)

// The decode rank's side: a RemotePrefill over `comm` (rank 0 here; ranks 1..P prefill).
class MpiPrefillClient final : public RemotePrefill {
 public:
  // The rows each message carries: row_width floats per token per layer, K then (has_v) V.
  MpiPrefillClient(comm::Communicator& comm, int64_t n_layers, int64_t row_width, bool has_v, double timeout_s);
  ~MpiPrefillClient() override;

  bool submit(int64_t seq_id, std::span<const int32_t> tokens) override;
  void cancel(int64_t seq_id) override;
  void poll(const KvWriter& write, Progress& progress) override;
  int64_t num_pending() const override { return static_cast<int64_t>(jobs_.size()); }
  Stats stats() const override { return stats_; }
  std::string describe() const override;

  // Tells every prefill rank to stop (after the engine stopped). False when a rank was given up
  // on: it may never reach MPI_Finalize, so the caller ends the job instead (MPI_Abort).
  bool shutdown();

 private:
  using Clock = std::chrono::steady_clock;
  struct Job {
    int worker = 0;  // rank
    int64_t tokens = 0;
  };
  struct Worker {
    bool alive = true;
    int64_t queued_tokens = 0;
    int64_t jobs = 0;
    Clock::time_point last_heard;  // its last message, or the oldest job handed to it since
  };
  struct Inbound {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<char> bytes;
  };
  void send(int rank, std::vector<char> bytes);  // nonblocking; kept until it completes
  void give_up(int rank, Progress& progress);
  void handle(int rank, const std::vector<char>& bytes, const KvWriter& write, Progress& progress);

  comm::Communicator& comm_;
  int64_t n_layers_, row_width_;
  bool has_v_;
  double timeout_s_;
  std::unordered_map<int64_t, Job> jobs_;   // seq id -> its prefill
  std::map<int, Worker> workers_;           // rank -> state
  std::map<int, std::deque<Inbound>> inbound_;  // per source, in matching order
  std::unique_ptr<Outbox> outbound_;  // prompts, cancels and stops in flight
  Stats stats_;
};

// A prefill rank's loop: takes prompts from rank 0 of `comm`, prefills them with `model` (a
// scheduler and executor built from `config`: --kv-cache-mem, --block-size, --max-batched-tokens,
// --prefill-chunk, prefix caching) and sends their K/V back, until rank 0 says stop.
Status run_prefill_rank(Transformer& model, const EngineConfig& config, comm::Communicator& comm);

}  // namespace kiln
