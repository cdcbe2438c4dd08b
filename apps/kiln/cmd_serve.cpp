// `kiln serve --model DIR`: the OpenAI-compatible server (src/kiln/serve/server.h) over the
// serving engine, with the KV-cache and scheduler flags. Binds loopback unless --host says
// otherwise; SIGINT/SIGTERM stop it cleanly.
#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <filesystem>

#include "apps/kiln/commands.h"
#include "kiln/model/weights.h"
#include "kiln/serve/server.h"

namespace kiln::app {
namespace {

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "kiln serve: {}\n", s.message());
  throw CLI::RuntimeError(kUserError);
}

// "512M", "2G", "1.5GiB", "1048576": bytes (K/M/G are binary multiples).
Expected<int64_t> parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return invalid_argument("--kv-cache-mem '{}' is not a size (e.g. 512M, 2G)", text);
  }
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.pop_back();
  double mul = 1;
  if (unit == "K" || unit == "k") mul = 1024.0;
  else if (unit == "M" || unit == "m") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") mul = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) return invalid_argument("--kv-cache-mem '{}': unknown unit '{}'", text, unit);
  if (!(v > 0) || v * mul > 1e15) return invalid_argument("--kv-cache-mem '{}' must be positive", text);
  return static_cast<int64_t>(v * mul);
}

struct ServeArgs {
  std::string model, draft_model, kv_mem = "1G", batching = "continuous", served_name;
  ServerConfig server;
  EngineConfig engine;
  bool no_prefix_caching = false;
  bool no_packed_weights = false;
};

// SIGINT/SIGTERM stop the server: httplib's stop() only swaps and shuts down the listening
// socket (atomic exchange, shutdown, close), which is safe in a signal handler.
std::atomic<Server*> g_server{nullptr};
extern "C" void on_stop_signal(int) {
  if (Server* s = g_server.load()) s->stop();
}

void run_serve(ServeArgs a) {
  auto bytes = parse_bytes(a.kv_mem);
  if (!bytes.ok()) fail(bytes.status());
  a.engine.kv_cache_mem_bytes = *bytes;
  a.engine.enable_prefix_caching = !a.no_prefix_caching;
  a.engine.packed_weights = !a.no_packed_weights;
  a.engine.scheduler.batching = *parse_batching_mode(a.batching);
  auto served = load_served_model(a.model);
  if (!served.ok()) fail(served.status());
  const ModelConfig cfg = served->model->config();
  std::unique_ptr<Transformer> draft;
  if (!a.draft_model.empty()) {
    // The draft only needs weights: the target's tokenizer and chat template serve requests.
    auto d = load_model(a.draft_model);
    if (!d.ok()) fail(d.status());
    draft = std::move(*d);
    fmt::print("kiln serve: speculative decoding with draft '{}' ({}), {} draft tokens per step\n", a.draft_model,
               draft->config().describe(), a.engine.num_speculative);
  }
  auto engine = Engine::create(std::move(served->model), a.engine, std::move(draft));
  if (!engine.ok()) fail(engine.status());
  a.server.model_name = !a.served_name.empty() ? a.served_name
                                                : std::filesystem::path(a.model).lexically_normal().filename().string();
  if (a.server.model_name.empty()) a.server.model_name = "kiln";
  auto server = Server::create(**engine, std::move(served->tokenizer), std::move(served->chat), a.server);
  if (!server.ok()) fail(server.status());
  if (Status st = (*server)->bind(); !st.ok()) fail(st);
  const EngineMetrics m = (*engine)->metrics();
  fmt::print("kiln serve: model '{}' ({}), KV cache {} blocks x {} tokens ({:.1f} MiB, {} bytes/token), {} batching, "
             "max {} tokens/step, prefill chunk {}, max {} running\n",
             a.server.model_name, cfg.describe(), (*engine)->num_kv_blocks(), a.engine.block_size,
             double(m.kv_cache_bytes) / (1 << 20), m.kv_bytes_per_token, a.batching,
             a.engine.scheduler.max_batched_tokens, a.engine.scheduler.prefill_chunk, a.engine.scheduler.max_running);
  fmt::print("kiln serve: listening on http://{}:{}\n", a.server.host, (*server)->port());
  std::fflush(stdout);
  g_server = server->get();
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  (*server)->listen();
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  g_server = nullptr;
  (*engine)->stop();
  fmt::print("kiln serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* s = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, SSE, /metrics)");
  s->add_option("--model", a->model, "Model directory (config.json, model.safetensors, tokenizer.json)")->required();
  s->add_option("--host", a->server.host, "Address to bind (default loopback)");
  s->add_option("--port", a->server.port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
  s->add_option("--api-key", a->server.api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  s->add_option("--served-model-name", a->served_name, "Model id in the API (default: the directory name)");
  s->add_option("--kv-cache-mem", a->kv_mem, "KV-cache memory (e.g. 512M, 2G); sets the number of blocks");
  s->add_option("--block-size", a->engine.block_size, "Tokens per KV-cache block")->check(CLI::Range(1, 4096));
  s->add_option("--max-batched-tokens", a->engine.scheduler.max_batched_tokens, "Token budget of one engine step")
      ->check(CLI::Range(1, 1 << 20));
  s->add_option("--prefill-chunk", a->engine.scheduler.prefill_chunk, "Most prompt tokens one sequence runs per step")
      ->check(CLI::Range(1, 1 << 20));
  s->add_option("--max-running", a->engine.scheduler.max_running, "Sequences running at once")
      ->check(CLI::Range(1, 1 << 16));
  s->add_option("--batching", a->batching, "continuous (default) or static")
      ->check(CLI::IsMember({"continuous", "static"}));
  s->add_option("--draft-model", a->draft_model,
                "Speculative decoding: a smaller model directory with the same vocabulary proposes tokens");
  s->add_option("--num-speculative", a->engine.num_speculative, "Draft tokens per decode step (with --draft-model)")
      ->check(CLI::Range(1, 16));
  s->add_option("--speculative-max-batch", a->engine.speculative_max_batch,
                "Speculate only while at most this many sequences decode (0: always)")
      ->check(CLI::Range(0, 1 << 16));
  s->add_flag("--no-prefix-caching", a->no_prefix_caching, "Do not reuse cached prompt blocks");
  s->add_flag("--no-packed-weights", a->no_packed_weights,
              "Do not pack the fp32 weights once at start (the GEMM then packs them per call)");
  s->add_option("--http-threads", a->server.num_http_threads, "Connections served at once")
      ->check(CLI::Range(1, 4096));
  s->callback([a] { run_serve(*a); });
}

}  // namespace kiln::app
