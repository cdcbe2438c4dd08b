// The serving scheduler: continuous batching under a per-step token budget (running decodes
// first, then prefill chunks), chunked prefill, an FCFS waiting queue, max-running, and
// preemption by recompute when the KV cache has no free block; static and classic padded static
// batching for comparison.
// Bookkeeping only: SchedulerOutput is the whole interface to the executor, which computes the
// scheduled tokens, samples, and hands the sampled tokens back to update().
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/serve/block_table.h"
#include "kiln/serve/kv_cache_manager.h"

namespace kiln {

enum class BatchingMode {
  kContinuous,  // admit and retire requests before every step
  kStatic,      // admit a batch only when the previous one has completely finished
  // Classic padded static batching (FasterTransformer, HF generate, pre-Orca servers): the batch
  // is one (B, T) rectangle. As kStatic, and: each member's K/V for prompt + max_tokens is
  // reserved at admission (a batch never preempts); every prompt is padded to the batch's
  // longest, and the whole padded batch is prefilled before any member decodes; then all B rows
  // decode in lockstep until the longest member is done: a finished member's row keeps being
  // computed as padding, and nobody joins. No prefix cache (those servers had none).
  kClassic,
};
// "continuous" | "static" | "classic"
std::optional<BatchingMode> parse_batching_mode(std::string_view name);
const char* batching_mode_name(BatchingMode m);

struct SchedulerConfig {
  int64_t max_batched_tokens = 2048;  // token budget of one step (--max-batched-tokens)
  int64_t prefill_chunk = 512;        // most prompt tokens one sequence computes in a step
  int64_t max_running = 64;           // sequences admitted at once (--max-running)
  BatchingMode batching = BatchingMode::kContinuous;
  // Speculative decoding (γ, --num-speculative): a decode also reserves slots for up to this
  // many draft tokens, which the target verifies in the same step; 0 = off.
  int64_t num_lookahead = 0;
  // No draft tokens in a step with more running decodes than this (0: no limit): a large
  // batch already fills the machine, and verifying γ extra rows per sequence costs more than
  // it saves (as vLLM's --speculative-disable-by-batch-size).
  int64_t lookahead_max_batch = 0;
};
// InvalidArgument naming the flag when a limit is not positive.
Status check_scheduler_config(const SchedulerConfig& config, const KvCacheConfig& kv);

struct Request {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  int64_t n = 1;                        // parallel samples sharing the prompt's blocks
  std::vector<int32_t> stop_token_ids;  // finish after sampling one of these
  bool skip_prefix_cache = false;       // compute every prompt position (its logits are wanted)
  // Disaggregated serving (serve/disaggregated.h): the K/V of every prompt token but the last
  // is computed elsewhere and written into this sequence's blocks; the sequence waits for it
  // (remote_prefilled) and then runs the last prompt token as its first step, which samples.
  bool remote_prefill = false;
};

enum class SeqStatus { kWaiting, kRunning, kFinished };
enum class FinishReason { kNone, kLength, kStop, kAborted, kError };  // kError: the engine failed it
const char* finish_reason_name(FinishReason r);

struct Sequence {
  Sequence(int64_t seq_id, int64_t req_id, int64_t block_size)
      : id(seq_id), request_id(req_id), table(block_size) {}

  int64_t id;
  int64_t request_id;
  std::vector<int32_t> tokens;  // prompt, then the sampled tokens
  int64_t prompt_len = 0;
  int64_t max_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  bool skip_prefix_cache = false;
  // Request::remote_prefill: admitted with the blocks of its first prompt_len - 1 tokens and
  // counted as computed, but not scheduled while awaiting_remote (their K/V is in transfer).
  // A preempted one recomputes here: remote_prefill is cleared.
  bool remote_prefill = false;
  bool awaiting_remote = false;
  int64_t num_computed = 0;       // tokens whose K/V is in the cache (or being computed now)
  int64_t num_cached_tokens = 0;  // prefix-cache hit at its last admission
  int64_t num_preemptions = 0;
  int64_t forks_pending = 0;   // n - 1 until the first token is sampled
  bool just_admitted = false;  // not scheduled since its last admission
  // Speculative decoding: tokens whose draft-model K/V is in the cache. The draft runs only in
  // speculating steps, so it lags (prefill, steps with too many decodes, the last draft token
  // when all were accepted) and catches up in the sequence's next speculating step.
  int64_t num_draft_computed = 0;
  SeqStatus status = SeqStatus::kWaiting;
  FinishReason finish = FinishReason::kNone;
  BlockTable table;
  std::vector<uint64_t> block_hashes;  // chained hash of each full block of tokens

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_outputs() const { return num_tokens() - prompt_len; }
};

// One sequence's share of a step. New tokens are tokens[num_computed_tokens,
// num_computed_tokens + num_new_tokens), at those positions, written to
// block_ids[p / block_size] * block_size + p % block_size.
struct ScheduledSeq {
  int64_t seq_id = 0;
  int64_t request_id = 0;
  int64_t num_computed_tokens = 0;  // K/V already cached for positions [0, this)
  int64_t num_new_tokens = 0;       // a prefill chunk, or 1 to decode
  // Tokens to sample from the logits of the last new token: 0 for a prefill chunk that does
  // not reach the end, 1 normally, n for the first sample of a request with n > 1.
  int64_t num_samples = 0;
  int64_t num_cached_tokens = 0;  // prefix-cache hit when admitted in this step, else 0
  // Speculative decoding (decodes only): slots reserved after the new token for up to this
  // many draft tokens, all verified by this step's target forward; update() then takes 1 to
  // num_lookahead + 1 tokens for the sequence. draft_lag: the draft model's K/V ends this
  // many tokens before num_computed_tokens (it recomputes them first).
  int64_t num_lookahead = 0;
  int64_t draft_lag = 0;
  // Classic batching's padding (request_id -1, num_samples 0): compute whose result nobody
  // reads — a prompt's pad tokens up to the batch's longest prompt, or a finished member's row
  // recomputing its last position while the batch's longest member still decodes.
  bool padding = false;
  // Valid until update(): the sequence's tokens and block table.
  std::span<const int32_t> tokens;
  std::span<const BlockId> block_ids;
};

struct SchedulerOutput {
  int64_t step = 0;
  std::vector<ScheduledSeq> seqs;
  std::vector<BlockCopy> block_copies;     // do these first (copy-on-write)
  std::vector<int64_t> preempted_seq_ids;  // blocks freed; recomputed later
  std::vector<int64_t> finished_seq_ids;   // finished or aborted since the last step
  // Remote-prefill sequences admitted in this step: their blocks for positions
  // [0, prompt_len - 1) are allocated; the engine starts their transfer.
  std::vector<int64_t> remote_admitted_seq_ids;
  int64_t num_batched_tokens = 0;          // sum of num_new_tokens <= max_batched_tokens
  int64_t num_sampled_tokens = 0;          // sum of num_samples (one per speculative decode)
  bool empty() const { return seqs.empty(); }
};

struct FinishedSeq {
  int64_t seq_id = 0;
  int64_t request_id = 0;
  FinishReason reason = FinishReason::kNone;
  std::vector<int32_t> output_tokens;
  int64_t num_cached_tokens = 0;
  int64_t num_preemptions = 0;
};

struct UpdateResult {
  std::vector<FinishedSeq> finished;
  std::vector<std::pair<int64_t, int64_t>> forked;  // (parent seq id, new seq id)
};

class Scheduler {
 public:
  static Expected<std::unique_ptr<Scheduler>> create(const SchedulerConfig& config,
                                                     const KvCacheConfig& kv);

  // Queues a request (FCFS) and returns its id (also the id of its first sequence).
  // InvalidArgument for an empty prompt, max_tokens < 1 or n < 1; ResourceExhausted when one
  // sequence of it could never fit in the whole KV cache.
  Expected<int64_t> add_request(Request request);
  // Frees every sequence of the request (e.g. the client went away). Between steps only
  // (not between schedule() and update(), while the executor reads the sequences).
  void abort_request(int64_t request_id);
  // Frees one sequence of a request (a sample of n > 1 ended by a stop string) while its
  // siblings go on. False (nothing done) when it is unknown or will still fork the others.
  bool abort_sequence(int64_t seq_id);

  // The next step. Must be followed by update() before the next schedule().
  SchedulerOutput schedule();
  // sampled: the tokens of output.seqs in order, num_samples each, except that a sequence with
  // num_lookahead > 0 has counts[k] of them (1 to num_lookahead + 1: the accepted draft tokens,
  // then the target's own). counts (one per output.seqs entry) may be empty without lookahead.
  UpdateResult update(const SchedulerOutput& output, std::span<const int32_t> sampled,
                      std::span<const int64_t> counts = {});
  // Instead of update(), when the step's execution failed: every request with a sequence in
  // the step is aborted (its K/V for the step was never written, so nothing of it is cached)
  // and the next schedule() may follow. Returns those request ids, sorted.
  std::vector<int64_t> fail_step(const SchedulerOutput& output);
  bool awaiting_update() const { return awaiting_update_; }
  // A remote-prefill sequence's K/V has arrived: from the next step it runs its last prompt
  // token. False when the sequence is unknown or was not waiting (aborted meanwhile).
  bool remote_prefilled(int64_t seq_id);
  // A remote-prefill sequence no worker took: back to the front of the waiting queue, its
  // blocks freed, to be prefilled here. Between steps only.
  void prefill_locally(int64_t seq_id);

  bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }
  // Classic batching's padding rows of the current batch (prompt pads, finished members).
  int64_t num_padding_rows() const { return static_cast<int64_t>(padding_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_steps() const { return step_; }
  int64_t num_preemptions() const { return num_preemptions_; }
  const Sequence* find_sequence(int64_t seq_id) const;
  const SchedulerConfig& config() const { return config_; }
  const KvCacheManager& kv() const { return kv_; }
  KvCacheStats kv_stats() const { return kv_.stats(); }

 private:
  Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv);
  void schedule_seq(Sequence& s, int64_t num_new, int64_t num_lookahead, SchedulerOutput& out);
  void preempt(Sequence& s, SchedulerOutput& out);
  // Moves the head of the waiting queue to running: takes its longest cached prefix and
  // reserves up to max_new more tokens (0: only the prefix). Returns the tokens reserved, or
  // nullopt (nothing changed) when the pool has too few blocks.
  std::optional<int64_t> admit(Sequence& s, int64_t max_new, SchedulerOutput& out);
  // Static and classic batching: a new batch from the head of the waiting queue.
  void admit_batch(SchedulerOutput& out);
  void append_token(Sequence& s, int32_t token, UpdateResult& result);
  void finish(Sequence& s, FinishReason reason, UpdateResult* result);
  // Classic batching's padding: a pad row for each member shorter than the batch's longest
  // prompt; this step's pad prefill chunks and padding decodes; freeing what the step finished
  // and, once no member runs, the whole batch's padding.
  Sequence& add_padding_row();  // running, no request; its tokens and blocks are the caller's
  void add_prompt_padding();
  // A prompt's pad row (prompt_len 0, all of it prefill) rather than a finished member's row.
  static bool is_prompt_pad(const Sequence& s) { return s.prompt_len == 0; }
  void schedule_padding(bool batch_prefilling, int64_t& budget, SchedulerOutput& out);
  void retire_padding();

  bool classic() const { return config_.batching == BatchingMode::kClassic; }
  SchedulerConfig config_;
  KvCacheManager kv_;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> seqs_;  // unfinished sequences
  std::deque<Sequence*> waiting_;   // FCFS; preempted sequences go back to the front
  std::vector<Sequence*> running_;  // admission order: the back is the newest
  // Classic batching: pad rows still prefilling (prompt_len = 0) and finished members' rows
  // (prompt_len > 0), holding their blocks until the batch ends.
  std::vector<std::unique_ptr<Sequence>> padding_;
  std::vector<int64_t> finished_since_step_;
  int64_t next_id_ = 0;
  int64_t step_ = 0;
  int64_t num_preemptions_ = 0;
  bool awaiting_update_ = false;
};

}  // namespace kiln
