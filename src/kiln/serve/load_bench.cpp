// The serving load benchmark: workload generation, the streamed-request client (cpp-httplib, one
// thread per in-flight request), the SSE parser and the statistics (percentiles, goodput).
#include "kiln/serve/load_bench.h"

#include <httplib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "kiln/core/json.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Common English words (frequent in the KJV too): with a leading space each is one token in a
// byte-level BPE trained on English text.
constexpr std::array<std::string_view, 128> kWords = {
    "the",    "and",   "of",    "to",     "that",   "in",    "he",    "shall",  "unto",  "for",   "his",
    "they",   "be",    "is",    "him",    "not",    "them",  "it",    "with",   "all",   "thou",  "thy",
    "was",    "which", "my",    "me",     "said",   "but",   "ye",    "their",  "have",  "will",  "thee",
    "from",   "as",    "are",   "when",   "this",   "out",   "were",  "upon",   "by",    "you",   "up",
    "there",  "hath",  "then",  "had",    "into",   "on",    "her",   "come",   "one",   "we",    "before",
    "your",   "also",  "day",   "land",   "men",    "let",   "go",    "made",   "over",  "if",    "so",
    "people", "man",   "no",    "king",   "hand",   "house", "son",   "came",   "even",  "after", "do",
    "at",     "went",  "great", "every",  "things", "down",  "earth", "may",    "away",  "good",  "us",
    "our",    "should", "did",  "make",   "hear",   "these", "against", "say",   "heart", "name",  "father",
    "put",    "am",    "thus",  "life",   "now",    "give",  "place", "city",   "word",  "days",  "brought",
    "call",   "water", "way",   "years",  "know",   "law",   "peace", "light",  "fire",  "see",   "long",
    "little", "take",  "set",   "time",   "first",  "two",   "old",
};

// The shared prefix is the same word sequence in every run, whatever --seed.
constexpr uint64_t kSharedPrefixSeed = 0x7368617265642121ull;

struct ParsedUrl {
  std::string scheme_host_port;  // "http://127.0.0.1:8000"
  std::string prefix;            // path before "/v1", without a trailing '/'
};

Expected<ParsedUrl> parse_url(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos || (url.compare(0, scheme_end, "http") != 0 && url.compare(0, scheme_end, "https") != 0))
    return invalid_argument("[bench serve] --url '{}' must start with http:// or https://", url);
  const size_t host_start = scheme_end + 3;
  const size_t path_start = url.find('/', host_start);
  ParsedUrl u;
  u.scheme_host_port = url.substr(0, path_start);
  if (u.scheme_host_port.size() <= host_start) return invalid_argument("[bench serve] --url '{}' has no host", url);
  if (path_start != std::string::npos) u.prefix = url.substr(path_start);
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  if (u.prefix.size() >= 3 && u.prefix.compare(u.prefix.size() - 3, 3, "/v1") == 0) u.prefix.resize(u.prefix.size() - 3);
  return u;
}

std::string endpoint_path(const ParsedUrl& u, LoadEndpoint e) {
  return u.prefix + (e == LoadEndpoint::kChat ? "/v1/chat/completions" : "/v1/completions");
}

httplib::Headers auth_headers(const LoadBenchOptions& o) {
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  return h;
}

// The first model id the server lists, or "" (the field is then left out of requests).
std::string first_model(const ParsedUrl& u, const LoadBenchOptions& o) {
  httplib::Client cli(u.scheme_host_port);
  cli.set_connection_timeout(5);
  cli.set_read_timeout(10);
  auto res = cli.Get(u.prefix + "/v1/models", auth_headers(o));
  if (!res || res->status != 200) return "";
  auto parsed = parse_json(res->body, "/v1/models");
  if (!parsed.ok()) return "";
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty()) return "";
  const auto& m = j["data"][0];
  return m.contains("id") && m["id"].is_string() ? m["id"].get<std::string>() : "";
}

std::string truncated(std::string s, size_t max_bytes = 1000) {
  if (s.size() > max_bytes) s = s.substr(0, max_bytes) + "...";
  return s;
}

RequestResult send_one(const BenchRequest& r, const LoadBenchOptions& o, const ParsedUrl& u, Clock::time_point t0) {
  RequestResult out;
  out.id = r.id;
  out.prompt_tokens = r.prompt_words;
  httplib::Client cli(u.scheme_host_port);
  cli.set_connection_timeout(30);
  const auto timeout = std::chrono::duration<double>(o.timeout_s);
  cli.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  cli.set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));

  httplib::Request req;
  req.method = "POST";
  req.path = endpoint_path(u, o.endpoint);
  req.headers = auth_headers(o);
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", "text/event-stream");
  req.body = request_body(r, o).dump();

  int status = -1;
  std::string error_body, stream_error;
  SseParser parser;
  std::vector<std::string> events;
  bool done = false;
  int64_t text_chunks = 0, usage_completion = -1, usage_prompt = -1;
  Clock::time_point first{}, last{};
  auto handle_events = [&](Clock::time_point now) {
    for (const std::string& e : events) {
      const StreamChunk c = parse_stream_chunk(e);
      if (!c.error.empty() && stream_error.empty()) stream_error = c.error;
      if (c.done) done = true;
      if (c.completion_tokens >= 0) usage_completion = c.completion_tokens;
      if (c.prompt_tokens >= 0) usage_prompt = c.prompt_tokens;
      if (c.text.empty()) continue;
      if (text_chunks == 0) {
        first = now;
      } else {
        out.itl_s.push_back(seconds_between(last, now));
      }
      last = now;
      ++text_chunks;
    }
    events.clear();
  };
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const Clock::time_point now = Clock::now();
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(data, std::min<size_t>(n, 4096 - error_body.size()));
      return true;
    }
    parser.feed({data, n}, events);
    handle_events(now);
    return stream_error.empty();  // an error object in the stream ends the request
  };
  const Clock::time_point sent = Clock::now();
  out.start_s = seconds_between(t0, sent);
  httplib::Result res = cli.send(req);
  const Clock::time_point end = Clock::now();
  parser.finish(events);
  handle_events(end);
  out.latency_s = seconds_between(sent, end);
  out.output_tokens = usage_completion >= 0 ? usage_completion : text_chunks;
  if (usage_prompt >= 0) out.prompt_tokens = usage_prompt;
  if (text_chunks > 0) out.ttft_s = seconds_between(sent, first);
  if (status >= 0 && status != 200) {
    out.error = fmt::format("HTTP {}: {}", status, truncated(error_body));
  } else if (!stream_error.empty()) {
    out.error = "error in stream: " + truncated(stream_error);
  } else if (!res) {
    out.error = "connection: " + httplib::to_string(res.error());
  } else if (!done) {
    out.error = "the stream ended without data: [DONE]";
  } else if (text_chunks == 0) {
    out.error = "the stream carried no tokens";
  } else {
    out.ok = true;
  }
  return out;
}

std::string fmt_ms(const Distribution& d) {
  return fmt::format("mean {:9.2f}  p50 {:9.2f}  p90 {:9.2f}  p99 {:9.2f}", d.mean, d.p50, d.p90, d.p99);
}

// A finite number from the whole of `s`, or nullopt.
std::optional<double> parse_number(std::string_view s) {
  const std::string str(s);
  char* end = nullptr;
  const double v = std::strtod(str.c_str(), &end);
  if (str.empty() || end != str.c_str() + str.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace

Expected<LengthDist> parse_length_dist(std::string_view flag, std::string_view spec) {
  const size_t colon = spec.find(':');
  const std::string_view kind = spec.substr(0, colon);
  const std::string_view args = colon == std::string_view::npos ? std::string_view{} : spec.substr(colon + 1);
  LengthDist d;
  if (kind == "uniform" && colon == std::string_view::npos) return d;
  if (kind == "exponential") {
    const std::optional<double> mean = parse_number(args);
    if (!mean || *mean <= 0)
      return invalid_argument("{} '{}': exponential:MEAN needs a mean > 0 (tokens)", flag, spec);
    d.kind = LengthDistKind::kExponential;
    d.mean = *mean;
    return d;
  }
  if (kind == "lognormal") {
    const size_t comma = args.find(',');
    const std::optional<double> mu = comma == std::string_view::npos ? std::nullopt : parse_number(args.substr(0, comma));
    const std::optional<double> sigma =
        comma == std::string_view::npos ? std::nullopt : parse_number(args.substr(comma + 1));
    if (!mu || !sigma || *sigma <= 0)
      return invalid_argument("{} '{}': lognormal:MU,SIGMA needs two numbers (of ln tokens), SIGMA > 0", flag, spec);
    d.kind = LengthDistKind::kLognormal;
    d.mu = *mu;
    d.sigma = *sigma;
    return d;
  }
  return invalid_argument("{} '{}' must be uniform, exponential:MEAN or lognormal:MU,SIGMA", flag, spec);
}

std::string describe(const LengthDist& d) {
  switch (d.kind) {
    case LengthDistKind::kUniform:
      return "uniform";
    case LengthDistKind::kExponential:
      return fmt::format("exponential:{}", d.mean);
    case LengthDistKind::kLognormal:
      return fmt::format("lognormal:{},{}", d.mu, d.sigma);
  }
  return "?";
}

int64_t sample_length(const LengthDist& d, int64_t min, int64_t max, Rng& rng) {
  KILN_CHECK(1 <= min && min <= max);
  double x = 0;
  switch (d.kind) {
    case LengthDistKind::kUniform:
      return min + static_cast<int64_t>(rng.below(static_cast<uint64_t>(max - min + 1)));
    case LengthDistKind::kExponential: {
      const double u = static_cast<double>(rng.next_u64() >> 11) * 0x1.0p-53;  // [0, 1)
      x = -d.mean * std::log1p(-u);
      break;
    }
    case LengthDistKind::kLognormal:
      x = std::exp(d.mu + d.sigma * static_cast<double>(rng.normal()));
      break;
  }
  // Clamp before converting: a far tail draw may not fit an int64.
  return static_cast<int64_t>(std::llround(std::clamp(x, static_cast<double>(min), static_cast<double>(max))));
}

// The --mix presets, one row each.
struct Mix {
  std::string_view name;
  int64_t prompt_min, prompt_max, shared_prefix;
  LengthDist prompt_dist;
  int64_t output_min, output_max;
  LengthDist output_dist;
};
constexpr std::array<Mix, 2> kMixes = {{
    {"chat", 64, 1024, 0, {}, 8, 2048, kChatOutput},
    {"rag", 1100, 1400, 1024, {}, 16, 64, {}},
}};

Status apply_mix(std::string_view name, LoadBenchOptions& o) {
  for (const Mix& m : kMixes) {
    if (m.name != name) continue;
    o.prompt_min = m.prompt_min;
    o.prompt_max = m.prompt_max;
    o.shared_prefix = m.shared_prefix;
    o.prompt_dist = m.prompt_dist;
    o.output_min = m.output_min;
    o.output_max = m.output_max;
    o.output_dist = m.output_dist;
    return {};
  }
  return invalid_argument("[bench serve] --mix '{}' must be chat or rag", name);
}

Status check_options(const LoadBenchOptions& o) {
  if (o.num_requests < 1) return invalid_argument("[bench serve] --num must be >= 1, got {}", o.num_requests);
  if (!(o.rate > 0)) return invalid_argument("[bench serve] --rate must be > 0 (or inf), got {}", o.rate);
  if (o.prompt_min < 1 || o.prompt_min > o.prompt_max)
    return invalid_argument("[bench serve] --prompt-len {}:{} must satisfy 1 <= A <= B", o.prompt_min, o.prompt_max);
  if (o.output_min < 1 || o.output_min > o.output_max)
    return invalid_argument("[bench serve] --output-len {}:{} must satisfy 1 <= C <= D", o.output_min, o.output_max);
  if (o.shared_prefix < 0 || o.shared_prefix > o.prompt_min)
    return invalid_argument("[bench serve] --shared-prefix {} must be between 0 and the shortest prompt ({})",
                            o.shared_prefix, o.prompt_min);
  if (o.max_concurrency < 0) return invalid_argument("[bench serve] --max-concurrency {} < 0", o.max_concurrency);
  if (!(o.timeout_s > 0)) return invalid_argument("[bench serve] --timeout must be > 0, got {}", o.timeout_s);
  if (o.slo_ttft_ms < 0 || o.slo_tpot_ms < 0) return invalid_argument("[bench serve] SLOs must be >= 0");
  return parse_url(o.url).status();
}

std::vector<double> poisson_arrivals(int64_t n, double rate, Rng& rng) {
  std::vector<double> t(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (std::isinf(rate)) return t;
  for (size_t i = 1; i < t.size(); ++i) {
    const double u = static_cast<double>(rng.next_u64() >> 11) * 0x1.0p-53;  // [0, 1), 53 bits
    t[i] = t[i - 1] - std::log1p(-u) / rate;                                 // Exp(rate) gap
  }
  return t;
}

std::string_view prompt_word(size_t i) { return kWords[i % kWords.size()]; }
size_t num_prompt_words() { return kWords.size(); }

std::string make_prompt(int64_t words, int64_t shared, Rng& rng) {
  Rng shared_rng(kSharedPrefixSeed);
  std::string s;
  for (int64_t i = 0; i < words; ++i) {
    Rng& r = i < shared ? shared_rng : rng;
    if (i > 0) s += ' ';
    s += kWords[r.below(kWords.size())];
  }
  return s;
}

std::vector<BenchRequest> make_requests(const LoadBenchOptions& o) {
  Rng rng(o.seed);
  const std::vector<double> arrivals = poisson_arrivals(o.num_requests, o.rate, rng);
  std::vector<BenchRequest> reqs(arrivals.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    BenchRequest& r = reqs[i];
    r.id = static_cast<int64_t>(i);
    r.arrival_s = arrivals[i];
    r.prompt_words = sample_length(o.prompt_dist, o.prompt_min, o.prompt_max, rng);
    r.max_tokens = sample_length(o.output_dist, o.output_min, o.output_max, rng);
    r.prompt = make_prompt(r.prompt_words, o.shared_prefix, rng);
  }
  return reqs;
}

nlohmann::json request_body(const BenchRequest& r, const LoadBenchOptions& o) {
  nlohmann::json j;
  if (!o.model.empty()) j["model"] = o.model;
  if (o.endpoint == LoadEndpoint::kChat) {
    j["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", r.prompt}}});
  } else {
    j["prompt"] = r.prompt;
  }
  j["max_tokens"] = r.max_tokens;
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};  // OpenAI: a last chunk with "usage"
  if (o.ignore_eos) j["ignore_eos"] = true;
  if (o.temperature >= 0) j["temperature"] = o.temperature;
  return j;
}

// ---- SSE -----------------------------------------------------------------------------------

void SseParser::feed(std::string_view bytes, std::vector<std::string>& events) {
  pending_.append(bytes);
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view l(pending_.data() + start, nl - start);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    line(l, events);
  }
  pending_.erase(0, start);
}

void SseParser::finish(std::vector<std::string>& events) {
  if (!pending_.empty()) {
    std::string l = std::move(pending_);
    pending_.clear();
    if (!l.empty() && l.back() == '\r') l.pop_back();
    line(l, events);
  }
  line({}, events);  // dispatch what is left
}

void SseParser::line(std::string_view l, std::vector<std::string>& events) {
  if (l.empty()) {
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.front() == ':') return;  // comment
  const size_t colon = l.find(':');
  const std::string_view field = l.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view{} : l.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field != "data") return;
  if (has_data_) data_ += '\n';
  data_.append(value);
  has_data_ = true;
}

StreamChunk parse_stream_chunk(std::string_view data) {
  StreamChunk c;
  std::string_view trimmed = data;
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back()))) trimmed.remove_suffix(1);
  if (trimmed == "[DONE]") {
    c.done = true;
    return c;
  }
  auto parsed = parse_json(data, "an SSE chunk");
  const nlohmann::json j = parsed.ok() ? std::move(*parsed) : nlohmann::json();
  if (!j.is_object()) {
    c.error = "unparsable chunk: " + truncated(std::string(data), 200);
    return c;
  }
  if (j.contains("error") && !j["error"].is_null()) {
    c.error = j["error"].dump();
    return c;
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const auto& ch = j["choices"][0];
    if (ch.contains("text") && ch["text"].is_string()) {
      c.text = ch["text"].get<std::string>();
    } else if (ch.contains("delta") && ch["delta"].is_object() && ch["delta"].contains("content") &&
               ch["delta"]["content"].is_string()) {
      c.text = ch["delta"]["content"].get<std::string>();
    }
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const auto& u = j["usage"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
      c.completion_tokens = u["completion_tokens"].get<int64_t>();
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
      c.prompt_tokens = u["prompt_tokens"].get<int64_t>();
  }
  return c;
}

// ---- statistics ----------------------------------------------------------------------------

double RequestResult::tpot_s() const {
  if (output_tokens < 2 || itl_s.empty()) return 0.0;
  double span = 0;
  for (double g : itl_s) span += g;  // last − first text chunk
  return span / static_cast<double>(output_tokens - 1);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

Distribution summarize_distribution(const std::vector<double>& v) {
  Distribution d;
  d.count = static_cast<int64_t>(v.size());
  if (v.empty()) return d;
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / static_cast<double>(v.size());
  d.p50 = percentile(v, 50);
  d.p90 = percentile(v, 90);
  d.p99 = percentile(v, 99);
  d.max = *std::max_element(v.begin(), v.end());
  return d;
}

LoadBenchReport summarize(const std::vector<RequestResult>& results, double duration_s, double slo_ttft_ms,
                          double slo_tpot_ms) {
  LoadBenchReport r;
  r.num_requests = static_cast<int64_t>(results.size());
  r.duration_s = duration_s;
  r.slo_ttft_ms = slo_ttft_ms;
  r.slo_tpot_ms = slo_tpot_ms;
  std::vector<double> ttft, tpot, itl, latency, prompt_len, output_len;
  for (const RequestResult& x : results) {
    if (!x.ok) {
      ++r.num_failed;
      r.failures.emplace_back(x.id, x.error);
      continue;
    }
    ++r.num_completed;
    r.prompt_tokens += x.prompt_tokens;
    r.output_tokens += x.output_tokens;
    prompt_len.push_back(static_cast<double>(x.prompt_tokens));
    output_len.push_back(static_cast<double>(x.output_tokens));
    const double ttft_ms = 1e3 * x.ttft_s, tpot_ms = 1e3 * x.tpot_s();
    ttft.push_back(ttft_ms);
    latency.push_back(1e3 * x.latency_s);
    if (x.output_tokens >= 2 && !x.itl_s.empty()) tpot.push_back(tpot_ms);
    for (double g : x.itl_s) itl.push_back(1e3 * g);
    const bool ttft_ok = slo_ttft_ms <= 0 || ttft_ms <= slo_ttft_ms;
    const bool tpot_ok = slo_tpot_ms <= 0 || x.output_tokens < 2 || tpot_ms <= slo_tpot_ms;
    if (ttft_ok && tpot_ok) ++r.num_good;
  }
  if (duration_s > 0) {
    r.request_throughput = r.num_completed / duration_s;
    r.output_throughput = r.output_tokens / duration_s;
    r.total_throughput = (r.prompt_tokens + r.output_tokens) / duration_s;
    r.goodput = r.num_good / duration_s;
  }
  r.ttft_ms = summarize_distribution(ttft);
  r.tpot_ms = summarize_distribution(tpot);
  r.itl_ms = summarize_distribution(itl);
  r.latency_ms = summarize_distribution(latency);
  r.prompt_len = summarize_distribution(prompt_len);
  r.output_len = summarize_distribution(output_len);
  return r;
}

void add_requested_lengths(const std::vector<BenchRequest>& requests, LoadBenchReport& r) {
  std::vector<double> prompt, output;
  for (const BenchRequest& x : requests) {
    prompt.push_back(static_cast<double>(x.prompt_words));
    output.push_back(static_cast<double>(x.max_tokens));
  }
  r.requested_prompt_len = summarize_distribution(prompt);
  r.requested_output_len = summarize_distribution(output);
}

nlohmann::json to_json(const LoadBenchReport& r) {
  auto dist = [](const Distribution& d) {
    return nlohmann::json{{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}, {"max", d.max}, {"count", d.count}};
  };
  nlohmann::json failures = nlohmann::json::array();
  for (const auto& [id, err] : r.failures) failures.push_back({{"id", id}, {"error", err}});
  return {{"num_requests", r.num_requests},
          {"completed", r.num_completed},
          {"failed", r.num_failed},
          {"duration_s", r.duration_s},
          {"prompt_tokens", r.prompt_tokens},
          {"output_tokens", r.output_tokens},
          {"request_throughput", r.request_throughput},
          {"output_throughput", r.output_throughput},
          {"total_throughput", r.total_throughput},
          {"goodput", r.goodput},
          {"num_good", r.num_good},
          {"slo_ttft_ms", r.slo_ttft_ms},
          {"slo_tpot_ms", r.slo_tpot_ms},
          {"ttft_ms", dist(r.ttft_ms)},
          {"tpot_ms", dist(r.tpot_ms)},
          {"itl_ms", dist(r.itl_ms)},
          {"latency_ms", dist(r.latency_ms)},
          {"prompt_tokens_per_request", dist(r.prompt_len)},
          {"output_tokens_per_request", dist(r.output_len)},
          {"requested_prompt_words", dist(r.requested_prompt_len)},
          {"requested_max_tokens", dist(r.requested_output_len)},
          {"failures", failures}};
}

std::string format_report(const LoadBenchReport& r) {
  std::string s;
  auto row = [&](std::string_view name, const std::string& value) { s += fmt::format("{:<34}{}\n", name, value); };
  row("requests completed / failed", fmt::format("{} / {} of {}", r.num_completed, r.num_failed, r.num_requests));
  row("duration (s)", fmt::format("{:.3f}", r.duration_s));
  row("prompt / output tokens", fmt::format("{} / {}", r.prompt_tokens, r.output_tokens));
  row("request throughput (req/s)", fmt::format("{:.3f}", r.request_throughput));
  row("output throughput (tok/s)", fmt::format("{:.2f}", r.output_throughput));
  row("total throughput (tok/s)", fmt::format("{:.2f}", r.total_throughput));
  const std::string slo = fmt::format("TTFT <= {}, TPOT <= {}",
                                      r.slo_ttft_ms > 0 ? fmt::format("{} ms", r.slo_ttft_ms) : "any",
                                      r.slo_tpot_ms > 0 ? fmt::format("{} ms", r.slo_tpot_ms) : "any");
  row("goodput (req/s)", fmt::format("{:.3f} ({} requests met {})", r.goodput, r.num_good, slo));
  row("TTFT (ms)", fmt_ms(r.ttft_ms));
  row("TPOT (ms)", fmt_ms(r.tpot_ms));
  row("ITL (ms)", fmt_ms(r.itl_ms));
  row("end-to-end latency (ms)", fmt_ms(r.latency_ms));
  auto lengths = [](const Distribution& d) {
    return fmt::format("mean {:7.1f}  p50 {:7.1f}  p99 {:7.1f}  max {:5.0f}", d.mean, d.p50, d.p99, d.max);
  };
  if (r.requested_prompt_len.count > 0) {
    row("requested prompt words", lengths(r.requested_prompt_len));
    row("requested max_tokens", lengths(r.requested_output_len));
  }
  row("prompt tokens per request", lengths(r.prompt_len));
  row("output tokens per request", lengths(r.output_len));
  constexpr size_t kShown = 10;
  for (size_t i = 0; i < r.failures.size() && i < kShown; ++i)
    s += fmt::format("failed request {}: {}\n", r.failures[i].first, r.failures[i].second);
  if (r.failures.size() > kShown) s += fmt::format("... and {} more failed requests\n", r.failures.size() - kShown);
  return s;
}

// ---- running -------------------------------------------------------------------------------

Expected<std::vector<RequestResult>> run_load(const LoadBenchOptions& opts, const std::vector<BenchRequest>& requests,
                                              double* duration_s) {
  KILN_RETURN_IF_ERROR(check_options(opts));
  KILN_ASSIGN_OR_RETURN(const ParsedUrl url, parse_url(opts.url));
  LoadBenchOptions o = opts;
  if (o.model.empty()) o.model = first_model(url, o);
  const size_t n = requests.size();
  std::vector<RequestResult> results(n);
  const size_t num_threads =
      o.max_concurrency > 0 ? std::min(n, static_cast<size_t>(o.max_concurrency)) : n;
  std::atomic<size_t> next{0};
  const Clock::time_point t0 = Clock::now();
  {
    std::vector<std::jthread> threads;
    threads.reserve(num_threads);
    for (size_t w = 0; w < num_threads; ++w) {
      threads.emplace_back([&] {
        // Requests are taken in arrival order; each waits for its arrival time, then streams.
        for (size_t i; (i = next.fetch_add(1)) < n;) {
          std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(requests[i].arrival_s)));
          results[i] = send_one(requests[i], o, url, t0);
        }
      });
    }
  }  // jthreads join here
  if (duration_s) *duration_s = seconds_between(t0, Clock::now());
  return results;
}

Expected<LoadBenchReport> run_load_bench(const LoadBenchOptions& o) {
  KILN_RETURN_IF_ERROR(check_options(o));
  const std::vector<BenchRequest> requests = make_requests(o);
  double duration = 0;
  KILN_ASSIGN_OR_RETURN(const std::vector<RequestResult> results, run_load(o, requests, &duration));
  LoadBenchReport report = summarize(results, duration, o.slo_ttft_ms, o.slo_tpot_ms);
  add_requested_lengths(requests, report);
  return report;
}

}  // namespace kiln

