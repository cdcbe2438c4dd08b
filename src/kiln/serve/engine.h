// The serving engine: owns the model, the paged KV cache (bookkeeping and data), the scheduler
// and the sampler, and runs steps in a background loop. Requests come in as token ids with
// sampling parameters and go out as a stream of sampled tokens; metrics for /metrics.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/core/status.h"
#include "kiln/model/transformer.h"
#include "kiln/serve/model_executor.h"
#include "kiln/serve/remote_prefill.h"
#include "kiln/serve/sampler.h"
#include "kiln/serve/scheduler.h"
#include "kiln/serve/speculative.h"

namespace kiln {

struct EngineConfig {
  int64_t kv_cache_mem_bytes = int64_t{256} << 20;  // --kv-cache-mem
  int64_t block_size = kDefaultKvBlockSize;          // --block-size
  bool enable_prefix_caching = true;
  // Pack every fp32 Linear weight once (model/packed_linear.h) instead of per GEMM call;
  // Linears that already have a backend (quantized, bf16) are left alone. --no-packed-weights
  bool packed_weights = true;
  SchedulerConfig scheduler;  // --max-batched-tokens, --prefill-chunk, --max-running, --batching
  // Speculative decoding with a draft model: draft tokens per decode step (γ).
  int64_t num_speculative = 4;  // --num-speculative
  // Speculate only while at most this many sequences decode (0: always); measured on the
  // 2-core dev VM with w2-s + llama-tiny: 1.5-2x faster with 1 decode, slower from 4.
  int64_t speculative_max_batch = 2;  // --speculative-max-batch
  // Disaggregated serving (--disaggregate): prompts are prefilled there, not here (requests
  // with prompt logprobs excepted: their logits are needed here). Not owned; outlives the engine.
  RemotePrefill* remote_prefill = nullptr;
  // Decode steps replay captured graphs, one per batch size (serve/decode_graph.h). --graph capture
  bool graph_capture = false;
  // Run on each captured graph before it is planned (--graph fused: perf/graph_fusion.h).
  graph::GraphPass graph_pass;
};

inline constexpr int64_t kMaxParallelSamples = 64;  // the largest n one request may ask for

inline constexpr int64_t kMaxLogprobs = 20;        // the most alternatives one position may report

struct GenerationParams {
  int64_t n = 1;
  int64_t max_tokens = 16;
  SamplingParams sampling;              // temperature (0: greedy), top_k, top_p
  LogitAdjust adjust;                   // logit_bias, frequency and presence penalties
  std::optional<uint64_t> seed;         // none: a fresh seed per request
  std::vector<int32_t> stop_token_ids;  // finish after sampling one of these (it is emitted)
  // Log-probabilities to report. They are the model's own distribution: the log-softmax, in
  // double over the whole vocabulary, of the raw logits, before logit_bias, penalties,
  // temperature, top-k and top-p. That is vLLM's default (logprobs_mode "raw_logprobs"; its v1
  // sampler changed to it from v0's processed logits); OpenAI documents no choice. So a token's
  // logprob does not depend on how it was sampled, and an echoed prompt's logprobs are the
  // model's per-token loss (what lm-evaluation-harness scores with).
  int64_t num_logprobs = -1;     // -1: none; k in [0, kMaxLogprobs]: each sampled token's and the k most likely
  bool prompt_logprobs = false;  // also every prompt token's from the second on (echo), same k
};

// The log-probability of one token at one position and the most likely tokens there.
struct LogprobEntry {
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // (num_logprobs,) most likely first
};

// One event of a request's stream: sample `index` got `token` (-1: none) and, when finish is
// not kNone, that sample is done. logprobs: set for a token of a request that asked for them.
struct TokenEvent {
  int64_t index = 0;
  int32_t token = -1;
  FinishReason finish = FinishReason::kNone;
  std::optional<LogprobEntry> logprobs;
};

// The consumer side of a request: thread-safe; the engine pushes, one reader waits.
class RequestStream {
 public:
  RequestStream(int64_t id, int64_t n, int64_t prompt_len) : id_(id), n_(n), prompt_len_(prompt_len) {}
  int64_t id() const { return id_; }
  int64_t n() const { return n_; }
  int64_t prompt_len() const { return prompt_len_; }
  // Waits up to `timeout` for events and moves them to `out`. Returns false when the stream
  // has ended (every sample finished) and nothing is left to read.
  bool wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout);
  // Every sample has finished (its last events may still be unread).
  bool finished() const;

  // GenerationParams::prompt_logprobs: entry p is prompt token p's (entry 0, which has no
  // context, is empty). The engine sets them before the request's first token event.
  std::vector<LogprobEntry> prompt_logprobs() const;

  void push(const TokenEvent& e);  // engine side
  // Why the engine failed the request (samples that finished with kError); set before their
  // finish events are pushed.
  void set_error(std::string message);
  std::string error() const;
  void set_prompt_logprobs(std::vector<LogprobEntry> lp);

 private:
  const int64_t id_, n_, prompt_len_;
  std::string error_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  std::vector<LogprobEntry> prompt_logprobs_;
  int64_t num_finished_ = 0;
};

// Prometheus-style histogram with fixed upper bounds (seconds).
struct Histogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // per bound, not cumulative; the last is +Inf
  double sum = 0;
  int64_t count = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v);
};

struct EngineMetrics {
  int64_t num_running = 0, num_waiting = 0;
  BlockPoolStats kv_blocks;
  int64_t block_size = 0;
  int64_t kv_bytes_per_token = 0;  // 2 · layers · kv_heads · head_dim · 4 (f32), draft's included
  // The target's whole model (tp 1) with multi-head and grouped-query attention of its width
  // instead (mha_of_same_width, gqa_of_same_width): what its own figure is read against.
  int64_t kv_bytes_per_token_mha = 0, kv_bytes_per_token_gqa = 0;
  int64_t kv_cache_bytes = 0;      // the whole pool
  double prefix_cache_hit_rate = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t requests_added = 0, requests_finished = 0, requests_aborted = 0;
  int64_t requests_failed = 0;  // ended by an engine error (FinishReason::kError)
  int64_t prompt_tokens = 0;      // tokens computed by prefill (prefix hits excluded)
  int64_t padding_tokens = 0;     // of those, classic batching's padded rows (results unread)
  int64_t generation_tokens = 0;  // tokens sampled
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  // Speculative decoding (zero without a draft model): one target pass = one verification of
  // one sequence's draft tokens; num_generated counts the tokens those passes emitted.
  SpeculativeStats spec;
  int64_t num_speculative = 0;  // γ
  // Disaggregated serving: prompts prefilled remotely, K/V bytes received, and the time from
  // handing a prompt over to its last K/V row written here.
  RemotePrefill::Stats remote;
  Histogram kv_transfer{{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}};
  Histogram tpot{{0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5}};
};

class Engine {
 public:
  // Sizes the KV pool from config.kv_cache_mem_bytes; errors name the bad flag. With a draft
  // model (same vocabulary), decodes run speculatively: the draft proposes
  // config.num_speculative tokens, the target verifies them in the step's one forward, and
  // the rejection rule keeps each sample distributed as the target's alone (greedy: the same
  // tokens). The draft's K/V share the target's block tables (and the memory budget).
  static Expected<std::unique_ptr<Engine>> create(std::unique_ptr<Transformer> model, const EngineConfig& config,
                                                  std::unique_ptr<Transformer> draft = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The background loop (steps whenever there is work). Without it, call step() yourself.
  void start();
  void stop();

  // Queues a request. InvalidArgument for an empty prompt, ids outside the vocabulary, n or
  // max_tokens out of range, prompt + max_tokens beyond the context, bad sampling values,
  // logit adjustments or logprob counts;
  // ResourceExhausted when one sequence could never fit in the whole KV cache.
  Expected<std::shared_ptr<RequestStream>> add_request(std::vector<int32_t> prompt, const GenerationParams& params);
  // Frees every sequence of the request (the client went away); its stream ends (kAborted).
  void abort(int64_t request_id);
  // Ends one sample early (a stop string matched): its stream gets a last event with `reason`;
  // the request's sequences are freed once all its samples ended.
  void finish_sample(int64_t request_id, int64_t index, FinishReason reason = FinishReason::kStop);

  // Ends every request with FinishReason::kError and `message` (a server that drains on
  // SIGTERM); requests added later are served as usual.
  void fail_all(std::string message);
  // Fault injection: the next step's model execution fails with `status`, the path a real
  // execution error takes (its requests fail with the message; the engine goes on).
  void fail_next_step(Status status);

  // One step on the calling thread (only when the loop is not running). False when idle.
  bool step();
  // Steps until every request finished (tests; loop not running).
  void run_until_idle();

  EngineMetrics metrics() const;
  // Graph capture's counters (EngineConfig::graph_capture), null when decode runs eagerly. Read
  // it while no step runs (after generate(), or from the engine's thread).
  const GraphStats* graph_stats() const { return executor_.graph_stats(); }
  // Prometheus text exposition of metrics(), names prefixed kiln_.
  std::string metrics_text() const;
  const ModelConfig& model_config() const { return model_->config(); }
  // The longest prompt + max_tokens a request may have (the smaller context with a draft).
  int64_t context_len() const;
  bool speculative() const { return draft_ != nullptr; }
  const EngineConfig& config() const { return config_; }
  int64_t num_kv_blocks() const { return num_blocks_; }
  Transformer& model() { return *model_; }

 private:
  Engine(std::unique_ptr<Transformer> model, std::unique_ptr<Transformer> draft, const EngineConfig& config,
         int64_t num_blocks, std::unique_ptr<Scheduler> scheduler);
  struct Command;
  struct RequestState;
  void loop();
  void apply_commands();
  bool step_locked_out();  // one step; scheduler state touched by one thread only
  Status run_step(const SchedulerOutput& out);  // execute, sample, update: after schedule()
  void end_request(int64_t id, RequestState& r, FinishReason reason);
  // Aborts the requests in the scheduler and ends their streams with kError and `message`.
  void fail_requests(const std::vector<int64_t>& request_ids, const std::string& message);
  void fail_every_request(const std::string& message);
  void refresh_gauges();  // running/waiting, KV blocks, prefix cache, preemptions
  // Disaggregated serving: writes the K/V that arrived, readies completed sequences, fails the
  // requests whose prefill failed (before schedule()); hands this step's remote admissions over
  // (after update()).
  void poll_remote();
  void submit_remote(const SchedulerOutput& out);
  void cancel_remote(const RequestState& r);

  std::unique_ptr<Transformer> model_;
  std::unique_ptr<Transformer> draft_;  // null: no speculative decoding
  EngineConfig config_;
  int64_t num_blocks_ = 0;
  std::unique_ptr<Scheduler> scheduler_;
  ModelExecutor executor_;

  // Commands from other threads, applied between steps.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Command> commands_;
  int64_t next_request_id_ = 0;
  uint64_t seed_counter_ = 0x5eed;
  bool stopping_ = false;
  std::optional<Status> injected_failure_;  // fail_next_step
  std::thread thread_;

  // Loop-thread state.
  std::unordered_map<int64_t, std::unique_ptr<RequestState>> requests_;  // engine id -> state
  std::unordered_map<int64_t, int64_t> sched_to_request_;                // scheduler request id -> engine id
  std::unordered_map<int64_t, int64_t> seq_index_;                       // seq id -> sample index
  std::vector<int32_t> sampled_;
  std::vector<int64_t> counts_;      // per scheduled sequence: its tokens in sampled_
  std::vector<uint8_t> all_rows_;    // per scheduled sequence: 1 = logits of every new token (echo)
  std::unordered_map<int64_t, std::chrono::steady_clock::time_point> remote_started_;  // seq id -> handed over

  mutable std::mutex metrics_mu_;
  EngineMetrics metrics_;
};

}  // namespace kiln
