// MPI start-up and the Communicator: splits, node groups for the hierarchical algorithm,
// byte-level point-to-point helpers and reusable scratch memory.
#include "kiln/comm/communicator.h"

#include <sys/prctl.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "kiln/comm/auto_probe.h"
#include "kiln/comm/cost_model.h"
#include "kiln/comm/work.h"
#include "kiln/core/env.h"
#include "kiln/core/trace.h"

namespace kiln::comm {
namespace {

bool g_started_here = false;
bool g_thread_multiple = false;
thread_local bool t_polite = false;

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    abort_job(fmt::format("{} failed: {}", what, std::string(msg, len)));
  }
}

int as_int_bytes(size_t nbytes) {
  KILN_CHECK_MSG(nbytes <= static_cast<size_t>(INT_MAX), "one message of {} bytes (limit 2 GiB)",
                 nbytes);
  return static_cast<int>(nbytes);
}

}  // namespace

void init(int* argc, char*** argv) {
  int done = 0;
  MPI_Initialized(&done);
  if (done) return;
  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  g_started_here = true;
  g_thread_multiple = provided >= MPI_THREAD_MULTIPLE;
  // Errors come back as codes and end the job with a message (check_mpi), never a hang.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

bool thread_multiple() {
  int done = 0;
  MPI_Initialized(&done);
  if (!done) return false;
  if (!g_started_here) {  // MPI started by someone else: ask what it provides
    int provided = 0;
    MPI_Query_thread(&provided);
    return provided >= MPI_THREAD_MULTIPLE;
  }
  return g_thread_multiple;
}

void set_polite_waiting(bool on) {
  t_polite = on;
  // Sleeps of tens of microseconds need a small timer slack (the default, 50 us, would make
  // each poll interval about 70 us).
  if (on) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
}
bool polite_waiting() { return t_polite; }

double comm_timeout_seconds() {
  static const double seconds = [] {
    auto v = env_int("KILN_COMM_TIMEOUT", 1, kMaxCommTimeoutSeconds);
    if (!v.ok()) abort_job(v.status().message());
    return v->has_value() ? static_cast<double>(**v) : 60.0;
  }();
  return seconds;
}

namespace {
// Polls `reqs` with MPI_Testall until all complete (filling `statuses`, which may be
// MPI_STATUSES_IGNORE) and returns its code, MPI_SUCCESS or MPI_ERR_IN_STATUS (a request failed:
// its status says why); past comm_timeout_seconds() ends the job, naming what it waited for:
// `pending()`, or "another rank" when that is empty.
// Polite (`sleep`): spins for the first 50 us (a reply that is already on its way), then sleeps
// between polls, 20 us at first and doubling up to kMaxPollSleepUs (each wake-up costs the
// compute thread on this core a context switch; a wait for a rank that is still computing is
// long). Otherwise it spins throughout, as MPI_Waitall would.
constexpr int kMaxPollSleepUs = 200;
template <class Pending>
int poll_all(int n, MPI_Request* reqs, MPI_Status* statuses, bool sleep, Pending pending) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  int sleep_us = 20;
  for (;;) {
    int done = 0;
    const int rc = MPI_Testall(n, reqs, &done, statuses);
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) check_mpi(rc, "MPI_Testall");
    if (done) return rc;
    const double waited = std::chrono::duration<double>(clock::now() - t0).count();
    if (waited > comm_timeout_seconds()) {
      const std::string who = pending();
      abort_job(fmt::format("no progress for {:.0f} s waiting for {} (KILN_COMM_TIMEOUT): "
                            "a rank died or hangs; ending the job",
                            waited, who.empty() ? "another rank" : who));
    }
    if (sleep && waited > 50e-6) {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(2 * sleep_us, kMaxPollSleepUs);
    }
  }
}
}  // namespace

void wait_all_requests(int n, MPI_Request* reqs) {
  if (t_polite) {
    check_mpi(poll_all(n, reqs, MPI_STATUSES_IGNORE, true, [] { return std::string(); }),
              "MPI_Testall");
    return;
  }
  check_mpi(MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE), "MPI_Waitall");
}

int wait_all_bounded(int n, MPI_Request* reqs, MPI_Status* statuses,
                     const std::function<std::string(int)>& describe) {
  return poll_all(n, reqs, statuses, t_polite, [&] {
    std::string open;
    for (int i = 0; i < n; ++i) {
      int complete = 0;
      MPI_Request_get_status(reqs[i], &complete, MPI_STATUS_IGNORE);
      if (!complete) open += (open.empty() ? "" : ", ") + describe(i);
    }
    return open;
  });
}

namespace {
// World rank of rank `r` of `c`.
int world_rank_of(const Communicator& c, int r) {
  if (c.handle() == MPI_COMM_WORLD) return r;
  MPI_Group g = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(c.handle(), &g);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int out = MPI_UNDEFINED;
  MPI_Group_translate_ranks(g, 1, &r, world, &out);
  MPI_Group_free(&g);
  MPI_Group_free(&world);
  return out;
}
}  // namespace

void describe_comm(trace::Event& e, const Communicator& c, const char* op, const char* algo, double bytes, int peer) {
  e.op = op;
  e.algo = algo;
  e.bytes = bytes;
  // Interned per (communicator, peer): a group translation per event would cost more than the
  // event. Only reached while tracing.
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<MPI_Comm, int>, const char*>;
  std::lock_guard lk(mu);
  const char*& text = (*cache)[{c.handle(), peer}];
  if (text == nullptr) {
    std::string s;
    if (peer >= 0) {
      s = std::to_string(world_rank_of(c, peer));
    } else {
      for (int r = 0; r < c.size(); ++r) s += (r ? "," : "") + std::to_string(world_rank_of(c, r));
    }
    text = trace::intern(s);
  }
  e.peers = text;
}

double all_reduce_scalar(Communicator& c, double x, MPI_Op op, const char* what) {
  trace::Scope ts(trace::Category::kComm, "allreduce",
                  [&](trace::Event& e) { describe_comm(e, c, "allreduce", "mpi", sizeof(double)); });
  double out = 0;
  if (MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, op, c.handle()) != MPI_SUCCESS)
    abort_job(fmt::format("MPI_Allreduce of {} failed", what));
  return out;
}

bool job_survives_rank_failure() {
  const std::optional<std::string_view> v = env_value("OMPI_MCA_orte_enable_recovery");
  return v && (*v == "1" || *v == "true");
}

void finalize() {
  if (is_initialized()) Communicator::world().stop_comm_thread();
  int inited = 0, finished = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finished);
  if (inited && !finished && g_started_here) MPI_Finalize();
}

bool is_initialized() {
  int inited = 0, finished = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finished);
  return inited && !finished;
}

void abort_job(const std::string& message, int code) {
  std::fflush(stdout);
  int rank = -1;
  if (is_initialized()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "kiln comm: rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  if (is_initialized()) MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

Communicator& Communicator::world() {
  init();
  static Communicator w(MPI_COMM_WORLD, false);
  return w;
}

Communicator::Communicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  KILN_CHECK(comm != MPI_COMM_NULL);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Communicator::~Communicator() {
  stop_comm_thread();
  if (owned_ && comm_ != MPI_COMM_NULL && is_initialized()) MPI_Comm_free(&comm_);
}

Communicator::Communicator(Communicator&& o) noexcept { *this = std::move(o); }

Communicator& Communicator::operator=(Communicator&& o) noexcept {
  if (this == &o) return *this;
  KILN_CHECK_MSG(!comm_thread_ && !o.comm_thread_, "a Communicator with a communication thread cannot move");
  if (owned_ && comm_ != MPI_COMM_NULL && is_initialized()) MPI_Comm_free(&comm_);
  comm_ = o.comm_;
  owned_ = o.owned_;
  rank_ = o.rank_;
  size_ = o.size_;
  ranks_per_node_ = o.ranks_per_node_;
  groups_ = std::move(o.groups_);
  groups_built_for_ = o.groups_built_for_;
  for (int i = 0; i < kNumScratch; ++i) {
    scratch_[i] = std::move(o.scratch_[i]);
    scratch_bytes_[i] = o.scratch_bytes_[i];
    o.scratch_bytes_[i] = 0;
  }
  cost_table_ = std::move(o.cost_table_);
  auto_cache_ = std::move(o.auto_cache_);
  auto_probe_ = o.auto_probe_;
  auto_probe_state_ = std::move(o.auto_probe_state_);
  o.comm_ = MPI_COMM_NULL;
  o.owned_ = false;
  return *this;
}

Expected<std::unique_ptr<Communicator>> Communicator::split(int color, int key) const {
  if (color < 0) return invalid_argument("[split] color must be >= 0, got {}", color);
  MPI_Comm out = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
  return std::make_unique<Communicator>(out, true);
}

std::unique_ptr<Communicator> Communicator::split_type_shared() const {
  MPI_Comm out = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out),
            "MPI_Comm_split_type");
  return std::make_unique<Communicator>(out, true);
}

int single_node_split(int p) {
  int best = 0;
  for (int l = 2; l * l <= p; ++l)
    if (p % l == 0) best = l;
  return best;
}

int Communicator::hierarchical_node_size() {
  if (size_ < 2) return 0;
  NodeGroups& g = node_groups();
  return g.uniform && g.node->size() > 1 && g.node->size() < size_ ? g.node->size() : 0;
}

void Communicator::set_ranks_per_node(int n) {
  KILN_CHECK(n >= 0);
  ranks_per_node_ = n;
  clear_auto_decisions();
}

Communicator::NodeGroups& Communicator::node_groups() {
  if (groups_ && groups_built_for_ == ranks_per_node_) return *groups_;
  auto g = std::make_unique<NodeGroups>();
  if (ranks_per_node_ > 0) {
    g->node = split(rank_ / ranks_per_node_, rank_).value();
  } else {
    g->node = split_type_shared();
    // The same verdict on every rank: if one rank's node is the whole communicator, all are.
    const int virtual_size = single_node_split(size_);
    if (g->node->size() == size_ && virtual_size > 0)
      g->node = split(rank_ / virtual_size, rank_).value();
  }
  const int local = g->node->rank();
  g->cross = split(local, rank_).value();
  // Leaders: local rank 0 of each node; the others get a communicator they never use.
  g->leaders = split(local == 0 ? 0 : 1, rank_).value();
  if (local != 0) g->leaders.reset();
  int sizes[2] = {g->node->size(), -g->node->size()};
  int out[2] = {0, 0};
  MPI_Allreduce(sizes, out, 2, MPI_INT, MPI_MAX, comm_);
  g->uniform = out[0] == -out[1];
  groups_ = std::move(g);
  groups_built_for_ = ranks_per_node_;
  return *groups_;
}

MPI_Request Communicator::isend(const void* data, size_t nbytes, int dest, int tag) const {
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(data, as_int_bytes(nbytes), MPI_BYTE, dest, tag, comm_, &req), "MPI_Isend");
  return req;
}

MPI_Request Communicator::irecv(void* data, size_t nbytes, int source, int tag) const {
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Irecv(data, as_int_bytes(nbytes), MPI_BYTE, source, tag, comm_, &req),
            "MPI_Irecv");
  return req;
}

void Communicator::send(const void* data, size_t nbytes, int dest, int tag) const {
  trace::Scope ts(trace::Category::kComm, "send",
                  [&](trace::Event& e) { describe_comm(e, *this, "send", "p2p", static_cast<double>(nbytes), dest); });
  if (t_polite) {
    MPI_Request r = isend(data, nbytes, dest, tag);
    return wait(r);
  }
  check_mpi(MPI_Send(data, as_int_bytes(nbytes), MPI_BYTE, dest, tag, comm_), "MPI_Send");
}

void Communicator::recv(void* data, size_t nbytes, int source, int tag) const {
  trace::Scope ts(trace::Category::kComm, "recv",
                  [&](trace::Event& e) { describe_comm(e, *this, "recv", "p2p", static_cast<double>(nbytes), source); });
  if (t_polite) {
    MPI_Request r = irecv(data, nbytes, source, tag);
    return wait(r);
  }
  check_mpi(MPI_Recv(data, as_int_bytes(nbytes), MPI_BYTE, source, tag, comm_, MPI_STATUS_IGNORE),
            "MPI_Recv");
}

void Communicator::sendrecv(const void* send_data, size_t send_nbytes, int dest, void* recv_data,
                            size_t recv_nbytes, int source, int tag) const {
  trace::Scope ts(trace::Category::kComm, "sendrecv", [&](trace::Event& e) {
    describe_comm(e, *this, "sendrecv", "p2p", static_cast<double>(send_nbytes + recv_nbytes), dest);
  });
  if (t_polite) {
    MPI_Request r[2] = {irecv(recv_data, recv_nbytes, source, tag), isend(send_data, send_nbytes, dest, tag)};
    return wait_all_requests(2, r);
  }
  check_mpi(MPI_Sendrecv(send_data, as_int_bytes(send_nbytes), MPI_BYTE, dest, tag, recv_data,
                         as_int_bytes(recv_nbytes), MPI_BYTE, source, tag, comm_,
                         MPI_STATUS_IGNORE),
            "MPI_Sendrecv");
}

void Communicator::wait(MPI_Request& req) { wait_all_requests(1, &req); }

void Communicator::wait_all(std::vector<MPI_Request>& reqs) {
  if (reqs.empty()) return;
  wait_all_requests(static_cast<int>(reqs.size()), reqs.data());
  reqs.clear();
}

void Communicator::barrier() const {
  trace::Scope ts(trace::Category::kComm, "barrier", [&](trace::Event& e) { describe_comm(e, *this, "barrier", "mpi", 0); });
  if (t_polite) {
    MPI_Request r = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    return wait(r);
  }
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

CommThread& Communicator::comm_thread() {
  if (!comm_thread_) comm_thread_ = std::make_unique<CommThread>(*this);
  return *comm_thread_;
}

void Communicator::stop_comm_thread() { comm_thread_.reset(); }

std::byte* Communicator::scratch(int slot, size_t nbytes) {
  KILN_CHECK(slot >= 0 && slot < kNumScratch);
  if (nbytes > scratch_bytes_[slot]) {
    // Grow to at least 1.5x so a slowly growing sequence of calls reallocates rarely.
    const size_t want = std::max(nbytes, scratch_bytes_[slot] + scratch_bytes_[slot] / 2);
    scratch_[slot] = std::make_unique_for_overwrite<std::byte[]>(want);
    scratch_bytes_[slot] = want;
  }
  return scratch_[slot].get();
}

const AlphaBetaTable& Communicator::cost_table() {
  if (!cost_table_) cost_table_ = std::make_unique<AlphaBetaTable>(load_cost_table(*this));
  return *cost_table_;
}

void Communicator::set_cost_table(const AlphaBetaTable& table) {
  cost_table_ = std::make_unique<AlphaBetaTable>(table);
  clear_auto_decisions();
}

void Communicator::set_auto_probe(bool on) {
  auto_probe_ = on;
  clear_auto_decisions();
}

AutoProbeState& Communicator::auto_probe_state() {
  if (!auto_probe_state_) auto_probe_state_ = std::make_unique<AutoProbeState>();
  return *auto_probe_state_;
}

void Communicator::clear_auto_decisions() {
  auto_cache_.clear();
  if (auto_probe_state_) {  // the test hook stays
    auto_probe_state_->entries.clear();
    auto_probe_state_->model_why.clear();
  }
}

}  // namespace kiln::comm
