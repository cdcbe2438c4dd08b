// Disaggregated prefill and decode over MPI (disaggregated.h).
#include "kiln/serve/disaggregated.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <thread>

#include "kiln/model/packed_linear.h"
#include "kiln/serve/model_executor.h"
#include "kiln/serve/scheduler.h"

namespace kiln {
namespace {

// Every message is a header, then its payload: a prompt's tokens (int32), one layer's K rows
// and V rows (f32), or an error's text. Tags per direction keep each ordered per pair of ranks.
enum class Kind : int64_t { kPrompt = 1, kCancel, kStop, kRows, kDone, kError };
struct Header {
  Kind kind;
  int64_t seq_id = 0;
  int64_t layer = 0;
  int64_t pos = 0;  // first position of the rows
  int64_t n = 0;    // tokens, rows or characters of the payload
};
constexpr int kTagToPrefill = 0x6b31, kTagToDecode = 0x6b32;

std::vector<char> message(const Header& h, const void* payload, size_t bytes) {
  std::vector<char> m(sizeof(Header) + bytes);
  std::memcpy(m.data(), &h, sizeof(Header));
  if (bytes > 0) std::memcpy(m.data() + sizeof(Header), payload, bytes);
  return m;
}

Header header_of(const std::vector<char>& m) {
  Header h{};
  KILN_CHECK_MSG(m.size() >= sizeof(Header), "disaggregated serving: a message of {} bytes has no header", m.size());
  std::memcpy(&h, m.data(), sizeof(Header));
  return h;
}

void check(int code, const char* what) {
  KILN_CHECK_MSG(code == MPI_SUCCESS, "disaggregated serving: {} failed (MPI error {})", what, code);
}

}  // namespace

// Nonblocking sends kept with their buffers until they complete.
class Outbox {
 public:
  void send(MPI_Comm comm, int rank, int tag, std::vector<char> bytes) {
    sends_.emplace_back(MPI_REQUEST_NULL, std::move(bytes));
    auto& [request, buf] = sends_.back();
    check(MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, rank, tag, comm, &request), "MPI_Isend");
  }
  // Frees what completed (and lets MPI progress the rest).
  void progress() {
    while (!sends_.empty()) {
      int done = 0;
      check(MPI_Test(&sends_.front().first, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) break;
      sends_.pop_front();
    }
  }
  bool empty() const { return sends_.empty(); }
  void wait_all() {
    for (auto& [request, buf] : sends_) check(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
    sends_.clear();
  }

 private:
  std::deque<std::pair<MPI_Request, std::vector<char>>> sends_;
};

Expected<DisaggregateOptions> parse_disaggregate(std::string_view spec, int world_size) {
  DisaggregateOptions o;
  const size_t colon = spec.find(':');
  auto number = [](std::string_view s, int& out) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size();
  };
  if (colon == std::string_view::npos || !number(spec.substr(0, colon), o.prefill_ranks) ||
      !number(spec.substr(colon + 1), o.decode_ranks) || o.prefill_ranks < 1 || o.decode_ranks < 1)
    return invalid_argument("--disaggregate '{}' must be P:D with P prefill and D decode ranks, each >= 1 (e.g. 1:1)", spec);
  if (o.decode_ranks != 1)
    return invalid_argument("--disaggregate {}: one decode rank (the HTTP front end) is implemented, not {}", spec,
                            o.decode_ranks);
  if (o.prefill_ranks + o.decode_ranks != world_size)
    return invalid_argument("--disaggregate {} needs {} ranks; this job has {} (mpirun -np {})", spec,
                            o.prefill_ranks + o.decode_ranks, world_size, o.prefill_ranks + o.decode_ranks);
  return o;
}

// ---- the decode rank ---------------------------------------------------------------------------
MpiPrefillClient::MpiPrefillClient(comm::Communicator& comm, int64_t n_layers, int64_t row_width, bool has_v,
                                   double timeout_s)
    : comm_(comm), n_layers_(n_layers), row_width_(row_width), has_v_(has_v), timeout_s_(timeout_s),
      outbound_(std::make_unique<Outbox>()) {
  for (int r = 1; r < comm.size(); ++r) workers_[r].last_heard = Clock::now();
  stats_.workers = stats_.workers_alive = comm.size() - 1;
}

MpiPrefillClient::~MpiPrefillClient() = default;

std::string MpiPrefillClient::describe() const {
  return fmt::format("{} prefill rank{} → 1 decode rank (K/V per layer as written, {} floats per token and layer)",
                     workers_.size(), workers_.size() == 1 ? "" : "s", row_width_ * (has_v_ ? 2 : 1));
}

void MpiPrefillClient::send(int rank, std::vector<char> bytes) {
  outbound_->send(comm_.handle(), rank, kTagToPrefill, std::move(bytes));
}

bool MpiPrefillClient::submit(int64_t seq_id, std::span<const int32_t> tokens) {
  Worker* best = nullptr;
  int best_rank = -1;
  for (auto& [rank, w] : workers_) {
    if (w.alive && (best == nullptr || w.queued_tokens < best->queued_tokens)) {
      best = &w;
      best_rank = rank;
    }
  }
  if (best == nullptr) return false;
  const auto n = static_cast<int64_t>(tokens.size());
  send(best_rank, message({Kind::kPrompt, seq_id, 0, 0, n}, tokens.data(), tokens.size() * sizeof(int32_t)));
  if (best->jobs++ == 0) best->last_heard = Clock::now();  // the clock runs while it holds work
  best->queued_tokens += n;
  jobs_[seq_id] = {best_rank, n};
  ++stats_.submitted;
  return true;
}

void MpiPrefillClient::cancel(int64_t seq_id) {
  auto it = jobs_.find(seq_id);
  if (it == jobs_.end()) return;
  Worker& w = workers_.at(it->second.worker);
  if (w.alive) send(it->second.worker, message({Kind::kCancel, seq_id, 0, 0, 0}, nullptr, 0));
  --w.jobs;
  w.queued_tokens -= it->second.tokens;
  jobs_.erase(it);
}

void MpiPrefillClient::give_up(int rank, Progress& progress) {
  Worker& w = workers_.at(rank);
  w.alive = false;
  --stats_.workers_alive;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second.worker != rank) {
      ++it;
      continue;
    }
    progress.failed.emplace_back(it->first, fmt::format("prefill rank {} sent nothing for {:g} s while it held {} "
                                                        "prompt(s); no prompt goes to it again",
                                                        rank, timeout_s_, w.jobs));
    ++stats_.failed;
    it = jobs_.erase(it);
  }
  w.jobs = w.queued_tokens = 0;
}

void MpiPrefillClient::handle(int rank, const std::vector<char>& bytes, const KvWriter& write, Progress& progress) {
  const Header h = header_of(bytes);
  Worker& w = workers_.at(rank);
  w.last_heard = Clock::now();
  auto it = jobs_.find(h.seq_id);
  if (!w.alive || it == jobs_.end() || it->second.worker != rank) return;  // cancelled or given up: dropped
  if (h.kind == Kind::kRows) {
    const size_t floats = static_cast<size_t>(h.n * row_width_);
    KILN_CHECK_MSG(bytes.size() == sizeof(Header) + floats * sizeof(float) * (has_v_ ? 2 : 1) && h.layer >= 0 &&
                       h.layer < n_layers_,
                   "disaggregated serving: rank {} sent {} bytes for {} rows of layer {}", rank, bytes.size(), h.n,
                   h.layer);
    const auto* k = reinterpret_cast<const float*>(bytes.data() + sizeof(Header));
    write(h.seq_id, h.layer, h.pos, h.n, k, has_v_ ? k + floats : nullptr);
    stats_.bytes += static_cast<int64_t>(bytes.size() - sizeof(Header));
    return;
  }
  --w.jobs;
  w.queued_tokens -= it->second.tokens;
  jobs_.erase(it);
  if (h.kind == Kind::kDone) {
    ++stats_.completed;
    progress.done.push_back(h.seq_id);
  } else {
    ++stats_.failed;
    progress.failed.emplace_back(h.seq_id, fmt::format("prefill rank {}: {}", rank,
                                                       std::string(bytes.data() + sizeof(Header), bytes.size() - sizeof(Header))));
  }
}

void MpiPrefillClient::poll(const KvWriter& write, Progress& progress) {
  outbound_->progress();
  // Match every message that has arrived (its receive runs while we go on), then handle each
  // source's in order as they complete.
  for (;;) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status status;
    check(MPI_Improbe(MPI_ANY_SOURCE, kTagToDecode, comm_.handle(), &flag, &msg, &status), "MPI_Improbe");
    if (!flag) break;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    Inbound in;
    in.bytes.resize(static_cast<size_t>(count));
    auto& queue = inbound_[status.MPI_SOURCE];
    queue.push_back(std::move(in));
    check(MPI_Imrecv(queue.back().bytes.data(), count, MPI_BYTE, &msg, &queue.back().request), "MPI_Imrecv");
  }
  for (auto& [rank, queue] : inbound_) {
    while (!queue.empty()) {
      int done = 0;
      check(MPI_Test(&queue.front().request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) break;
      handle(rank, queue.front().bytes, write, progress);
      queue.pop_front();
    }
  }
  const auto now = Clock::now();
  for (auto& [rank, w] : workers_)
    if (w.alive && w.jobs > 0 && std::chrono::duration<double>(now - w.last_heard).count() > timeout_s_)
      give_up(rank, progress);
}

bool MpiPrefillClient::shutdown() {
  bool all_alive = true;
  for (auto& [rank, w] : workers_) {
    if (w.alive) send(rank, message({Kind::kStop, 0, 0, 0, 0}, nullptr, 0));
    all_alive = all_alive && w.alive;
  }
  if (!all_alive) return false;  // a send to a stuck rank may never complete
  outbound_->wait_all();
  return true;
}

// ---- a prefill rank ----------------------------------------------------------------------------
Status run_prefill_rank(Transformer& model, const EngineConfig& config, comm::Communicator& comm) {
  const ModelConfig& c = model.config();
  KvCacheConfig kv;
  kv.block_size = config.block_size;
  kv.enable_prefix_caching = config.enable_prefix_caching;
  KILN_ASSIGN_OR_RETURN(kv.num_blocks, num_kv_blocks_for_memory(config.kv_cache_mem_bytes,
                                                                kv_bytes_per_token(c, DType::kF32), config.block_size));
  SchedulerConfig sc = config.scheduler;
  sc.batching = BatchingMode::kContinuous;
  sc.num_lookahead = 0;
  KILN_ASSIGN_OR_RETURN(auto scheduler, Scheduler::create(sc, kv));
  if (config.packed_weights) install_packed_weights(model);
  ModelExecutor executor(model, nullptr, kv.num_blocks, kv.block_size, config.packed_weights);
  PagedKvCache& cache = executor.cache();
  const int64_t w = cache.row_width;
  const bool has_v = !cache.v.empty() && cache.v[0].numel() > 0;
  const MPI_Comm mpi = comm.handle();

  std::unordered_map<int64_t, int64_t> seq_of;    // scheduler request id -> the decode rank's seq id
  std::unordered_map<int64_t, int64_t> request_of;  // and back
  Outbox out;
  std::vector<float> rows;
  // Rows [pos, pos + n) of layer l of a scheduled sequence, gathered from its blocks.
  auto send_rows = [&](const ScheduledSeq& e, int64_t l, int64_t pos, int64_t n) {
    rows.resize(static_cast<size_t>(n * w * (has_v ? 2 : 1)));
    cache.read_rows(l, e.block_ids, pos, n, rows.data(), has_v ? rows.data() + n * w : nullptr);
    out.send(mpi, 0, kTagToDecode,
             message({Kind::kRows, seq_of.at(e.request_id), l, pos, n}, rows.data(), rows.size() * sizeof(float)));
  };
  const SchedulerOutput* step = nullptr;
  cache.on_layer_written = [&](int64_t l) {
    for (const ScheduledSeq& e : step->seqs) {
      if (e.num_cached_tokens > 0) send_rows(e, l, 0, e.num_cached_tokens);  // a prefix-cache hit, once
      send_rows(e, l, e.num_computed_tokens, e.num_new_tokens);
    }
    out.progress();
  };
  auto send_error = [&](int64_t seq, const std::string& why) {
    out.send(mpi, 0, kTagToDecode, message({Kind::kError, seq, 0, 0, static_cast<int64_t>(why.size())}, why.data(), why.size()));
  };

  bool stopping = false;
  std::vector<char> buf;
  while (!stopping) {
    // Messages from the decode rank: wait for one when there is nothing else to do.
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (!scheduler->has_unfinished() && out.empty()) {
        check(MPI_Probe(0, kTagToPrefill, mpi, &status), "MPI_Probe");
        flag = 1;
      } else {
        check(MPI_Iprobe(0, kTagToPrefill, mpi, &flag, &status), "MPI_Iprobe");
      }
      if (!flag) break;
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      buf.resize(static_cast<size_t>(count));
      check(MPI_Recv(buf.data(), count, MPI_BYTE, 0, kTagToPrefill, mpi, MPI_STATUS_IGNORE), "MPI_Recv");
      const Header h = header_of(buf);
      if (h.kind == Kind::kStop) {
        stopping = true;
        break;
      }
      if (h.kind == Kind::kCancel) {
        if (auto it = request_of.find(h.seq_id); it != request_of.end()) {
          scheduler->abort_request(it->second);
          seq_of.erase(it->second);
          request_of.erase(it);
        }
        continue;
      }
      Request r;
      const auto* t = reinterpret_cast<const int32_t*>(buf.data() + sizeof(Header));
      r.prompt.assign(t, t + h.n);
      r.max_tokens = 1;  // the step that computes the last row "samples" once: the prompt is done
      auto id = scheduler->add_request(std::move(r));
      if (!id.ok()) {
        send_error(h.seq_id, id.status().message());
        continue;
      }
      seq_of[*id] = h.seq_id;
      request_of[h.seq_id] = *id;
    }
    if (stopping) break;
    if (!scheduler->has_unfinished()) {
      out.progress();
      if (!out.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    SchedulerOutput s = scheduler->schedule();
    step = &s;
    Expected<StepLogits> logits = s.empty() ? Expected<StepLogits>(StepLogits{}) : executor.execute(s);
    if (!logits.ok()) {
      for (const int64_t id : scheduler->fail_step(s)) {
        send_error(seq_of.at(id), logits.status().message());
        request_of.erase(seq_of.at(id));
        seq_of.erase(id);
      }
      continue;
    }
    const std::vector<int32_t> sampled(static_cast<size_t>(s.num_sampled_tokens), 0);
    const UpdateResult u = scheduler->update(s, sampled);
    for (const FinishedSeq& f : u.finished) {  // every row of it was sent in this step or before
      const int64_t seq = seq_of.at(f.request_id);
      out.send(mpi, 0, kTagToDecode, message({Kind::kDone, seq, 0, 0, 0}, nullptr, 0));
      request_of.erase(seq);
      seq_of.erase(f.request_id);
    }
    out.progress();
  }
  cache.on_layer_written = nullptr;
  out.wait_all();
  return {};
}

}  // namespace kiln
