// The load benchmark's parts (Poisson arrivals, prompts, percentiles, the SSE parser on split
// input) and an end-to-end run against a fake OpenAI streaming server on 127.0.0.1 that streams
// max_tokens chunks and answers 400 to some requests.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include "kiln/serve/http_listen.h"
#include "kiln/serve/load_bench.h"

namespace kiln {
namespace {

TEST(LoadBench, PoissonArrivalsHaveExponentialGaps) {
  const double rate = 50.0;
  const int64_t n = 20001;
  Rng rng(42);
  const std::vector<double> t = poisson_arrivals(n, rate, rng);
  ASSERT_EQ(static_cast<int64_t>(t.size()), n);
  EXPECT_EQ(t[0], 0.0);
  std::vector<double> gaps;
  for (size_t i = 1; i < t.size(); ++i) {
    ASSERT_GE(t[i], t[i - 1]);
    gaps.push_back(t[i] - t[i - 1]);
  }
  const double m = static_cast<double>(gaps.size());
  const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / m;
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= m - 1;
  // Exp(λ): mean 1/λ, variance 1/λ², fourth central moment 9/λ⁴, so the standard error of the
  // mean is (1/λ)/√m and of the sample variance √(8/m)/λ². Allow 5 standard errors.
  EXPECT_NEAR(mean, 1 / rate, 5 * (1 / rate) / std::sqrt(m));
  EXPECT_NEAR(var, 1 / (rate * rate), 5 * std::sqrt(8 / m) / (rate * rate));
  // P(gap > 1/λ) = e⁻¹, a binomial proportion.
  const double frac = std::count_if(gaps.begin(), gaps.end(), [&](double g) { return g > 1 / rate; }) / m;
  EXPECT_NEAR(frac, std::exp(-1.0), 5 * std::sqrt(std::exp(-1.0) * (1 - std::exp(-1.0)) / m));
  // Infinite rate: everything at once.
  const std::vector<double> burst = poisson_arrivals(10, std::numeric_limits<double>::infinity(), rng);
  EXPECT_TRUE(std::all_of(burst.begin(), burst.end(), [](double x) { return x == 0.0; }));
}

std::vector<std::string> words_of(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

// n draws of d clamped to [min, max], as doubles.
std::vector<double> draws(const LengthDist& d, int64_t min, int64_t max, uint64_t seed, int n = 200000) {
  Rng rng(seed);
  std::vector<double> v;
  for (int i = 0; i < n; ++i) {
    const int64_t x = sample_length(d, min, max, rng);
    EXPECT_GE(x, min);
    EXPECT_LE(x, max);
    v.push_back(static_cast<double>(x));
  }
  return v;
}

double mean_of(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()); }

TEST(LoadBench, LengthDistributionsHaveTheirMeanAndQuantiles) {
  // 200,000 draws at a fixed seed. Standard errors: exponential mean 100 -> 0.22 on the mean;
  // lognormal(4.71, 1.1) -> sd 316, 0.7 on the mean; the tolerances below are >= 5 of them
  // plus the bias of rounding to an integer (< 0.5 token).
  const std::vector<double> e = draws(*parse_length_dist("--output-dist", "exponential:100"), 1, 1000000, 1);
  EXPECT_NEAR(mean_of(e), 100.0, 1.5);
  EXPECT_NEAR(percentile(e, 50), 100 * std::log(2.0), 1.5);  // median of Exp: mean · ln 2
  EXPECT_NEAR(percentile(e, 99), 100 * std::log(100.0), 10);  // mean · ln 100
  const LengthDist ln = *parse_length_dist("--output-dist", "lognormal:4.71,1.1");
  const std::vector<double> l = draws(ln, 1, 1000000, 2);
  EXPECT_NEAR(percentile(l, 50), std::exp(4.71), 2.5);
  EXPECT_NEAR(percentile(l, 90), std::exp(4.71 + 1.2815516 * 1.1), 12);
  EXPECT_NEAR(mean_of(l), std::exp(4.71 + 1.1 * 1.1 / 2), 5);
  // The chat preset's outputs: clamped to [8, 2048], mean ≈ 200 by construction.
  const std::vector<double> c = draws(kChatOutput, 8, 2048, 3);
  EXPECT_NEAR(mean_of(c), 200.0, 4);
  EXPECT_NEAR(percentile(c, 50), 111, 3);
  EXPECT_NEAR(percentile(c, 99), 1440, 80);
  const double at_clamp = static_cast<double>(std::count(c.begin(), c.end(), 2048.0)) / static_cast<double>(c.size());
  EXPECT_NEAR(at_clamp, 0.0041, 0.0015);  // P(ln X > ln 2048)
  // Uniform: every integer of the range, equally often (binomial sd of a count: ~90).
  const std::vector<double> u = draws(LengthDist{}, 10, 20, 4, 110000);
  for (int k = 10; k <= 20; ++k) EXPECT_NEAR(std::count(u.begin(), u.end(), double(k)), 10000, 500) << k;
  EXPECT_NEAR(mean_of(u), 15.0, 0.05);
}

TEST(LoadBench, LengthDrawsAreClampedAndSeeded) {
  // Exp(1000) in [5, 50]: P(X > 50) = e^-0.05 ≈ 95% of the draws sit at the top clamp.
  const LengthDist big = *parse_length_dist("--prompt-dist", "exponential:1000");
  const std::vector<double> v = draws(big, 5, 50, 5, 20000);
  EXPECT_NEAR(std::count(v.begin(), v.end(), 50.0) / 20000.0, std::exp(-0.05), 0.01);
  // A far tail never overflows: lognormal(40, 5) is clamped, not converted.
  Rng rng(6);
  EXPECT_EQ(sample_length(*parse_length_dist("--output-dist", "lognormal:40,5"), 1, 7, rng), 7);
  EXPECT_EQ(sample_length(LengthDist{}, 9, 9, rng), 9);
  EXPECT_EQ(draws(kChatOutput, 8, 2048, 7, 100), draws(kChatOutput, 8, 2048, 7, 100));
  EXPECT_NE(draws(kChatOutput, 8, 2048, 7, 100), draws(kChatOutput, 8, 2048, 8, 100));
}

TEST(LoadBench, BadLengthSpecsNameTheFlag) {
  for (const char* bad : {"", "lognormal", "lognormal:1", "lognormal:1,", "lognormal:a,b", "lognormal:1,0",
                          "lognormal:1,-2", "exponential", "exponential:", "exponential:-3", "exponential:0",
                          "exponential:5x", "gamma:2", "uniform:3", "Uniform"}) {
    auto d = parse_length_dist("--output-dist", bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("--output-dist"), std::string::npos) << d.status().message();
    EXPECT_NE(d.status().message().find(std::string("'") + bad + "'"), std::string::npos) << d.status().message();
  }
  auto e = parse_length_dist("--prompt-dist", "exponential:50.5");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->kind, LengthDistKind::kExponential);
  EXPECT_DOUBLE_EQ(e->mean, 50.5);
  auto l = parse_length_dist("--prompt-dist", "lognormal:-1.5,0.25");
  ASSERT_TRUE(l.ok());
  EXPECT_DOUBLE_EQ(l->mu, -1.5);
  EXPECT_DOUBLE_EQ(l->sigma, 0.25);
  EXPECT_EQ(describe(*l), "lognormal:-1.5,0.25");
  EXPECT_EQ(parse_length_dist("--prompt-dist", "uniform")->kind, LengthDistKind::kUniform);
}

TEST(LoadBench, MixesSetTheirWorkload) {
  LoadBenchOptions o;
  o.num_requests = 400;
  ASSERT_TRUE(apply_mix("chat", o).ok());
  ASSERT_TRUE(check_options(o).ok());
  LoadBenchReport r;
  add_requested_lengths(make_requests(o), r);
  EXPECT_GE(r.requested_prompt_len.mean, 500);  // uniform 64..1024: 544
  EXPECT_LE(r.requested_prompt_len.mean, 590);
  EXPECT_LE(r.requested_prompt_len.max, 1024);
  EXPECT_NEAR(r.requested_output_len.mean, 200, 40);  // 400 draws: sd of the mean ~16
  EXPECT_LE(r.requested_output_len.max, 2048);
  EXPECT_LT(r.requested_output_len.p50, r.requested_output_len.mean);  // heavy tail
  ASSERT_TRUE(apply_mix("rag", o).ok());
  ASSERT_TRUE(check_options(o).ok());
  o.num_requests = 20;
  const std::vector<BenchRequest> rag = make_requests(o);
  const std::vector<std::string> first = words_of(rag[0].prompt);
  for (const BenchRequest& q : rag) {
    EXPECT_GE(q.prompt_words, 1100);
    EXPECT_LE(q.prompt_words, 1400);
    EXPECT_GE(q.max_tokens, 16);
    EXPECT_LE(q.max_tokens, 64);
    const std::vector<std::string> w = words_of(q.prompt);
    EXPECT_TRUE(std::equal(w.begin(), w.begin() + 1024, first.begin()));
  }
  const Status bad = apply_mix("code", o);
  EXPECT_NE(bad.message().find("--mix"), std::string::npos);
}

TEST(LoadBench, PromptsHaveTheirLengthAndSharedPrefix) {
  LoadBenchOptions o;
  o.num_requests = 50;
  o.rate = 10;
  o.prompt_min = 40;
  o.prompt_max = 60;
  o.output_min = 3;
  o.output_max = 7;
  o.shared_prefix = 30;
  o.seed = 9;
  ASSERT_TRUE(check_options(o).ok());
  const std::vector<BenchRequest> reqs = make_requests(o);
  ASSERT_EQ(reqs.size(), 50u);
  const std::vector<std::string> first = words_of(reqs[0].prompt);
  std::set<std::string> suffixes;
  for (const BenchRequest& r : reqs) {
    const std::vector<std::string> w = words_of(r.prompt);
    EXPECT_EQ(static_cast<int64_t>(w.size()), r.prompt_words);
    EXPECT_GE(r.prompt_words, 40);
    EXPECT_LE(r.prompt_words, 60);
    EXPECT_GE(r.max_tokens, 3);
    EXPECT_LE(r.max_tokens, 7);
    EXPECT_TRUE(std::equal(w.begin(), w.begin() + 30, first.begin())) << r.id;
    suffixes.insert(std::accumulate(w.begin() + 30, w.end(), std::string()));  // the rest differs
  }
  EXPECT_GT(suffixes.size(), 40u);
  // The same seed gives the same workload; another seed another one (but the same prefix).
  EXPECT_EQ(make_requests(o)[7].prompt, reqs[7].prompt);
  o.seed = 10;
  const std::vector<BenchRequest> other = make_requests(o);
  EXPECT_NE(other[7].prompt, reqs[7].prompt);
  const std::vector<std::string> w = words_of(other[7].prompt);
  EXPECT_TRUE(std::equal(w.begin(), w.begin() + 30, first.begin()));
  // Bad options are named.
  o.shared_prefix = 41;
  EXPECT_FALSE(check_options(o).ok());
  o.shared_prefix = 0;
  o.url = "127.0.0.1:8000";
  EXPECT_FALSE(check_options(o).ok());
}

TEST(LoadBench, PercentileInterpolatesBetweenRanks) {
  std::vector<double> v = {7, 3, 10, 1, 5, 9, 2, 8, 4, 6};  // 1..10 shuffled
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 5.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 9.1);
  EXPECT_DOUBLE_EQ(percentile(v, 99), 9.91);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(percentile({4.0}, 99), 4.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
  const Distribution d = summarize_distribution(v);
  EXPECT_DOUBLE_EQ(d.mean, 5.5);
  EXPECT_DOUBLE_EQ(d.max, 10);
  EXPECT_EQ(d.count, 10);
}

TEST(LoadBench, SseParserHandlesEverySplit) {
  const std::string stream =
      ": keep-alive comment\n"
      "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
      "event: message\r\n"
      "data: {\"choices\":[{\"text\":\"b\"}]}\r\n\r\n"
      "data: line one\n"
      "data:line two\n\n"
      "id: 7\n"
      "data: [DONE]\n\n";
  const std::vector<std::string> expected = {"{\"choices\":[{\"text\":\"a\"}]}", "{\"choices\":[{\"text\":\"b\"}]}",
                                             "line one\nline two", "[DONE]"};
  // Whole, byte by byte, and cut at every point into two pieces.
  {
    SseParser p;
    std::vector<std::string> ev;
    p.feed(stream, ev);
    p.finish(ev);
    EXPECT_EQ(ev, expected);
  }
  {
    SseParser p;
    std::vector<std::string> ev;
    for (char c : stream) p.feed(std::string_view(&c, 1), ev);
    EXPECT_EQ(ev, expected);
  }
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseParser p;
    std::vector<std::string> ev;
    p.feed(std::string_view(stream).substr(0, cut), ev);
    p.feed(std::string_view(stream).substr(cut), ev);
    ASSERT_EQ(ev, expected) << "cut at " << cut;
  }
  // An event cut off before its blank line comes out at the end of the stream, not before.
  SseParser p;
  std::vector<std::string> ev;
  p.feed("data: {\"x\":1}", ev);
  EXPECT_TRUE(ev.empty());
  p.feed("\n", ev);
  EXPECT_TRUE(ev.empty());
  p.finish(ev);
  EXPECT_EQ(ev, std::vector<std::string>{"{\"x\":1}"});
}

TEST(LoadBench, StreamChunksOfBothEndpoints) {
  StreamChunk c = parse_stream_chunk(R"({"choices":[{"index":0,"text":" the","finish_reason":null}]})");
  EXPECT_EQ(c.text, " the");
  c = parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"content":"hi"}}]})");
  EXPECT_EQ(c.text, "hi");
  c = parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant"}}]})");
  EXPECT_TRUE(c.text.empty());
  EXPECT_TRUE(c.error.empty());
  c = parse_stream_chunk(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}})");
  EXPECT_EQ(c.prompt_tokens, 12);
  EXPECT_EQ(c.completion_tokens, 5);
  EXPECT_TRUE(parse_stream_chunk("[DONE]").done);
  EXPECT_FALSE(parse_stream_chunk(R"({"error":{"message":"boom"}})").error.empty());
  EXPECT_FALSE(parse_stream_chunk("{not json").error.empty());
}

// A fake OpenAI server: streams exactly max_tokens one-word chunks (first after first_delay,
// then every chunk_delay, each event written in two pieces), then usage and [DONE]; answers 400
// with an OpenAI error object when max_tokens is odd.
class FakeOpenAiServer {
 public:
  static constexpr int kFirstDelayMs = 15, kChunkDelayMs = 2;

  FakeOpenAiServer() {
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})", "application/json");
    });
    auto handler = [this](bool chat) {
      return [this, chat](const httplib::Request& req, httplib::Response& res) {
        const auto j = nlohmann::json::parse(req.body, nullptr, false);
        ++num_requests_;
        if (j.is_discarded() || !j.contains("max_tokens") || j["max_tokens"].get<int64_t>() % 2 == 1 ||
            j.value("stream", false) != true) {
          res.status = 400;
          res.set_content(R"({"error":{"message":"odd max_tokens","type":"invalid_request_error"}})",
                          "application/json");
          return;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          models_.insert(j.value("model", std::string("<none>")));
        }
        const int64_t k = j["max_tokens"].get<int64_t>();
        const std::string prompt = chat ? j["messages"][0]["content"].get<std::string>() : j["prompt"].get<std::string>();
        const int64_t prompt_tokens = static_cast<int64_t>(std::count(prompt.begin(), prompt.end(), ' ')) + 1;
        res.set_chunked_content_provider("text/event-stream", [k, chat, prompt_tokens](size_t, httplib::DataSink& sink) {
          std::this_thread::sleep_for(std::chrono::milliseconds(kFirstDelayMs));
          for (int64_t i = 0; i < k; ++i) {
            if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(kChunkDelayMs));
            const nlohmann::json choice = chat ? nlohmann::json{{"index", 0}, {"delta", {{"content", " w"}}}}
                                               : nlohmann::json{{"index", 0}, {"text", " w"}};
            const std::string ev = "data: " + nlohmann::json{{"choices", {choice}}}.dump() + "\n\n";
            const size_t half = ev.size() / 2;  // an event in two writes: the client sees partial events
            if (!sink.write(ev.data(), half)) return false;
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            if (!sink.write(ev.data() + half, ev.size() - half)) return false;
          }
          const std::string usage = "data: " +
                                    nlohmann::json{{"choices", nlohmann::json::array()},
                                                   {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", k}}}}
                                        .dump() +
                                    "\n\ndata: [DONE]\n\n";
          sink.write(usage.data(), usage.size());
          sink.done();
          return true;
        });
      };
    };
    server_.Post("/v1/completions", handler(false));
    server_.Post("/v1/chat/completions", handler(true));
    port_ = bind_http_server(server_, "127.0.0.1", 0).value();
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeOpenAiServer() { stop(); }
  void stop() {
    if (thread_.joinable()) {
      server_.stop();
      thread_.join();
    }
  }

  int port() const { return port_; }
  int64_t num_requests() const { return num_requests_; }
  std::set<std::string> models() {
    std::lock_guard<std::mutex> lock(mu_);
    return models_;
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;
  std::atomic<int64_t> num_requests_{0};
  std::mutex mu_;
  std::set<std::string> models_;
};

LoadBenchOptions fake_options(int port) {
  LoadBenchOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(port);
  o.num_requests = 24;
  o.rate = std::numeric_limits<double>::infinity();
  o.prompt_min = 8;
  o.prompt_max = 20;
  o.output_min = 2;
  o.output_max = 9;
  o.shared_prefix = 4;
  o.seed = 3;
  o.timeout_s = 20;
  return o;
}

void check_run(const LoadBenchOptions& o, FakeOpenAiServer& server) {
  const std::vector<BenchRequest> reqs = make_requests(o);
  double duration = 0;
  auto results = run_load(o, reqs, &duration);
  ASSERT_TRUE(results.ok()) << results.status().to_string();
  ASSERT_EQ(results->size(), reqs.size());
  int64_t expected_failed = 0, expected_tokens = 0;
  for (const BenchRequest& r : reqs) {
    if (r.max_tokens % 2 == 1) {
      ++expected_failed;
    } else {
      expected_tokens += r.max_tokens;
    }
  }
  ASSERT_GT(expected_failed, 0);
  ASSERT_LT(expected_failed, o.num_requests);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestResult& x = (*results)[i];
    EXPECT_EQ(x.id, reqs[i].id);
    if (reqs[i].max_tokens % 2 == 1) {
      EXPECT_FALSE(x.ok);
      EXPECT_NE(x.error.find("HTTP 400"), std::string::npos) << x.error;
      EXPECT_NE(x.error.find("odd max_tokens"), std::string::npos) << x.error;
      continue;
    }
    ASSERT_TRUE(x.ok) << x.error;
    EXPECT_EQ(x.output_tokens, reqs[i].max_tokens);
    EXPECT_EQ(x.prompt_tokens, reqs[i].prompt_words);  // the fake server's usage
    EXPECT_EQ(static_cast<int64_t>(x.itl_s.size()), x.output_tokens - 1);
    // Causal order: the first token cannot come before the server's first delay, nor after the end.
    EXPECT_GE(x.ttft_s, FakeOpenAiServer::kFirstDelayMs * 1e-3);
    EXPECT_LE(x.ttft_s, x.latency_s);
    EXPECT_GE(x.start_s, reqs[i].arrival_s);
    EXPECT_GT(x.tpot_s(), 0.0);
  }
  const LoadBenchReport r = summarize(*results, duration, 0, 0);
  EXPECT_EQ(r.num_completed + r.num_failed, o.num_requests);
  EXPECT_EQ(r.num_failed, expected_failed);
  EXPECT_EQ(static_cast<int64_t>(r.failures.size()), expected_failed);
  EXPECT_EQ(r.output_tokens, expected_tokens);
  EXPECT_EQ(r.num_good, r.num_completed);  // no SLO: every completed request counts
  EXPECT_DOUBLE_EQ(r.goodput, r.request_throughput);
  EXPECT_LE(r.ttft_ms.p50, r.ttft_ms.p90);
  EXPECT_LE(r.ttft_ms.p90, r.ttft_ms.p99);
  EXPECT_LE(r.ttft_ms.p99, r.ttft_ms.max);
  EXPECT_EQ(r.ttft_ms.count, r.num_completed);
  EXPECT_EQ(r.output_len.count, r.num_completed);
  EXPECT_DOUBLE_EQ(r.output_len.mean, static_cast<double>(expected_tokens) / static_cast<double>(r.num_completed));
  EXPECT_NE(format_report(r).find("output tokens per request"), std::string::npos);
  // An impossible TTFT SLO leaves no goodput; a TPOT SLO between requests' TPOTs splits them.
  EXPECT_EQ(summarize(*results, duration, 1e-3, 0).num_good, 0);
  const LoadBenchReport split = summarize(*results, duration, 0, r.tpot_ms.p50);
  EXPECT_GT(split.num_good, 0);
  EXPECT_LE(split.num_good, r.num_completed);
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["output_tokens_per_request"]["count"].get<int64_t>(), r.num_completed);
  EXPECT_EQ(j["failed"].get<int64_t>(), expected_failed);
  EXPECT_EQ(j["failures"].size(), static_cast<size_t>(expected_failed));
  EXPECT_NE(format_report(r).find("odd max_tokens"), std::string::npos);
  EXPECT_EQ(server.models(), std::set<std::string>{"fake-model"});  // resolved from /v1/models
}

TEST(LoadBench, EndToEndAgainstFakeServerAllAtOnce) {
  FakeOpenAiServer server;
  check_run(fake_options(server.port()), server);
  EXPECT_EQ(server.num_requests(), 24);
}

TEST(LoadBench, EndToEndPoissonChatAndBoundedConcurrency) {
  FakeOpenAiServer server;
  LoadBenchOptions o = fake_options(server.port());
  o.rate = 400;  // ~60 ms of arrivals
  o.endpoint = LoadEndpoint::kChat;
  o.max_concurrency = 4;
  o.url += "/v1/";  // a base URL ending in /v1 works too
  check_run(o, server);
}

TEST(LoadBench, UnreachableServerFailsEveryRequest) {
  int port;
  {
    FakeOpenAiServer gone;
    port = gone.port();
  }  // stopped: nothing listens there now
  LoadBenchOptions o = fake_options(port);
  o.num_requests = 3;
  o.model = "m";
  auto report = run_load_bench(o);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->num_failed, 3);
  EXPECT_EQ(report->num_completed, 0);
  for (const auto& [id, err] : report->failures) EXPECT_NE(err.find("connection"), std::string::npos) << err;
}

}  // namespace
}  // namespace kiln
