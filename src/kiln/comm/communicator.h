// Communicator: a group of ranks over an MPI communicator, the object every collective and
// every process group (data, tensor, pipeline, expert, context parallel) is built from.
// A process started without mpirun is a world of size 1, and everything works in it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <memory>
#include <string>
#include <vector>

// kiln uses MPI's C API only; keep OpenMPI's deprecated C++ bindings out (MPI::MPI_C links
// no C++ binding library).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "kiln/core/status.h"

namespace kiln::comm {

// Starts MPI once, asking for MPI_THREAD_MULTIPLE (the communication threads of work.h, one
// per communicator, may be inside MPI at the same time); later calls do nothing.
// Communicator::world() calls it lazily with no arguments, so a program that never calls it
// still works.
void init(int* argc = nullptr, char*** argv = nullptr);
// True when MPI provides MPI_THREAD_MULTIPLE (else nonblocking calls run on the caller).
bool thread_multiple();
// Ends MPI if this process started it and it is not finalized yet; stops the world's
// communication thread first. Safe to call twice.
void finalize();
bool is_initialized();
// Ends the whole job with a message (MPI_Abort): the path for a rank that cannot go on,
// so the other ranks never hang waiting for it.
[[noreturn]] void abort_job(const std::string& message, int code = 1);
// Whether the launcher keeps the job running when one of its processes dies: OpenMPI's mpirun
// with --enable-recovery (or --mca orte_enable_recovery 1), which it passes to every rank as
// OMPI_MCA_orte_enable_recovery. Without it a dead rank ends the whole job (OpenMPI 4 has no
// ULFM), so a service that can live without a rank says so at startup.
bool job_survives_rank_failure();

// The virtual node size for a communicator of p ranks on one machine: the largest divisor L
// of p with 1 < L <= sqrt(p) (p = 4: 2; p = 9: 3; p = 16: 4), 0 when there is none (p < 4
// or p prime). Nodes of L ranks and p / L nodes balance the steps of the two levels.
int single_node_split(int p);

// Per-call cost parameters of one algorithm (the alpha-beta model), loaded from calibration.
struct AlphaBetaTable;
// The `auto` probe's per-key state (auto_probe.h).
struct AutoProbeState;
class CommThread;  // work.h

// Polite waiting, per thread (the communication threads turn it on): every wait of this
// layer polls with MPI_Test and sleeps between polls instead of spinning in MPI_Wait, and ends
// the job with a message after comm_timeout_seconds() without progress.
void set_polite_waiting(bool on);
bool polite_waiting();
// KILN_COMM_TIMEOUT (seconds, default 60): how long a polite wait lasts before it ends the job.
double comm_timeout_seconds();
// Waits for n requests: MPI_Waitall, or polite polling on a thread that turned it on.
void wait_all_requests(int n, MPI_Request* reqs);
// The wait of a call whose message sizes come from the caller and can disagree between ranks
// (all_to_all_v): fills statuses[i] and returns MPI_SUCCESS, or MPI_ERR_IN_STATUS when a
// request failed (statuses[i].MPI_ERROR; a message longer than its receive is MPI_ERR_TRUNCATE),
// instead of ending the job. Bounded on every thread: polite polling where it is on, polling
// without sleeps elsewhere; past comm_timeout_seconds() it ends the job naming describe(i) for
// each request still open (a count that is 0 on one side only leaves a receive unmatched).
int wait_all_bounded(int n, MPI_Request* reqs, MPI_Status* statuses,
                     const std::function<std::string(int)>& describe);

class Communicator;
}  // namespace kiln::comm
namespace kiln::trace {
struct Event;
}
namespace kiln::comm {
// The profiler's arguments of one communication event (core/trace.h): op, algorithm, bytes and
// the world ranks taking part: `peer` (a rank of `c`) for point-to-point, else every member.
void describe_comm(trace::Event& e, const Communicator& c, const char* op, const char* algo, double bytes,
                   int peer = -1);
// One double combined by `op` over `c` through MPI's own all-reduce (one value: nothing to
// implement), on the calling thread; a failure ends the job with a message naming `what`.
double all_reduce_scalar(Communicator& c, double x, MPI_Op op, const char* what);

class Communicator {
 public:
  // The world: every process of the job (MPI_COMM_WORLD), initializing MPI if needed.
  static Communicator& world();

  // Wraps `comm`; takes ownership (MPI_Comm_free on destruction) when `owned`.
  Communicator(MPI_Comm comm, bool owned);
  ~Communicator();  // stops its communication thread first
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm handle() const { return comm_; }

  // Collective: ranks with the same color form one new communicator, ordered by key.
  // A negative color gives an empty communicator (size 0 is not representable: returns an
  // error) — every rank must pass a color >= 0 here.
  Expected<std::unique_ptr<Communicator>> split(int color, int key) const;
  // Collective: the ranks that share memory with this one (one "node").
  std::unique_ptr<Communicator> split_type_shared() const;

  // Ranks per node for the hierarchical algorithm: n > 0 forces nodes of n consecutive ranks,
  // so one machine can test it; 0 = automatic: the real node from MPI_Comm_split_type, except
  // that when the whole communicator is one node, virtual nodes of single_node_split(p)
  // consecutive ranks (hierarchical then runs as a 2D algorithm, not as a plain ring).
  void set_ranks_per_node(int n);
  int ranks_per_node_setting() const { return ranks_per_node_; }
  // Collective on first use (builds node_groups): the node size hierarchical runs with, as
  // the cost model sees it; 0 when it would be one node or nodes of unequal sizes.
  int hierarchical_node_size();
  // The node and the cross-node communicators for the hierarchical algorithm, built on first
  // use (collective) and cached. `cross` links the ranks with the same local rank.
  struct NodeGroups {
    std::unique_ptr<Communicator> node;
    std::unique_ptr<Communicator> cross;   // ranks with this node-local rank, one per node
    std::unique_ptr<Communicator> leaders; // node-local rank 0 of every node (null elsewhere)
    bool uniform = true;                   // every node has the same number of ranks
  };
  NodeGroups& node_groups();

  // This communicator's communication thread (work.h), started on first use. From then on
  // the blocking collectives called from other threads run on it too (queued in order).
  CommThread& comm_thread();
  CommThread* started_comm_thread() const { return comm_thread_.get(); }
  void stop_comm_thread();

  // Point-to-point on bytes. Non-blocking calls return a request the caller waits on.
  MPI_Request isend(const void* data, size_t nbytes, int dest, int tag) const;
  MPI_Request irecv(void* data, size_t nbytes, int source, int tag) const;
  void send(const void* data, size_t nbytes, int dest, int tag) const;
  void recv(void* data, size_t nbytes, int source, int tag) const;
  void sendrecv(const void* send_data, size_t send_nbytes, int dest, void* recv_data,
                size_t recv_nbytes, int source, int tag) const;
  static void wait(MPI_Request& req);
  static void wait_all(std::vector<MPI_Request>& reqs);  // waits and clears
  void barrier() const;

  // Scratch memory owned by the communicator: grown when a call needs more, never shrunk or
  // freed per call (first touch of fresh pages is slow here, see BENCH.md). Slot i is one
  // independent buffer; collectives use slots 0..kNumScratch-1.
  static constexpr int kNumScratch = 4;
  std::byte* scratch(int slot, size_t nbytes);

  // The alpha-beta parameters for `auto` (loaded from the calibration cache on first use,
  // identical on every rank).
  const AlphaBetaTable& cost_table();
  void set_cost_table(const AlphaBetaTable& table);
  // `auto` decisions already made here, keyed by (op, bytes): a decision costs a model
  // evaluation per algorithm, too much for a 1 us all-reduce. Cleared when the table or the
  // ranks per node change.
  std::unordered_map<uint64_t, uint8_t>& auto_cache() { return auto_cache_; }
  // `auto` probes close calls in-process (auto_probe.h): when the model's runners-up are
  // close, the first calls at a size time the candidates and the ranks pin the fastest. On by
  // default; off, `auto` is the model's pick alone. Must be the same on every rank; clears
  // the decisions made so far. The choice then depends on timing: for run-to-run bitwise
  // reproducible float sums, turn it off (or name the algorithm).
  void set_auto_probe(bool on);
  bool auto_probe() const { return auto_probe_; }
  AutoProbeState& auto_probe_state();

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 1;
  int ranks_per_node_ = 0;
  std::unique_ptr<NodeGroups> groups_;
  int groups_built_for_ = -1;
  std::unique_ptr<std::byte[]> scratch_[kNumScratch];
  size_t scratch_bytes_[kNumScratch] = {};
  std::unique_ptr<AlphaBetaTable> cost_table_;
  std::unordered_map<uint64_t, uint8_t> auto_cache_;
  bool auto_probe_ = true;
  std::unique_ptr<AutoProbeState> auto_probe_state_;
  std::unique_ptr<CommThread> comm_thread_;
  void clear_auto_decisions();
};

}  // namespace kiln::comm
