// Engine: commands from request threads are queued and applied between steps by the one
// thread that owns the scheduler; each step schedules, runs the model, samples each sequence
// with its own seeded generator, updates the scheduler and pushes tokens to the streams.
#include "kiln/serve/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "kiln/core/checked_math.h"
#include "kiln/core/dtype.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"
#include "kiln/model/packed_linear.h"

namespace kiln {

using Clock = std::chrono::steady_clock;

// ---- RequestStream, Histogram ------------------------------------------------------------------
bool RequestStream::wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !events_.empty() || num_finished_ >= n_; });
  const bool had = !events_.empty();
  while (!events_.empty()) {
    out.push_back(events_.front());
    events_.pop_front();
  }
  return had || num_finished_ < n_;
}

bool RequestStream::finished() const {
  std::lock_guard lk(mu_);
  return num_finished_ >= n_;
}

std::vector<LogprobEntry> RequestStream::prompt_logprobs() const {
  std::lock_guard lk(mu_);
  return prompt_logprobs_;
}

void RequestStream::set_prompt_logprobs(std::vector<LogprobEntry> lp) {
  std::lock_guard lk(mu_);
  prompt_logprobs_ = std::move(lp);
}

void RequestStream::push(const TokenEvent& e) {
  {
    std::lock_guard lk(mu_);
    events_.push_back(e);
    if (e.finish != FinishReason::kNone) ++num_finished_;
  }
  cv_.notify_all();
}

void RequestStream::set_error(std::string message) {
  std::lock_guard lk(mu_);
  error_ = std::move(message);
}

std::string RequestStream::error() const {
  std::lock_guard lk(mu_);
  return error_;
}

void Histogram::observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
  ++counts[i];
  sum += v;
  ++count;
}

// ---- engine state ----------------------------------------------------------------------------
struct Engine::Command {
  enum Kind { kAdd, kAbort, kFinishSample, kFailAll } kind = kAdd;
  int64_t request_id = 0;
  std::vector<int32_t> prompt;
  GenerationParams params;
  std::shared_ptr<RequestStream> stream;
  int64_t index = 0;
  FinishReason reason = FinishReason::kNone;
  std::string message;  // kFailAll
  Clock::time_point arrival;
};

struct Engine::RequestState {
  std::shared_ptr<RequestStream> stream;
  GenerationParams params;
  int64_t sched_id = -1;
  std::vector<Rng> rngs;           // (n,) one generator per sample
  std::vector<uint8_t> done;       // (n,)
  std::vector<int64_t> num_tokens; // (n,) tokens emitted
  std::vector<Clock::time_point> last_token;  // (n,) when each sample last emitted
  std::vector<int64_t> seq_ids;    // its scheduler sequences (the first, then forks)
  int64_t num_done = 0;
  bool got_first = false;
  std::vector<LogprobEntry> prompt_lp;  // (prompt_len,) params.prompt_logprobs: filled during prefill
  bool prompt_lp_done = false;          // every prompt position computed and reported
  Clock::time_point arrival;
};

namespace {
// K/V bytes per token this rank holds, of the target (its tp shard's KV heads) and, when there
// is one, the draft (same block tables).
int64_t engine_kv_bytes_per_token(const Transformer& model, const Transformer* draft) {
  const int64_t target = kv_bytes_per_token(model.config(), DType::kF32) / model.config().n_kv_heads * model.kv_heads();
  return target + (draft ? kv_bytes_per_token(draft->config(), DType::kF32) : 0);
}
}  // namespace

Expected<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<Transformer> model, const EngineConfig& config,
                                                 std::unique_ptr<Transformer> draft) {
  if (!model) return invalid_argument("[engine] no model");
  KvCacheConfig kv;
  kv.block_size = config.block_size;
  kv.enable_prefix_caching = config.enable_prefix_caching;
  if (config.block_size < 1) return invalid_argument("[engine] --block-size {} must be >= 1", config.block_size);
  SchedulerConfig sched_config = config.scheduler;
  if (draft) {
    if (draft->config().vocab_size != model->config().vocab_size)
      return invalid_argument("[engine] the draft model's vocabulary ({}) differs from the model's ({})",
                              draft->config().vocab_size, model->config().vocab_size);
    if (config.num_speculative < 1 || config.num_speculative > 16)
      return invalid_argument("[engine] --num-speculative {} must be in [1, 16]", config.num_speculative);
    sched_config.num_lookahead = config.num_speculative;
    if (config.speculative_max_batch < 0)
      return invalid_argument("[engine] --speculative-max-batch {} must be >= 0", config.speculative_max_batch);
    sched_config.lookahead_max_batch = config.speculative_max_batch;
  }
  if (config.remote_prefill && (draft || config.scheduler.batching != BatchingMode::kContinuous))
    return invalid_argument("[engine] disaggregated prefill runs with continuous batching and no draft model");
  KILN_ASSIGN_OR_RETURN(kv.num_blocks, num_kv_blocks_for_memory(config.kv_cache_mem_bytes,
                                                                engine_kv_bytes_per_token(*model, draft.get()),
                                                                config.block_size));
  KILN_ASSIGN_OR_RETURN(auto sched, Scheduler::create(sched_config, kv));
  const int64_t num_blocks = kv.num_blocks;
  if (config.packed_weights) {
    install_packed_weights(*model);
    if (draft) install_packed_weights(*draft);
  }
  return std::unique_ptr<Engine>(new Engine(std::move(model), std::move(draft), config, num_blocks, std::move(sched)));
}

Engine::Engine(std::unique_ptr<Transformer> model, std::unique_ptr<Transformer> draft, const EngineConfig& config,
               int64_t num_blocks, std::unique_ptr<Scheduler> scheduler)
    : model_(std::move(model)),
      draft_(std::move(draft)),
      config_(config),
      num_blocks_(num_blocks),
      scheduler_(std::move(scheduler)),
      executor_(*model_, draft_.get(), num_blocks, config.block_size, config.packed_weights, config.graph_capture,
                config.graph_pass) {
  metrics_.block_size = config.block_size;
  metrics_.kv_bytes_per_token = engine_kv_bytes_per_token(*model_, draft_.get());
  metrics_.kv_bytes_per_token_mha = kv_bytes_per_token(mha_of_same_width(model_->config()), DType::kF32);
  metrics_.kv_bytes_per_token_gqa = kv_bytes_per_token(gqa_of_same_width(model_->config()), DType::kF32);
  metrics_.kv_cache_bytes = executor_.cache_bytes();
  metrics_.kv_blocks = scheduler_->kv_stats().pool;
  metrics_.num_speculative = draft_ ? config.num_speculative : 0;
}

int64_t Engine::context_len() const {
  const int64_t ctx = model_->config().max_seq_len;
  return draft_ ? std::min(ctx, draft_->config().max_seq_len) : ctx;
}

Engine::~Engine() { stop(); }

void Engine::start() {
  std::lock_guard lk(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  {
    std::lock_guard lk(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Nobody will step any more: end every open stream so no reader waits forever.
  apply_commands();
  for (auto& [id, r] : requests_) {
    cancel_remote(*r);
    scheduler_->abort_request(r->sched_id);
    end_request(id, *r, FinishReason::kAborted);
  }
  requests_.clear();
  refresh_gauges();
}

void Engine::loop() {
  trace::set_thread_name("engine");
  bool busy = false;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || busy || !commands_.empty(); });
      if (stopping_) return;
    }
    // step_locked_out fails a step's own requests when the step fails; this catches what
    // throws around it (applying commands, scheduling): every open request fails, and the
    // process and the requests that come later go on.
    try {
      busy = step_locked_out();
    } catch (const std::exception& e) {
      fail_every_request(fmt::format("[engine] step failed: {}", e.what()));
      busy = false;
    }
  }
}

void Engine::fail_all(std::string message) {
  {
    std::lock_guard lk(mu_);
    Command cmd;
    cmd.kind = Command::kFailAll;
    cmd.message = std::move(message);
    commands_.push_back(std::move(cmd));
  }
  cv_.notify_all();
}

void Engine::fail_next_step(Status status) {
  KILN_CHECK(!status.ok());
  std::lock_guard lk(mu_);
  injected_failure_ = std::move(status);
}

void Engine::fail_requests(const std::vector<int64_t>& request_ids, const std::string& message) {
  for (const int64_t id : request_ids) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    RequestState& r = *it->second;
    cancel_remote(r);
    scheduler_->abort_request(r.sched_id);
    r.stream->set_error(message);
    end_request(id, r, FinishReason::kError);
    requests_.erase(it);
  }
  refresh_gauges();
}

void Engine::fail_every_request(const std::string& message) {
  std::vector<int64_t> ids;
  for (const auto& [id, r] : requests_) ids.push_back(id);
  fail_requests(ids, message);
}

bool Engine::step() {
  KILN_CHECK_MSG(!thread_.joinable(), "Engine::step() while the background loop runs");
  return step_locked_out();
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

Expected<std::shared_ptr<RequestStream>> Engine::add_request(std::vector<int32_t> prompt, const GenerationParams& p) {
  const ModelConfig& c = model_->config();
  const auto len = static_cast<int64_t>(prompt.size());
  if (len == 0) return invalid_argument("[engine] the prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= c.vocab_size) return invalid_argument("[engine] token id {} outside the vocabulary of {}", t, c.vocab_size);
  if (p.n < 1 || p.n > kMaxParallelSamples) return invalid_argument("[engine] n {} must be in [1, {}]", p.n, kMaxParallelSamples);
  if (p.max_tokens < 1) return invalid_argument("[engine] max_tokens {} must be >= 1", p.max_tokens);
  const int64_t ctx = context_len();
  if (len > ctx) return out_of_range("[engine] the prompt has {} tokens; the context is {}", len, ctx);
  // (len <= ctx, so ctx - len cannot overflow where len + max_tokens could: max_tokens = 2^63 - 1)
  if (p.max_tokens > ctx - len)
    return out_of_range("[engine] {} prompt tokens + max_tokens {} exceed the context of {}", len, p.max_tokens, ctx);
  if (!(p.sampling.temperature >= 0) || !(p.sampling.top_p > 0 && p.sampling.top_p <= 1) || p.sampling.top_k < 0)
    return invalid_argument("[engine] temperature {} must be >= 0, top_p {} in (0, 1], top_k {} >= 0",
                            p.sampling.temperature, p.sampling.top_p, p.sampling.top_k);
  if (p.num_logprobs < -1 || p.num_logprobs > kMaxLogprobs)
    return invalid_argument("[engine] num_logprobs {} must be in [-1, {}]", p.num_logprobs, kMaxLogprobs);
  if (p.prompt_logprobs && p.num_logprobs < 0) return invalid_argument("[engine] prompt_logprobs needs num_logprobs >= 0");
  const LogitAdjust& a = p.adjust;
  if (!(a.frequency_penalty >= -2 && a.frequency_penalty <= 2) || !(a.presence_penalty >= -2 && a.presence_penalty <= 2))
    return invalid_argument("[engine] frequency_penalty {} and presence_penalty {} must be in [-2, 2]", a.frequency_penalty,
                            a.presence_penalty);
  for (const auto& [id, bias] : a.logit_bias) {
    if (id < 0 || id >= c.vocab_size)
      return invalid_argument("[engine] logit_bias token id {} outside the vocabulary of {}", id, c.vocab_size);
    if (!(bias >= -100 && bias <= 100)) return invalid_argument("[engine] logit_bias {} must be in [-100, 100]", bias);
  }
  const int64_t blocks = (len + p.max_tokens - 1 + config_.block_size - 1) / config_.block_size;
  if (blocks > num_blocks_)
    return resource_exhausted("[engine] {} prompt tokens + max_tokens {} need {} KV blocks, the cache has {} "
                              "(raise --kv-cache-mem)", len, p.max_tokens, blocks, num_blocks_);
  Command cmd;
  cmd.kind = Command::kAdd;
  cmd.prompt = std::move(prompt);
  cmd.params = p;
  cmd.arrival = Clock::now();
  std::shared_ptr<RequestStream> stream;
  {
    std::lock_guard lk(mu_);
    cmd.request_id = next_request_id_++;
    if (!cmd.params.seed) cmd.params.seed = seed_counter_++ * 0x9e3779b97f4a7c15ull;
    stream = std::make_shared<RequestStream>(cmd.request_id, p.n, len);
    cmd.stream = stream;
    commands_.push_back(std::move(cmd));
  }
  cv_.notify_all();
  return stream;
}

void Engine::abort(int64_t request_id) {
  {
    std::lock_guard lk(mu_);
    Command cmd;
    cmd.kind = Command::kAbort;
    cmd.request_id = request_id;
    commands_.push_back(std::move(cmd));
  }
  cv_.notify_all();
}

void Engine::finish_sample(int64_t request_id, int64_t index, FinishReason reason) {
  {
    std::lock_guard lk(mu_);
    Command cmd;
    cmd.kind = Command::kFinishSample;
    cmd.request_id = request_id;
    cmd.index = index;
    cmd.reason = reason;
    commands_.push_back(std::move(cmd));
  }
  cv_.notify_all();
}

// Ends every open sample of a request with `reason` and forgets it (its sequences must be
// gone from the scheduler already).
void Engine::end_request(int64_t id, RequestState& r, FinishReason reason) {
  for (int64_t i = 0; i < r.params.n; ++i) {
    if (r.done[static_cast<size_t>(i)]) continue;
    r.done[static_cast<size_t>(i)] = 1;
    r.stream->push({i, -1, reason, std::nullopt});
  }
  sched_to_request_.erase(r.sched_id);
  for (int64_t seq : r.seq_ids) seq_index_.erase(seq);
  std::lock_guard lk(metrics_mu_);
  ++(reason == FinishReason::kAborted ? metrics_.requests_aborted
     : reason == FinishReason::kError ? metrics_.requests_failed
                                       : metrics_.requests_finished);
  (void)id;
}

void Engine::apply_commands() {
  std::vector<Command> cmds;
  {
    std::lock_guard lk(mu_);
    cmds.swap(commands_);
  }
  for (Command& cmd : cmds) {
    if (cmd.kind == Command::kAdd) {
      auto r = std::make_unique<RequestState>();
      r->stream = cmd.stream;
      r->params = cmd.params;
      r->arrival = cmd.arrival;
      const auto n = static_cast<size_t>(cmd.params.n);
      for (size_t j = 0; j < n; ++j) r->rngs.emplace_back(*cmd.params.seed + j);
      r->done.assign(n, 0);
      r->num_tokens.assign(n, 0);
      r->last_token.resize(n);
      Request req;
      req.prompt = std::move(cmd.prompt);
      req.max_tokens = cmd.params.max_tokens;
      req.n = cmd.params.n;
      req.stop_token_ids = cmd.params.stop_token_ids;
      // The prompt's logprobs need the logits of every prompt position: none may come from
      // the prefix cache.
      req.skip_prefix_cache = cmd.params.prompt_logprobs;
      req.remote_prefill = config_.remote_prefill != nullptr && !cmd.params.prompt_logprobs;
      if (cmd.params.prompt_logprobs) r->prompt_lp.resize(req.prompt.size());
      {
        std::lock_guard lk(metrics_mu_);
        ++metrics_.requests_added;
      }
      auto sid = scheduler_->add_request(std::move(req));
      if (!sid.ok()) {  // checked in add_request already; end the stream rather than hang it
        end_request(cmd.request_id, *r, FinishReason::kAborted);
        continue;
      }
      r->sched_id = *sid;
      sched_to_request_[*sid] = cmd.request_id;
      seq_index_[*sid] = 0;
      r->seq_ids.push_back(*sid);
      requests_[cmd.request_id] = std::move(r);
      continue;
    }
    if (cmd.kind == Command::kFailAll) {
      fail_every_request(cmd.message);
      continue;
    }
    auto it = requests_.find(cmd.request_id);
    if (it == requests_.end()) continue;  // finished already
    RequestState& r = *it->second;
    if (cmd.kind == Command::kFinishSample) {
      if (cmd.index < 0 || cmd.index >= r.params.n || r.done[static_cast<size_t>(cmd.index)]) continue;
      r.done[static_cast<size_t>(cmd.index)] = 1;
      ++r.num_done;
      r.stream->push({cmd.index, -1, cmd.reason, std::nullopt});
      if (r.num_done < r.params.n) {
        // Its siblings go on; this sample's sequence stops computing now.
        for (int64_t seq : r.seq_ids) {
          auto sit = seq_index_.find(seq);
          if (sit == seq_index_.end() || sit->second != cmd.index) continue;
          if (scheduler_->abort_sequence(seq)) seq_index_.erase(sit);
          break;
        }
        continue;
      }
    }
    cancel_remote(r);
    scheduler_->abort_request(r.sched_id);
    end_request(cmd.request_id, r, cmd.kind == Command::kAbort ? FinishReason::kAborted : cmd.reason);
    requests_.erase(it);
  }
}

void Engine::refresh_gauges() {
  const KvCacheStats kv = scheduler_->kv_stats();
  std::lock_guard lk(metrics_mu_);
  EngineMetrics& m = metrics_;
  m.num_running = scheduler_->num_running();
  m.num_waiting = scheduler_->num_waiting();
  m.kv_blocks = kv.pool;
  m.prefix_cache_hit_rate = kv.hit_rate();
  m.prefix_query_tokens = kv.prefix_query_tokens;
  m.prefix_hit_tokens = kv.prefix_hit_tokens;
  m.num_preemptions = scheduler_->num_preemptions();
  m.num_steps = scheduler_->num_steps();
}

bool Engine::step_locked_out() {
  apply_commands();
  poll_remote();
  if (!scheduler_->has_unfinished()) {
    refresh_gauges();  // aborts may have freed blocks
    return false;
  }
  SchedulerOutput out = scheduler_->schedule();
  if (out.empty()) {  // every running sequence awaits its K/V (or nothing fits): nothing to compute
    scheduler_->update(out, {});
    submit_remote(out);
    refresh_gauges();
    if (config_.remote_prefill && config_.remote_prefill->num_pending() > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // the transfers progress meanwhile
    return true;
  }
  // One serve event per step: the batch, and its new tokens split into prompt (prefill, also a
  // preempted sequence's recomputation) and generated (decode) positions.
  trace::Scope ts(trace::Category::kServe, "engine_step", [&](trace::Event& e) {
    int64_t prefill = 0, decode = 0, padding = 0;
    for (const ScheduledSeq& q : out.seqs) {
      if (q.padding) {  // classic batching's padded rows
        padding += q.num_new_tokens;
        continue;
      }
      const int64_t prompt = requests_.at(sched_to_request_.at(q.request_id))->stream->prompt_len();
      const int64_t in_prompt = std::clamp<int64_t>(prompt - q.num_computed_tokens, 0, q.num_new_tokens);
      prefill += in_prompt;
      decode += q.num_new_tokens - in_prompt;
    }
    e.add_arg("batch", static_cast<int64_t>(out.seqs.size()));
    e.add_arg("prefill_tokens", prefill);
    e.add_arg("decode_tokens", decode);
    if (padding > 0) e.add_arg("padding_tokens", padding);
  });
  // A step that fails (the model returns an error, or something throws: out of memory, a
  // library error) fails the requests it scheduled with the reason; the others go on.
  std::string failure;
  try {
    Status st = run_step(out);
    if (st.ok()) return true;
    failure = st.to_string();
  } catch (const std::exception& e) {
    failure = fmt::format("exception: {}", e.what());
  }
  std::vector<int64_t> ids;
  if (scheduler_->awaiting_update()) {
    for (const int64_t sched_id : scheduler_->fail_step(out)) ids.push_back(sched_to_request_.at(sched_id));
  } else {  // it threw after update(): the requests of the step are in an unknown state
    for (const ScheduledSeq& e : out.seqs)
      if (auto it = sched_to_request_.find(e.request_id); it != sched_to_request_.end()) ids.push_back(it->second);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  fail_requests(ids, fmt::format("[engine] step {} failed: {}", out.step, failure));
  return true;
}

Status Engine::run_step(const SchedulerOutput& out) {
  const int64_t V = model_->config().vocab_size;
  auto request_of = [&](const ScheduledSeq& e) -> RequestState& { return *requests_.at(sched_to_request_.at(e.request_id)); };
  // The draft proposes from its logits adjusted like the target's (bias, and penalties over the
  // sample's tokens and the draft tokens so far), so it proposes what the target would accept;
  // the rejection rule holds for whatever q it drew from.
  std::vector<std::vector<int32_t>> draft_history(out.seqs.size());
  std::vector<float> draft_adjusted;
  auto draft_sampler = [&](size_t k, int64_t, const float* logits, float* q) {
    const ScheduledSeq& e = out.seqs[k];
    RequestState& r = request_of(e);
    auto& hist = draft_history[k];
    if (r.params.adjust.active()) {
      if (hist.empty()) {
        const auto prompt_len = std::min<int64_t>(r.stream->prompt_len(), static_cast<int64_t>(e.tokens.size()));
        hist.assign(e.tokens.begin() + prompt_len, e.tokens.end());
      }
      draft_adjusted.resize(static_cast<size_t>(V));
      adjust_logits(logits, V, r.params.adjust, hist, draft_adjusted.data());
      logits = draft_adjusted.data();
    }
    sampling_distribution(logits, V, r.params.sampling, q);
    Rng& rng = r.rngs[static_cast<size_t>(seq_index_.at(e.seq_id))];
    const int32_t t = r.params.sampling.temperature <= 0.0f ? static_cast<int32_t>(std::max_element(q, q + V) - q)
                                                            : sample_from_probs(q, V, rng);
    if (r.params.adjust.active()) hist.push_back(t);
    return t;
  };
  // Requests that report their prompt's logprobs (echo) need the logits of every prompt
  // position while they prefill; the executor computes them for those sequences only.
  all_rows_.assign(out.seqs.size(), 0);
  for (size_t k = 0; k < out.seqs.size(); ++k) {
    if (out.seqs[k].padding) continue;  // classic batching's padding: no request, no logits
    const RequestState& r = request_of(out.seqs[k]);
    if (r.params.prompt_logprobs && !r.prompt_lp_done && out.seqs[k].num_lookahead == 0) all_rows_[k] = 1;
  }
  // Draft tokens are drawn from each sequence's own generator, like its samples.
  Expected<StepLogits> step_logits = executor_.execute(out, draft_sampler, all_rows_);
  {
    std::lock_guard lk(mu_);
    if (injected_failure_) {
      step_logits = *injected_failure_;
      injected_failure_.reset();
    }
  }
  if (!step_logits.ok()) return step_logits.status();
  const StepLogits& logits = *step_logits;
  // Sample (or verify draft tokens) per sequence. Each uses only its own generator, so they
  // run in parallel with the same result.
  std::vector<std::vector<int32_t>> drawn(out.seqs.size());
  std::vector<std::vector<LogprobEntry>> drawn_lp(out.seqs.size());  // per drawn token, when asked
  std::vector<SpeculativeVerdict> verdicts(out.seqs.size());
  parallel_for(static_cast<int64_t>(out.seqs.size()), 1, [&](int64_t k0, int64_t k1) {
    std::vector<float> p, adjusted;
    std::vector<int32_t> history;
    for (int64_t k = k0; k < k1; ++k) {
      const ScheduledSeq& e = out.seqs[static_cast<size_t>(k)];
      if (e.padding) continue;
      RequestState& r = request_of(e);
      const int64_t prompt_len = r.stream->prompt_len();
      if (all_rows_[static_cast<size_t>(k)]) {
        // Row i follows position num_computed + i: the distribution of the token after it.
        // (Only the request's one sequence prefills before its first sample.)
        const float* first = logits.all_rows[static_cast<size_t>(k)];
        for (int64_t i = 0; i < e.num_new_tokens; ++i) {
          const int64_t next = e.num_computed_tokens + i + 1;
          if (next >= prompt_len) break;
          LogprobEntry& lp = r.prompt_lp[static_cast<size_t>(next)];
          lp.logprob = token_logprobs(first + i * V, V, e.tokens[static_cast<size_t>(next)], r.params.num_logprobs, &lp.top);
        }
        if (e.num_computed_tokens + e.num_new_tokens >= prompt_len) {
          r.prompt_lp_done = true;
          r.stream->set_prompt_logprobs(std::move(r.prompt_lp));
          r.prompt_lp = {};
        }
      }
      if (e.num_samples == 0) continue;
      auto& toks = drawn[static_cast<size_t>(k)];
      auto& lps = drawn_lp[static_cast<size_t>(k)];
      const float* rows = logits.rows[static_cast<size_t>(k)];
      // The logits sampling sees: bias and penalties over the sample's own tokens so far.
      const LogitAdjust& adjust = r.params.adjust;
      history.assign(e.tokens.begin() + std::min<int64_t>(prompt_len, static_cast<int64_t>(e.tokens.size())), e.tokens.end());
      auto report = [&](const float* raw, int32_t token) {
        if (r.params.num_logprobs < 0) return;
        LogprobEntry lp;
        lp.logprob = token_logprobs(raw, V, token, r.params.num_logprobs, &lp.top);
        lps.push_back(std::move(lp));
      };
      if (e.num_lookahead > 0) {
        // (γ+1, V) target distributions after the pending token and each draft token; row i's
        // penalties count the draft tokens before it as generated.
        const auto& x = logits.proposals[static_cast<size_t>(k)];
        p.resize(static_cast<size_t>((e.num_lookahead + 1) * V));
        for (int64_t i = 0; i <= e.num_lookahead; ++i) {
          const float* row = rows + i * V;
          if (adjust.active()) {
            adjusted.resize(static_cast<size_t>(V));
            adjust_logits(row, V, adjust, history, adjusted.data());
            row = adjusted.data();
            if (i < e.num_lookahead) history.push_back(x[static_cast<size_t>(i)]);
          }
          sampling_distribution(row, V, r.params.sampling, p.data() + i * V);
        }
        Rng& rng = r.rngs[static_cast<size_t>(seq_index_.at(e.seq_id))];
        const SpeculativeVerdict v = verify_draft(x, logits.draft_probs[static_cast<size_t>(k)].data(), p.data(), V,
                                                  r.params.sampling.temperature <= 0.0f, rng);
        verdicts[static_cast<size_t>(k)] = v;
        toks.assign(x.begin(), x.begin() + v.num_accepted);
        toks.push_back(v.next_token);
        for (size_t t = 0; t < toks.size(); ++t) report(rows + static_cast<int64_t>(t) * V, toks[t]);
        continue;
      }
      const float* row = rows;
      if (adjust.active()) {
        adjusted.resize(static_cast<size_t>(V));
        adjust_logits(rows, V, adjust, history, adjusted.data());
        row = adjusted.data();
      }
      for (int64_t j = 0; j < e.num_samples; ++j) {
        const int64_t index = e.num_samples > 1 ? j : seq_index_.at(e.seq_id);
        toks.push_back(sample_token(row, V, r.params.sampling, r.rngs[static_cast<size_t>(index)]));
        report(rows, toks.back());
      }
    }
  });
  sampled_.clear();
  counts_.clear();
  SpeculativeStats spec;
  spec.num_draft_passes = logits.num_draft_forwards;
  for (size_t k = 0; k < out.seqs.size(); ++k) {
    sampled_.insert(sampled_.end(), drawn[k].begin(), drawn[k].end());
    counts_.push_back(static_cast<int64_t>(drawn[k].size()));
    const ScheduledSeq& e = out.seqs[k];
    if (e.num_lookahead == 0) continue;
    ++spec.num_target_passes;
    spec.num_proposed += e.num_lookahead;
    spec.num_accepted += verdicts[k].num_accepted;
    spec.num_rejected += verdicts[k].num_accepted < e.num_lookahead ? 1 : 0;
    spec.num_generated += verdicts[k].num_accepted + 1;
  }
  UpdateResult u = scheduler_->update(out, sampled_, counts_);
  submit_remote(out);
  std::unordered_map<int64_t, const FinishedSeq*> finished;
  for (const FinishedSeq& f : u.finished) finished[f.seq_id] = &f;
  std::unordered_map<int64_t, std::vector<int64_t>> children;  // parent seq -> forked seqs in order
  for (const auto& [parent, child] : u.forked) {
    auto& c = children[parent];
    c.push_back(child);
    seq_index_[child] = static_cast<int64_t>(c.size());
  }
  const auto now = Clock::now();
  std::vector<double> ttfts, tpots;
  std::vector<int64_t> completed;
  for (size_t k = 0; k < out.seqs.size(); ++k) {
    const ScheduledSeq& e = out.seqs[k];
    if (e.num_samples == 0) continue;
    const int64_t req_id = sched_to_request_.at(e.request_id);
    RequestState& r = *requests_.at(req_id);
    const std::vector<int32_t>& toks = drawn[k];
    const bool speculative = e.num_lookahead > 0;
    // Inter-token times: a sample that emits k tokens in this step after a gap g since its last
    // emission records k intervals of g / k (its first token records none).
    auto record_gap = [&](size_t i, int64_t k) {
      if (k <= 0) return;
      const double g = std::chrono::duration<double>(now - r.last_token[i]).count() / double(k);
      tpots.insert(tpots.end(), static_cast<size_t>(k), g);
    };
    int64_t burst = 0;  // a speculative decode's tokens this step (the sample emitted before)
    size_t burst_sample = 0;
    for (size_t t = 0; t < toks.size(); ++t) {
      // Sample t of a multi-sample draw went to fork t; a speculative decode's tokens all
      // belong to its one sequence.
      const int64_t seq = speculative || t == 0 ? e.seq_id : children.at(e.seq_id).at(t - 1);
      if (!speculative && t > 0) r.seq_ids.push_back(seq);
      const auto i = static_cast<size_t>(seq_index_.at(seq));
      if (r.done[i]) break;  // ended early (stop string); its tokens are dropped
      auto fit = finished.find(seq);
      // A speculative decode finishes at its last token or at a stop token among the draft's
      // (the scheduler kept the tokens up to it; later ones are dropped).
      const bool last = !speculative || fit == finished.end() ||
                        r.num_tokens[i] + 1 >= static_cast<int64_t>(fit->second->output_tokens.size());
      const FinishReason finish = fit != finished.end() && last ? fit->second->reason : FinishReason::kNone;
      if (!r.got_first) {
        r.got_first = true;
        ttfts.push_back(std::chrono::duration<double>(now - r.arrival).count());
      }
      if (r.num_tokens[i]++ > 0) {
        if (speculative) {
          ++burst;
          burst_sample = i;
        } else {
          record_gap(i, 1);
          r.last_token[i] = now;
        }
      } else {
        r.last_token[i] = now;
      }
      TokenEvent ev{static_cast<int64_t>(i), toks[t], finish, std::nullopt};
      if (!drawn_lp[k].empty()) ev.logprobs = std::move(drawn_lp[k][t]);
      r.stream->push(ev);
      if (finish == FinishReason::kNone) continue;
      r.done[i] = 1;
      if (++r.num_done == r.params.n) completed.push_back(req_id);
      if (speculative) break;
    }
    if (burst > 0) {
      record_gap(burst_sample, burst);
      r.last_token[burst_sample] = now;
    }
    // Forget the sample index of every sequence that finished.
    for (size_t t = 0; t < (speculative ? 1 : toks.size()); ++t) {
      const int64_t seq = t == 0 ? e.seq_id : children.at(e.seq_id).at(t - 1);
      if (finished.count(seq)) seq_index_.erase(seq);
    }
  }
  for (int64_t id : completed) {
    auto it = requests_.find(id);
    end_request(id, *it->second, FinishReason::kStop);
    requests_.erase(it);
  }
  refresh_gauges();
  std::lock_guard lk(metrics_mu_);
  EngineMetrics& m = metrics_;
  m.prompt_tokens += out.num_batched_tokens;
  for (const ScheduledSeq& e : out.seqs)
    if (e.padding) m.padding_tokens += e.num_new_tokens;
  m.generation_tokens += static_cast<int64_t>(sampled_.size());
  m.spec.num_generated += spec.num_generated;
  m.spec.num_target_passes += spec.num_target_passes;
  m.spec.num_draft_passes += spec.num_draft_passes;
  m.spec.num_proposed += spec.num_proposed;
  m.spec.num_accepted += spec.num_accepted;
  m.spec.num_rejected += spec.num_rejected;
  for (double t : ttfts) m.ttft.observe(t);
  for (double t : tpots) m.tpot.observe(t);
  return {};
}

void Engine::cancel_remote(const RequestState& r) {
  if (!config_.remote_prefill) return;
  for (const int64_t seq : r.seq_ids) {
    config_.remote_prefill->cancel(seq);
    remote_started_.erase(seq);
  }
}

void Engine::submit_remote(const SchedulerOutput& out) {
  RemotePrefill* remote = config_.remote_prefill;
  for (const int64_t seq_id : out.remote_admitted_seq_ids) {
    const Sequence* s = scheduler_->find_sequence(seq_id);
    if (s == nullptr || !s->awaiting_remote) continue;  // aborted in the same step
    const std::span<const int32_t> head(s->tokens.data(), static_cast<size_t>(s->prompt_len - 1));
    if (remote->submit(seq_id, head)) {
      remote_started_[seq_id] = Clock::now();
    } else {
      scheduler_->prefill_locally(seq_id);  // no prefill worker left: as a colocated server
    }
  }
}

void Engine::poll_remote() {
  RemotePrefill* remote = config_.remote_prefill;
  if (!remote) return;
  PagedKvCache& cache = executor_.cache();
  auto write = [&](int64_t seq_id, int64_t layer, int64_t pos, int64_t n, const float* k, const float* v) {
    const Sequence* s = scheduler_->find_sequence(seq_id);
    KILN_CHECK_MSG(s != nullptr && s->awaiting_remote && layer >= 0 && layer < static_cast<int64_t>(cache.k.size()) &&
                       pos >= 0 && n >= 0 && pos + n <= s->prompt_len - 1,
                   "[engine] K/V rows [{}, {}) of layer {} for sequence {}, which does not await them", pos, pos + n,
                   layer, seq_id);
    cache.write_rows(layer, s->table.block_ids(), pos, n, k, v);
  };
  RemotePrefill::Progress progress;
  remote->poll(write, progress);
  const auto now = Clock::now();
  std::vector<double> latencies;
  for (const int64_t seq : progress.done) {
    if (!scheduler_->remote_prefilled(seq)) continue;
    if (auto it = remote_started_.find(seq); it != remote_started_.end()) {
      latencies.push_back(std::chrono::duration<double>(now - it->second).count());
      remote_started_.erase(it);
    }
  }
  for (const auto& [seq, why] : progress.failed) {
    remote_started_.erase(seq);
    const Sequence* s = scheduler_->find_sequence(seq);
    if (s == nullptr) continue;
    if (auto it = sched_to_request_.find(s->request_id); it != sched_to_request_.end())
      fail_requests({it->second}, fmt::format("[engine] remote prefill failed: {}", why));
  }
  std::lock_guard lk(metrics_mu_);
  for (double t : latencies) metrics_.kv_transfer.observe(t);
  metrics_.remote = remote->stats();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard lk(metrics_mu_);
  return metrics_;
}

namespace {
void put_metric(std::string& s, const char* name, const char* type, const char* help, double v) {
  s += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
}
void put_histogram(std::string& s, const char* name, const char* help, const Histogram& h) {
  s += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cum = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cum += h.counts[i];
    s += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.bounds[i], cum);
  }
  s += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, h.count, name, h.sum, name, h.count);
}
}  // namespace

std::string Engine::metrics_text() const {
  const EngineMetrics m = metrics();
  std::string s;
  put_metric(s, "kiln_num_requests_running", "gauge", "Sequences running (a request with n > 1 has n).", double(m.num_running));
  put_metric(s, "kiln_num_requests_waiting", "gauge", "Sequences waiting for admission.", double(m.num_waiting));
  put_metric(s, "kiln_kv_blocks_total", "gauge", "KV-cache blocks in the pool.", double(m.kv_blocks.num_blocks));
  put_metric(s, "kiln_kv_blocks_used", "gauge", "KV-cache blocks owned by a sequence.", double(m.kv_blocks.num_used));
  put_metric(s, "kiln_kv_blocks_free", "gauge", "KV-cache blocks allocatable (free or evictable cached).",
             double(m.kv_blocks.num_free + m.kv_blocks.num_evictable));
  put_metric(s, "kiln_kv_blocks_cached", "gauge", "KV-cache blocks in the prefix cache.", double(m.kv_blocks.num_cached));
  put_metric(s, "kiln_kv_block_size_tokens", "gauge", "Tokens per KV-cache block.", double(m.block_size));
  put_metric(s, "kiln_kv_cache_bytes_per_token", "gauge",
             "KV bytes per token: 2 * layers * kv_heads * head_dim * 4; latent attention layers * (kv_lora_rank + "
             "qk_rope_head_dim) * 4.",
             double(m.kv_bytes_per_token));
  put_metric(s, "kiln_kv_cache_mha_bytes_per_token", "gauge",
             "KV bytes per token of multi-head attention of the model's width: 2 * layers * heads * head_dim * 4.",
             double(m.kv_bytes_per_token_mha));
  put_metric(s, "kiln_kv_cache_gqa_bytes_per_token", "gauge",
             "KV bytes per token of grouped-query attention of the model's width with max(1, heads / 4) KV heads: "
             "2 * layers * (heads / 4) * head_dim * 4.",
             double(m.kv_bytes_per_token_gqa));
  put_metric(s, "kiln_kv_cache_bytes", "gauge", "Bytes of the KV-cache pool.", double(m.kv_cache_bytes));
  put_metric(s, "kiln_kv_cache_usage_ratio", "gauge", "Fraction of KV blocks owned by a sequence.",
             m.kv_blocks.num_blocks ? double(m.kv_blocks.num_used) / double(m.kv_blocks.num_blocks) : 0.0);
  put_metric(s, "kiln_prefix_cache_hit_rate", "gauge", "Prompt tokens found in the prefix cache / tokens looked up.",
             m.prefix_cache_hit_rate);
  put_metric(s, "kiln_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
             double(m.prefix_query_tokens));
  put_metric(s, "kiln_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
             double(m.prefix_hit_tokens));
  put_metric(s, "kiln_requests_added_total", "counter", "Requests accepted.", double(m.requests_added));
  put_metric(s, "kiln_requests_finished_total", "counter", "Requests finished (length or stop).",
             double(m.requests_finished));
  put_metric(s, "kiln_requests_aborted_total", "counter", "Requests aborted (client gone).", double(m.requests_aborted));
  put_metric(s, "kiln_requests_failed_total", "counter", "Requests ended by an engine error.", double(m.requests_failed));
  put_metric(s, "kiln_computed_tokens_total", "counter", "Tokens run through the model (prefill and decode).",
             double(m.prompt_tokens));
  put_metric(s, "kiln_padding_tokens_total", "counter",
             "Tokens computed as classic batching's padding (prompts padded to the batch's longest, finished rows).",
             double(m.padding_tokens));
  put_metric(s, "kiln_generation_tokens_total", "counter", "Tokens generated (sampled).", double(m.generation_tokens));
  put_metric(s, "kiln_num_preemptions_total", "counter", "Sequences preempted (recompute).", double(m.num_preemptions));
  put_metric(s, "kiln_engine_steps_total", "counter", "Engine steps run.", double(m.num_steps));
  if (m.num_speculative > 0) {
    put_metric(s, "kiln_spec_decode_num_speculative", "gauge", "Draft tokens proposed per decode step (gamma).",
               double(m.num_speculative));
    put_metric(s, "kiln_spec_decode_draft_tokens_total", "counter", "Draft tokens proposed.", double(m.spec.num_proposed));
    put_metric(s, "kiln_spec_decode_accepted_tokens_total", "counter", "Draft tokens accepted by the target.",
               double(m.spec.num_accepted));
    put_metric(s, "kiln_spec_decode_verifications_total", "counter",
               "Target verifications (one per sequence and step).", double(m.spec.num_target_passes));
    put_metric(s, "kiln_spec_decode_draft_forwards_total", "counter", "Batched forwards of the draft model.",
               double(m.spec.num_draft_passes));
    put_metric(s, "kiln_spec_decode_acceptance_rate", "gauge",
               "alpha: accepted / (accepted + verifications that stopped at a rejection).", m.spec.acceptance_rate());
    put_metric(s, "kiln_spec_decode_tokens_per_pass", "gauge", "Tokens emitted per target verification.",
               m.spec.tokens_per_pass());
    put_metric(s, "kiln_spec_decode_expected_tokens_per_pass", "gauge",
               "(1 - alpha^(gamma+1)) / (1 - alpha) for the measured alpha.",
               expected_tokens_per_pass(m.spec.acceptance_rate(), m.num_speculative));
  }
  if (config_.remote_prefill) {
    put_metric(s, "kiln_disagg_prefill_workers", "gauge", "Prefill ranks this decode rank hands prompts to.",
               double(m.remote.workers));
    put_metric(s, "kiln_disagg_prefill_workers_alive", "gauge", "Of them, those not given up on (timeout).",
               double(m.remote.workers_alive));
    put_metric(s, "kiln_disagg_prefills_total", "counter", "Prompts handed to a prefill rank.", double(m.remote.submitted));
    put_metric(s, "kiln_disagg_prefills_failed_total", "counter", "Handed-over prompts whose K/V never came.",
               double(m.remote.failed));
    put_metric(s, "kiln_disagg_kv_transfer_bytes_total", "counter", "K/V bytes received from prefill ranks.",
               double(m.remote.bytes));
    put_histogram(s, "kiln_disagg_kv_transfer_seconds",
                  "From handing a prompt over to its last K/V row written into this rank's blocks.", m.kv_transfer);
  }
  put_histogram(s, "kiln_time_to_first_token_seconds", "Time from arrival to the first token.", m.ttft);
  put_histogram(s, "kiln_time_per_output_token_seconds", "Time between consecutive output tokens of a sample (k tokens in one step after a gap g: k intervals of g/k).",
                m.tpot);
  return s;
}

}  // namespace kiln
