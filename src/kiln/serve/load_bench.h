// The serving load benchmark (`kiln bench serve`): Poisson arrivals of streamed OpenAI
// completions against any compatible server, timed per token (TTFT, TPOT, ITL), summarized as
// throughput, percentiles and goodput under latency SLOs. The pieces are testable alone:
// arrivals, prompts, the SSE parser, percentiles and the summary.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/core/rng.h"
#include "kiln/core/status.h"

namespace kiln {

enum class LoadEndpoint { kCompletions, kChat };

// How prompt or output lengths are drawn; every draw is then clamped to the range [min, max]
// (--prompt-len / --output-len A:B). Uniform: every integer of the range equally likely.
enum class LengthDistKind { kUniform, kExponential, kLognormal };
struct LengthDist {
  LengthDistKind kind = LengthDistKind::kUniform;
  double mean = 0;              // exponential: the mean, in tokens
  double mu = 0, sigma = 0;     // lognormal: of ln(tokens)
};
// "uniform", "exponential:MEAN" or "lognormal:MU,SIGMA"; errors name `flag`.
Expected<LengthDist> parse_length_dist(std::string_view flag, std::string_view spec);
std::string describe(const LengthDist& d);
// One draw (rounded to the nearest integer), clamped to [min, max].
int64_t sample_length(const LengthDist& d, int64_t min, int64_t max, Rng& rng);

struct LoadBenchOptions {
  std::string url = "http://127.0.0.1:8000";  // base URL; "/v1/completions" is appended
  int64_t num_requests = 100;
  double rate = std::numeric_limits<double>::infinity();  // requests/s; inf: all at time 0
  int64_t prompt_min = 64, prompt_max = 512;              // prompt length in tokens (approximate)
  int64_t output_min = 64, output_max = 256;              // max_tokens, uniform in the range
  LengthDist prompt_dist, output_dist;                    // --prompt-dist, --output-dist (clamped to the ranges)
  int64_t shared_prefix = 0;                              // first K words identical in every prompt
  std::string model;                                      // empty: the first of GET /v1/models
  double slo_ttft_ms = 0;                                 // 0: no SLO
  double slo_tpot_ms = 0;
  uint64_t seed = 0;
  LoadEndpoint endpoint = LoadEndpoint::kCompletions;
  int64_t max_concurrency = 0;  // client threads; 0: one per request (arrivals never wait)
  bool ignore_eos = false;      // send the vLLM / llama.cpp extension "ignore_eos": true
  double temperature = -1;      // sent when >= 0 (else the server's default)
  std::string api_key;          // sent as "Authorization: Bearer KEY" when set
  double timeout_s = 600;       // per-request read timeout
};

Status check_options(const LoadBenchOptions& o);

// Preset workloads (--mix): "chat" — prompts uniform 64–1,024, outputs lognormal with mean
// ≈ 200 and a tail clamped at 2,048 (kChatOutput); "rag" — prompts of 1,100–1,400 tokens whose
// first 1,024 are shared, outputs 16–64. Sets the lengths, distributions and shared prefix of
// `o` (flags given beside --mix are applied after it and win).
Status apply_mix(std::string_view name, LoadBenchOptions& o);
// ln N(4.71, 1.1) clamped to [8, 2048]: mean 200 (computed from the normal CDF), median 111,
// p99 ≈ 1,440; about 0.4% of draws hit the 2,048 clamp.
inline constexpr LengthDist kChatOutput{LengthDistKind::kLognormal, 0, 4.71, 1.1};

// ---- request generation ------------------------------------------------------------------

// Arrival times (seconds from the start) of n requests at `rate` per second: the first at 0,
// then exponential gaps of mean 1/rate (a Poisson process); all 0 when rate is infinite.
std::vector<double> poisson_arrivals(int64_t n, double rate, Rng& rng);

// Prompts are words drawn from a fixed list of common English words. A byte-level BPE trained
// on English (GPT-2's, Llama's, kiln's on the KJV) encodes each of these words with its leading
// space as one token, so a prompt of N words is about N tokens: the approximation `kiln bench
// serve` makes (measured: 512 words -> 514 tokens with kiln's 4096-token KJV tokenizer). Servers
// that return "usage" report the true counts, and the summary uses them.
std::string_view prompt_word(size_t i);
size_t num_prompt_words();
// `words` words; the first `shared` come from a fixed sequence (the same in every prompt).
std::string make_prompt(int64_t words, int64_t shared, Rng& rng);

struct BenchRequest {
  int64_t id = 0;
  double arrival_s = 0;
  std::string prompt;
  int64_t prompt_words = 0;  // ≈ prompt tokens
  int64_t max_tokens = 0;
};

// The whole workload from the options (seeded: the same seed gives the same requests).
std::vector<BenchRequest> make_requests(const LoadBenchOptions& o);

// The JSON body of one streamed request.
nlohmann::json request_body(const BenchRequest& r, const LoadBenchOptions& o);

// ---- the response stream -----------------------------------------------------------------

// Incremental Server-Sent Events parser: feed bytes as they arrive, in any split; each complete
// event's data (its "data:" lines joined by '\n') comes out once its blank line arrives.
// Comments (":...") and other fields (event:, id:, retry:) are skipped; CRLF is accepted.
class SseParser {
 public:
  // Appends the data of the events completed by `bytes` to `events`.
  void feed(std::string_view bytes, std::vector<std::string>& events);
  // End of stream: an event left without its blank line is still delivered.
  void finish(std::vector<std::string>& events);

 private:
  void line(std::string_view l, std::vector<std::string>& events);
  std::string pending_;  // bytes after the last '\n'
  std::string data_;     // data of the event being read
  bool has_data_ = false;
};

// What one streamed chunk carried.
struct StreamChunk {
  bool done = false;            // "data: [DONE]"
  std::string text;             // choices[0].text or choices[0].delta.content
  std::string error;            // an "error" object in the stream, or unparsable JSON
  int64_t completion_tokens = -1;  // from "usage" when present
  int64_t prompt_tokens = -1;
};
StreamChunk parse_stream_chunk(std::string_view data);

// ---- results and statistics --------------------------------------------------------------

struct RequestResult {
  int64_t id = 0;
  bool ok = false;
  std::string error;       // HTTP status and body, connection error, or a stream error
  double start_s = 0;      // when it was sent (from the benchmark start)
  double ttft_s = 0;       // first token after send
  double latency_s = 0;    // last byte after send
  int64_t output_tokens = 0;  // usage.completion_tokens if sent, else the number of text chunks
  int64_t prompt_tokens = 0;  // usage.prompt_tokens if sent, else the word count
  std::vector<double> itl_s;  // gaps between successive text chunks
  double tpot_s() const;      // (last − first) / (tokens − 1); 0 with fewer than 2 tokens
};

// Percentile q in [0, 100] with linear interpolation between closest ranks (numpy's default);
// `values` need not be sorted; 0 when empty.
double percentile(std::vector<double> values, double q);

struct Distribution {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  int64_t count = 0;
};
Distribution summarize_distribution(const std::vector<double>& values);

struct LoadBenchReport {
  int64_t num_requests = 0, num_completed = 0, num_failed = 0;
  // Token counts of the completed requests (usage when the server sends it) and, when filled
  // by run_load_bench, the workload as requested (prompt words, max_tokens) of every request.
  Distribution prompt_len, output_len, requested_prompt_len, requested_output_len;
  double duration_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double request_throughput = 0;  // completed requests/s
  double output_throughput = 0;   // output tokens/s
  double total_throughput = 0;    // (prompt + output) tokens/s
  double goodput = 0;             // completed requests/s meeting both SLOs (an unset SLO always holds)
  int64_t num_good = 0;
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, latency_ms;
  std::vector<std::pair<int64_t, std::string>> failures;  // request id, error
};

LoadBenchReport summarize(const std::vector<RequestResult>& results, double duration_s, double slo_ttft_ms,
                          double slo_tpot_ms);
// The requested lengths of a workload into a report (requested_prompt_len, requested_output_len).
void add_requested_lengths(const std::vector<BenchRequest>& requests, LoadBenchReport& r);
nlohmann::json to_json(const LoadBenchReport& r);
std::string format_report(const LoadBenchReport& r);

// ---- running it ----------------------------------------------------------------------------

// Sends every request at its arrival time from its own client thread (or a pool of
// max_concurrency), streams the answers and returns one result per request, in id order.
// Errors: bad options or URL. Failed requests are results, not errors.
Expected<std::vector<RequestResult>> run_load(const LoadBenchOptions& o, const std::vector<BenchRequest>& requests,
                                              double* duration_s);
// make_requests + run_load + summarize.
Expected<LoadBenchReport> run_load_bench(const LoadBenchOptions& o);

}  // namespace kiln
