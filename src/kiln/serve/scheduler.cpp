// Scheduler: one schedule() per step walks the running sequences oldest first (a decode takes
// 1 token; a prefill takes a chunk of what is left of the budget after the decodes still to
// come), preempting the newest running sequence whenever the KV cache has no block, then admits
// waiting requests FCFS while budget, max_running and blocks allow.
#include "kiln/serve/scheduler.h"

#include <algorithm>
#include <limits>

#include "kiln/core/checked_math.h"

namespace kiln {

std::optional<BatchingMode> parse_batching_mode(std::string_view name) {
  if (name == "continuous") return BatchingMode::kContinuous;
  if (name == "static") return BatchingMode::kStatic;
  if (name == "classic") return BatchingMode::kClassic;
  return std::nullopt;
}

const char* batching_mode_name(BatchingMode m) {
  switch (m) {
    case BatchingMode::kContinuous:
      return "continuous";
    case BatchingMode::kStatic:
      return "static";
    case BatchingMode::kClassic:
      return "classic";
  }
  return "?";
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kAborted:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

Status check_scheduler_config(const SchedulerConfig& c, const KvCacheConfig& kv) {
  if (c.max_batched_tokens < 1)
    return invalid_argument("[scheduler] --max-batched-tokens {} must be >= 1",
                            c.max_batched_tokens);
  if (c.prefill_chunk < 1)
    return invalid_argument("[scheduler] --prefill-chunk {} must be >= 1", c.prefill_chunk);
  if (c.max_running < 1)
    return invalid_argument("[scheduler] --max-running {} must be >= 1", c.max_running);
  if (kv.block_size < 1)
    return invalid_argument("[scheduler] KV block size {} must be >= 1", kv.block_size);
  if (kv.num_blocks < 1)
    return invalid_argument("[scheduler] the KV cache needs at least one block, has {}",
                            kv.num_blocks);
  return {};
}

Expected<std::unique_ptr<Scheduler>> Scheduler::create(const SchedulerConfig& config,
                                                       const KvCacheConfig& kv) {
  KILN_RETURN_IF_ERROR(check_scheduler_config(config, kv));
  return std::unique_ptr<Scheduler>(new Scheduler(config, kv));
}

Scheduler::Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv)
    : config_(config), kv_(kv) {}

Expected<int64_t> Scheduler::add_request(Request request) {
  const auto prompt_len = static_cast<int64_t>(request.prompt.size());
  if (prompt_len == 0) return invalid_argument("[scheduler] add_request: the prompt is empty");
  if (request.max_tokens < 1) {
    return invalid_argument("[scheduler] add_request: max_tokens {} must be >= 1",
                            request.max_tokens);
  }
  if (request.n < 1)
    return invalid_argument("[scheduler] add_request: n {} must be >= 1", request.n);
  // The last sampled token is never fed back, so a sequence holds at most
  // prompt + max_tokens - 1 tokens of K/V; it must fit when it runs alone.
  const std::optional<int64_t> max_kv_tokens = checked_add(prompt_len, request.max_tokens - 1);
  const int64_t blocks = max_kv_tokens ? kv_.blocks_for(*max_kv_tokens) : std::numeric_limits<int64_t>::max();
  if (!max_kv_tokens || blocks > kv_.pool().num_blocks() || blocks < 0) {
    return resource_exhausted(
        "[scheduler] add_request: a {}-token prompt with max_tokens {} needs {} KV blocks of {} "
        "tokens, the whole cache has {} (raise --kv-cache-mem or lower max_tokens)",
        prompt_len, request.max_tokens, blocks, kv_.config().block_size, kv_.pool().num_blocks());
  }
  const int64_t id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, id, kv_.config().block_size);
  seq->tokens = std::move(request.prompt);
  seq->prompt_len = prompt_len;
  seq->max_tokens = request.max_tokens;
  seq->stop_token_ids = std::move(request.stop_token_ids);
  seq->skip_prefix_cache = request.skip_prefix_cache || request.remote_prefill;
  seq->remote_prefill = request.remote_prefill && prompt_len >= 2;
  seq->forks_pending = request.n - 1;
  waiting_.push_back(seq.get());
  seqs_.emplace(id, std::move(seq));
  return id;
}

const Sequence* Scheduler::find_sequence(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void Scheduler::schedule_seq(Sequence& s, int64_t num_new, int64_t num_lookahead, SchedulerOutput& out) {
  ScheduledSeq e;
  e.seq_id = s.id;
  e.request_id = s.request_id;
  e.num_computed_tokens = s.num_computed;
  e.num_new_tokens = num_new;
  e.num_lookahead = num_lookahead;
  e.draft_lag = s.num_computed - s.num_draft_computed;
  e.num_cached_tokens = s.just_admitted ? s.num_cached_tokens : 0;
  s.just_admitted = false;
  s.num_computed += num_new;
  KILN_CHECK(s.num_computed <= s.num_tokens() && s.table.num_tokens() == s.num_computed + num_lookahead);
  e.num_samples = s.num_computed == s.num_tokens() ? 1 + s.forks_pending : 0;
  KILN_CHECK(num_lookahead == 0 || e.num_samples == 1);
  e.tokens = s.tokens;
  e.block_ids = s.table.block_ids();
  out.num_batched_tokens += num_new + num_lookahead;
  out.num_sampled_tokens += e.num_samples;
  out.seqs.push_back(e);
}

void Scheduler::preempt(Sequence& s, SchedulerOutput& out) {
  kv_.free(s.table);
  s.num_computed = 0;
  s.num_draft_computed = 0;
  s.remote_prefill = false;  // recomputed here: its K/V (received or computed) is gone
  s.status = SeqStatus::kWaiting;
  ++s.num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(&s);
  out.preempted_seq_ids.push_back(s.id);
}

std::optional<int64_t> Scheduler::admit(Sequence& s, int64_t max_new, SchedulerOutput& out) {
  KILN_CHECK(s.num_computed == 0 && s.table.num_blocks() == 0);
  const std::vector<BlockId> hit = s.skip_prefix_cache || classic()
                                       ? std::vector<BlockId>{}
                                       : kv_.find_cached_prefix(s.tokens, s.block_hashes);
  const int64_t num_cached = static_cast<int64_t>(hit.size()) * kv_.config().block_size;
  const int64_t take = std::min(s.num_tokens() - num_cached, max_new);
  if (!kv_.allocate_slots(s.table, hit, take, out.block_copies)) return std::nullopt;
  kv_.record_prefix_query(s.num_tokens(), num_cached);
  s.num_computed = num_cached;
  s.num_draft_computed = 0;  // cached blocks may lack the draft's K/V: it recomputes them
  s.num_cached_tokens = num_cached;
  s.just_admitted = true;
  s.status = SeqStatus::kRunning;
  waiting_.pop_front();
  running_.push_back(&s);
  return take;
}

SchedulerOutput Scheduler::schedule() {
  KILN_CHECK_MSG(!awaiting_update_, "schedule() twice without update()");
  SchedulerOutput out;
  out.step = step_++;
  out.finished_seq_ids.swap(finished_since_step_);
  awaiting_update_ = true;

  if (config_.batching != BatchingMode::kContinuous && running_.empty()) {
    retire_padding();  // the last batch's rows, when it ended without an update (aborts)
    admit_batch(out);
    if (classic()) add_prompt_padding();
  }
  // Classic batching prefills the whole padded batch first: no member decodes while another
  // has prompt (or pads) left (the literature's batch runs one padded prefill, then decodes in
  // lockstep).
  const bool batch_prefilling =
      classic() &&
      (std::any_of(running_.begin(), running_.end(), [](const Sequence* s) { return s->num_tokens() - s->num_computed > 1; }) ||
       std::any_of(padding_.begin(), padding_.end(), [](const auto& p) { return is_prompt_pad(*p); }));

  int64_t budget = config_.max_batched_tokens;
  auto needs_one = [](const Sequence* s) { return !s->awaiting_remote && s->num_tokens() - s->num_computed == 1; };
  // Decodes not yet visited: a prefill chunk leaves one token of budget for each.
  auto pending_decodes =
      batch_prefilling ? 0 : static_cast<int64_t>(std::count_if(running_.begin(), running_.end(), needs_one));
  const bool speculate = config_.num_lookahead > 0 &&
                         (config_.lookahead_max_batch == 0 || pending_decodes <= config_.lookahead_max_batch);
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& s = *running_[i];
    if (s.awaiting_remote) continue;  // its K/V is in transfer
    const int64_t remaining = s.num_tokens() - s.num_computed;
    KILN_CHECK(remaining >= 1);
    const bool decode = remaining == 1;
    if (decode && batch_prefilling) continue;  // waits for the batch's prefill
    if (decode) --pending_decodes;
    const int64_t take =
        decode ? 1 : std::min({remaining, config_.prefill_chunk, budget - pending_decodes});
    if (take <= 0) continue;
    // Speculative decoding: room for draft tokens, never past max_tokens (a step emits at most
    // lookahead + 1) nor into the budget of the decodes still to come; not for the first
    // sample of n > 1 (it forks).
    const int64_t lookahead =
        speculate && decode && s.forks_pending == 0 ? std::max<int64_t>(0, std::min({config_.num_lookahead, s.max_tokens - s.num_outputs() - 1,
                                                budget - 1 - pending_decodes}))
               : 0;
    bool self_preempted = false;
    while (!kv_.allocate_slots(s.table, {}, take + lookahead, out.block_copies)) {
      // Recompute-mode preemption of the newest running sequence (never one already
      // scheduled in this step: those are older than s), skipping those whose K/V is in
      // transfer (their blocks are being written); s itself is never awaiting.
      auto newest = std::find_if(running_.rbegin(), running_.rend(), [](const Sequence* r) { return !r->awaiting_remote; });
      Sequence* victim = *newest;
      running_.erase(std::next(newest).base());
      if (victim != &s && needs_one(victim)) --pending_decodes;
      preempt(*victim, out);
      preempted = true;
      if (victim == &s) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // s was the last running sequence
    schedule_seq(s, take, lookahead, out);
    budget -= take + lookahead;
  }
  if (classic()) schedule_padding(batch_prefilling, budget, out);

  // Continuous batching: admit FCFS while there is budget, room and memory; not in a step
  // that had to preempt (the memory is not there).
  if (config_.batching == BatchingMode::kContinuous && !preempted) {
    while (!waiting_.empty() && budget > 0 && num_running() < config_.max_running) {
      Sequence& s = *waiting_.front();
      if (s.remote_prefill) {  // blocks for its first prompt_len - 1 tokens; no compute in this step
        if (!kv_.allocate_slots(s.table, {}, s.prompt_len - 1, out.block_copies)) break;
        waiting_.pop_front();
        running_.push_back(&s);
        s.status = SeqStatus::kRunning;
        s.num_computed = s.prompt_len - 1;
        s.num_cached_tokens = 0;
        s.awaiting_remote = true;
        out.remote_admitted_seq_ids.push_back(s.id);
        continue;
      }
      auto take = admit(s, std::min(config_.prefill_chunk, budget), out);
      if (!take) break;
      schedule_seq(s, *take, 0, out);
      budget -= *take;
    }
  }
  KILN_CHECK(out.num_batched_tokens <= config_.max_batched_tokens);
  return out;
}

void Scheduler::admit_batch(SchedulerOutput& out) {
  // Static: as many as max_running and the blocks of their cached prefixes allow; prefilled by
  // the running loop. Classic: also only while the blocks of every member's whole length
  // (prompt + max_tokens - 1 tokens, times n) and of the pads up to the longest prompt fit in
  // the pool, so the batch never preempts; the head of the queue always goes (add_request saw
  // one sequence of it fit, and alone it has no pads).
  int64_t member_blocks = 0, longest = 0;
  while (!waiting_.empty() && num_running() < config_.max_running) {
    Sequence& s = *waiting_.front();
    if (classic()) {
      const int64_t blocks = member_blocks + (1 + s.forks_pending) * kv_.blocks_for(s.prompt_len + s.max_tokens - 1);
      const int64_t longer = std::max(longest, s.prompt_len);
      int64_t pad_blocks = kv_.blocks_for(longer - s.prompt_len);
      for (const Sequence* m : running_) pad_blocks += kv_.blocks_for(longer - m->prompt_len);
      if (!running_.empty() && blocks + pad_blocks > kv_.pool().num_blocks()) break;
      member_blocks = blocks;
      longest = longer;
    }
    if (!admit(s, 0, out)) break;
  }
}

Sequence& Scheduler::add_padding_row() {
  auto row = std::make_unique<Sequence>(next_id_++, -1, kv_.config().block_size);
  row->status = SeqStatus::kRunning;
  return *padding_.emplace_back(std::move(row));
}

void Scheduler::add_prompt_padding() {
  int64_t longest = 0;
  for (const Sequence* m : running_) longest = std::max(longest, m->prompt_len);
  for (const Sequence* m : running_) {
    if (m->prompt_len == longest) continue;
    // Pad tokens (id 0) in blocks of their own: the same rows of every GEMM as left padding,
    // attention over the pads alone (a lower bound of a masked rectangle's cost).
    add_padding_row().tokens.assign(static_cast<size_t>(longest - m->prompt_len), 0);
  }
}

void Scheduler::schedule_padding(bool batch_prefilling, int64_t& budget, SchedulerOutput& out) {
  for (const auto& p : padding_) {
    if (budget <= 0) break;
    const bool prefill = is_prompt_pad(*p);  // retired once computed; else a finished member's row
    if (!prefill && batch_prefilling) continue;  // a finished member's row waits like the members
    ScheduledSeq e;
    e.seq_id = p->id;
    e.request_id = -1;
    e.padding = true;
    if (prefill) {
      const int64_t take = std::min({p->num_tokens() - p->num_computed, config_.prefill_chunk, budget});
      KILN_CHECK_MSG(kv_.allocate_slots(p->table, {}, take, out.block_copies),
                     "classic batching reserved the pads' blocks at admission");
      e.num_computed_tokens = p->num_computed;
      e.num_new_tokens = take;
      p->num_computed += take;
    } else {
      // Recomputes its last position into its own slot: a decode row's work, no new block.
      e.num_computed_tokens = p->num_computed - 1;
      e.num_new_tokens = 1;
    }
    e.tokens = p->tokens;
    e.block_ids = p->table.block_ids();
    budget -= e.num_new_tokens;
    out.num_batched_tokens += e.num_new_tokens;
    out.seqs.push_back(e);
  }
}

void Scheduler::retire_padding() {
  // Pads whose prefill is done go at once; finished members' rows when the batch is over.
  const bool batch_over = running_.empty();
  std::erase_if(padding_, [&](std::unique_ptr<Sequence>& p) {
    const bool done = batch_over || (is_prompt_pad(*p) && p->num_computed == p->num_tokens());
    if (done) kv_.free(p->table);
    return done;
  });
}

void Scheduler::finish(Sequence& s, FinishReason reason, UpdateResult* result) {
  // Its row stays in the padded batch, recomputing its last position into its own slot: its
  // blocks go with it, freed when the batch ends. (Not where that slot's block is shared with a
  // sibling sample, which may be reading it: a sample of n > 1 that ended at its first token.)
  const int64_t last = s.num_computed - 1;
  if (classic() && result != nullptr && last >= 0 &&
      kv_.pool().ref_count(s.table.block(last / s.table.block_size())) == 1) {
    Sequence& row = add_padding_row();
    row.tokens = s.tokens;
    row.prompt_len = s.prompt_len;
    row.num_computed = s.num_computed;
    std::swap(row.table, s.table);
  }
  kv_.free(s.table);
  s.status = SeqStatus::kFinished;
  s.finish = reason;
  if (result) {
    FinishedSeq f;
    f.seq_id = s.id;
    f.request_id = s.request_id;
    f.reason = reason;
    f.output_tokens.assign(s.tokens.begin() + s.prompt_len, s.tokens.end());
    f.num_cached_tokens = s.num_cached_tokens;
    f.num_preemptions = s.num_preemptions;
    result->finished.push_back(std::move(f));
  }
  finished_since_step_.push_back(s.id);
}

void Scheduler::append_token(Sequence& s, int32_t token, UpdateResult& result) {
  s.tokens.push_back(token);
  const bool stop =
      std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), token) != s.stop_token_ids.end();
  if (stop)
    finish(s, FinishReason::kStop, &result);
  else if (s.num_outputs() >= s.max_tokens)
    finish(s, FinishReason::kLength, &result);
}

UpdateResult Scheduler::update(const SchedulerOutput& output, std::span<const int32_t> sampled,
                               std::span<const int64_t> counts) {
  KILN_CHECK_MSG(awaiting_update_ && output.step == step_ - 1, "update() of step {} after step {}",
                 output.step, step_ - 1);
  KILN_CHECK_MSG(counts.empty() || counts.size() == output.seqs.size(),
                 "update() got {} counts for {} sequences", counts.size(), output.seqs.size());
  int64_t expected = 0;
  for (size_t k = 0; k < output.seqs.size(); ++k) {
    const ScheduledSeq& e = output.seqs[k];
    if (e.num_lookahead == 0) {
      expected += e.num_samples;
      continue;
    }
    KILN_CHECK_MSG(!counts.empty() && counts[k] >= 1 && counts[k] <= e.num_lookahead + 1,
                   "update(): sequence {} verified {} draft slots but got {} tokens", e.seq_id,
                   e.num_lookahead, counts.empty() ? 0 : counts[k]);
    expected += counts[k];
  }
  KILN_CHECK_MSG(static_cast<int64_t>(sampled.size()) == expected,
                 "update() got {} sampled tokens, the step expects {}", sampled.size(), expected);
  awaiting_update_ = false;
  UpdateResult result;
  size_t k = 0;
  for (size_t i = 0; i < output.seqs.size(); ++i) {
    const ScheduledSeq& e = output.seqs[i];
    const int64_t count = e.num_lookahead > 0 ? counts[i] : e.num_samples;
    const std::span<const int32_t> toks = sampled.subspan(k, static_cast<size_t>(count));
    k += toks.size();
    if (e.padding) continue;  // computed, never read
    auto it = seqs_.find(e.seq_id);
    KILN_CHECK_MSG(it != seqs_.end() && it->second->status == SeqStatus::kRunning,
                   "update() of sequence {} that is not running", e.seq_id);
    Sequence& s = *it->second;
    if (e.num_lookahead > 0) {
      // Speculative decode: the accepted draft tokens have K/V from this step's verification;
      // the slots of the rejected ones go back to the pool; the last token is the target's.
      const int64_t accepted = count - 1;
      for (int64_t j = 0; j < accepted && s.status == SeqStatus::kRunning; ++j) append_token(s, toks[j], result);
      if (s.status != SeqStatus::kRunning) continue;  // a stop token among the draft's
      s.num_computed += accepted;
      // The draft computed K/V up to the last draft token, exclusive: when all were accepted,
      // it misses that one.
      s.num_draft_computed = std::min(s.num_computed, e.num_computed_tokens + e.num_lookahead);
      kv_.truncate(s.table, s.num_computed);
      kv_.cache_full_blocks(s.table, s.tokens, s.block_hashes);
      append_token(s, toks[static_cast<size_t>(accepted)], result);
      continue;
    }
    if (!classic()) kv_.cache_full_blocks(s.table, s.tokens, s.block_hashes);  // their K/V now exists
    if (toks.empty()) continue;
    // Parallel sampling: the other n - 1 sequences share every block of the prompt.
    for (size_t j = 1; j < toks.size(); ++j) {
      const int64_t id = next_id_++;
      auto child = std::make_unique<Sequence>(id, s.request_id, kv_.config().block_size);
      child->tokens = s.tokens;
      child->prompt_len = s.prompt_len;
      child->max_tokens = s.max_tokens;
      child->stop_token_ids = s.stop_token_ids;
      child->num_computed = s.num_computed;
      child->num_draft_computed = s.num_draft_computed;
      child->num_cached_tokens = s.num_cached_tokens;
      child->status = SeqStatus::kRunning;
      child->block_hashes = s.block_hashes;
      kv_.fork(s.table, child->table);
      Sequence& c = *child;
      seqs_.emplace(id, std::move(child));
      running_.push_back(&c);
      result.forked.emplace_back(s.id, id);
      append_token(c, toks[j], result);
    }
    s.forks_pending = 0;
    append_token(s, toks[0], result);
  }
  // Retire what finished.
  std::erase_if(running_, [](const Sequence* s) { return s->status == SeqStatus::kFinished; });
  for (const FinishedSeq& f : result.finished) seqs_.erase(f.seq_id);
  retire_padding();
  return result;
}

bool Scheduler::remote_prefilled(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || !it->second->awaiting_remote) return false;
  it->second->awaiting_remote = false;
  it->second->just_admitted = true;
  return true;
}

void Scheduler::prefill_locally(int64_t seq_id) {
  KILN_CHECK_MSG(!awaiting_update_, "prefill_locally() between schedule() and update()");
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || !it->second->awaiting_remote) return;
  Sequence& s = *it->second;
  kv_.free(s.table);
  s.num_computed = 0;
  s.awaiting_remote = s.remote_prefill = false;
  s.status = SeqStatus::kWaiting;
  std::erase(running_, &s);
  waiting_.push_front(&s);
}

std::vector<int64_t> Scheduler::fail_step(const SchedulerOutput& output) {
  KILN_CHECK_MSG(awaiting_update_ && output.step == step_ - 1, "fail_step() of step {} after step {}", output.step,
                 step_ - 1);
  awaiting_update_ = false;
  std::vector<int64_t> ids;
  for (const ScheduledSeq& e : output.seqs)
    if (!e.padding) ids.push_back(e.request_id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (const int64_t id : ids) abort_request(id);
  return ids;
}

bool Scheduler::abort_sequence(int64_t seq_id) {
  KILN_CHECK_MSG(!awaiting_update_, "abort_sequence() between schedule() and update()");
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || it->second->forks_pending > 0) return false;
  Sequence* s = it->second.get();
  finish(*s, FinishReason::kAborted, nullptr);
  std::erase(running_, s);
  std::erase(waiting_, s);
  seqs_.erase(it);
  retire_padding();
  return true;
}

void Scheduler::abort_request(int64_t request_id) {
  KILN_CHECK_MSG(!awaiting_update_, "abort_request() between schedule() and update()");
  std::vector<int64_t> ids;
  for (const auto& [id, s] : seqs_) {
    if (s->request_id == request_id) ids.push_back(id);
  }
  if (ids.empty()) return;
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) finish(*seqs_.at(id), FinishReason::kAborted, nullptr);
  auto gone = [](const Sequence* s) { return s->status == SeqStatus::kFinished; };
  std::erase_if(running_, gone);
  std::erase_if(waiting_, gone);
  for (int64_t id : ids) seqs_.erase(id);
  retire_padding();
}

}  // namespace kiln
