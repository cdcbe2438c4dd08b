// `kiln bench serve`: the serving load benchmark (W6) against any OpenAI-compatible server —
// Poisson arrivals, streamed completions, throughput, TTFT/TPOT/ITL percentiles and goodput.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "apps/kiln/commands.h"
#include "kiln/serve/load_bench.h"

namespace kiln::app {
namespace {

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "kiln bench serve: {}\n", s.message());
  throw CLI::RuntimeError(kUserError);
}

// "A:B" (or "A") into a range.
Status parse_range(const std::string& flag, const std::string& s, int64_t& lo, int64_t& hi) {
  const size_t colon = s.find(':');
  try {
    size_t used = 0;
    lo = std::stoll(s.substr(0, colon), &used);
    if (used != (colon == std::string::npos ? s.size() : colon)) throw std::invalid_argument(s);
    hi = lo;
    if (colon != std::string::npos) {
      const std::string rest = s.substr(colon + 1);
      hi = std::stoll(rest, &used);
      if (used != rest.size()) throw std::invalid_argument(s);
    }
  } catch (const std::exception&) {
    return invalid_argument("{} '{}' must be A:B (integers)", flag, s);
  }
  return {};
}

}  // namespace

void register_bench_serve(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  struct Args {
    LoadBenchOptions opt;
    std::string rate = "inf", prompt_len = "64:512", output_len = "64:256", endpoint = "completions";
    std::string prompt_dist = "uniform", output_dist = "uniform", mix;
    int64_t shared_prefix = 0;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = bench->add_subcommand(
      "serve", "Load benchmark of an OpenAI-compatible server (W6): Poisson arrivals, TTFT/TPOT, goodput");
  cmd->add_option("--url", a->opt.url, "Server base URL (default http://127.0.0.1:8000)");
  cmd->add_option("--num", a->opt.num_requests, "Requests to send")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--rate", a->rate, "Arrival rate in requests/s, or inf (all at once)");
  cmd->add_option("--prompt-len", a->prompt_len, "Prompt length range A:B in tokens (≈ words); clamps --prompt-dist");
  cmd->add_option("--output-len", a->output_len, "Output length range C:D in tokens (max_tokens); clamps --output-dist");
  cmd->add_option("--prompt-dist", a->prompt_dist,
                  "Prompt lengths: uniform (default), exponential:MEAN or lognormal:MU,SIGMA (of ln tokens)");
  cmd->add_option("--output-dist", a->output_dist,
                  "Output lengths: uniform (default), exponential:MEAN or lognormal:MU,SIGMA (of ln tokens)");
  cmd->add_option("--mix", a->mix,
                  "Preset workload: chat (prompts 64-1024, lognormal outputs of mean ~200 to 2048) or rag (1100-1400 "
                  "token prompts sharing 1024, outputs 16-64); flags given beside it win")
      ->check(CLI::IsMember({"chat", "rag"}));
  cmd->add_option("--shared-prefix", a->shared_prefix, "The first K prompt tokens are the same in every request")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--model", a->opt.model, "Model name to send (default: the first of GET /v1/models)");
  cmd->add_option("--slo-ttft", a->opt.slo_ttft_ms, "Goodput SLO on time to first token, ms (0: none)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--slo-tpot", a->opt.slo_tpot_ms, "Goodput SLO on time per output token, ms (0: none)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--seed", a->opt.seed, "Seed for arrivals, lengths and prompts");
  cmd->add_option("--endpoint", a->endpoint, "completions (/v1/completions) or chat (/v1/chat/completions)")
      ->check(CLI::IsMember({"completions", "chat"}));
  cmd->add_option("--max-concurrency", a->opt.max_concurrency, "Client threads (0: one per request)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
  cmd->add_flag("--ignore-eos", a->opt.ignore_eos, "Send \"ignore_eos\": true (vLLM, llama.cpp extension)");
  cmd->add_option("--temperature", a->opt.temperature, "Send this sampling temperature (0: greedy; default: the server's)")
      ->check(CLI::Range(0.0, 2.0));
  cmd->add_option("--api-key", a->opt.api_key, "Bearer token");
  cmd->add_option("--timeout", a->opt.timeout_s, "Per-request read timeout, s")->check(CLI::Range(1e-3, 1e6));
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->callback([a, cmd] {
    LoadBenchOptions o = a->opt;
    int64_t prompt_min = 0, prompt_max = 0, output_min = 0, output_max = 0;
    if (Status s = parse_range("--prompt-len", a->prompt_len, prompt_min, prompt_max); !s.ok()) fail(s);
    if (Status s = parse_range("--output-len", a->output_len, output_min, output_max); !s.ok()) fail(s);
    // A --mix preset first; then the flags: all of them without a mix, only those given with one.
    if (!a->mix.empty()) {
      if (Status s = apply_mix(a->mix, o); !s.ok()) fail(s);
    }
    auto given = [&](const char* flag) { return a->mix.empty() || cmd->count(flag) > 0; };
    if (given("--prompt-len")) std::tie(o.prompt_min, o.prompt_max) = std::pair(prompt_min, prompt_max);
    if (given("--output-len")) std::tie(o.output_min, o.output_max) = std::pair(output_min, output_max);
    auto dist = [&](const char* flag, const std::string& spec, LengthDist& d) {
      if (!given(flag)) return;
      auto parsed = parse_length_dist(flag, spec);
      if (!parsed.ok()) fail(parsed.status());
      d = *parsed;
    };
    dist("--prompt-dist", a->prompt_dist, o.prompt_dist);
    dist("--output-dist", a->output_dist, o.output_dist);
    if (given("--shared-prefix")) o.shared_prefix = a->shared_prefix;
    if (a->rate == "inf" || a->rate == "Inf" || a->rate == "INF") {
      o.rate = std::numeric_limits<double>::infinity();
    } else {
      try {
        size_t used = 0;
        o.rate = std::stod(a->rate, &used);
        if (used != a->rate.size() || !std::isfinite(o.rate)) throw std::invalid_argument(a->rate);
      } catch (const std::exception&) {
        fail(invalid_argument("--rate '{}' must be a number of requests/s or inf", a->rate));
      }
    }
    o.endpoint = a->endpoint == "chat" ? LoadEndpoint::kChat : LoadEndpoint::kCompletions;
    if (Status s = check_options(o); !s.ok()) fail(s);
    if (!a->json) {
      fmt::print("bench serve: {} requests to {} ({}), rate {} req/s, {}prompt {} in {}:{} words (≈ tokens), "
                 "output {} in {}:{} tokens, shared prefix {}\n",
                 o.num_requests, o.url, a->endpoint, a->rate, a->mix.empty() ? "" : "mix " + a->mix + ", ",
                 describe(o.prompt_dist), o.prompt_min, o.prompt_max, describe(o.output_dist), o.output_min,
                 o.output_max, o.shared_prefix);
      std::fflush(stdout);
    }
    auto report = run_load_bench(o);
    if (!report.ok()) fail(report.status());
    if (a->json) {
      nlohmann::json j = to_json(*report);
      j["url"] = o.url;
      j["endpoint"] = a->endpoint;
      j["rate"] = std::isinf(o.rate) ? nlohmann::json("inf") : nlohmann::json(o.rate);
      j["prompt_len"] = {o.prompt_min, o.prompt_max};
      j["output_len"] = {o.output_min, o.output_max};
      j["shared_prefix"] = o.shared_prefix;
      j["prompt_dist"] = describe(o.prompt_dist);
      j["output_dist"] = describe(o.output_dist);
      if (!a->mix.empty()) j["mix"] = a->mix;
      j["seed"] = o.seed;
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("{}", format_report(*report));
    }
  });
}

}  // namespace kiln::app
