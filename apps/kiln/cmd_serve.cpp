// `kiln serve --model DIR`: the OpenAI-compatible server (src/kiln/serve/server.h) over the
// serving engine, with the KV-cache and scheduler flags. Binds loopback unless --host says
// otherwise; SIGINT/SIGTERM drain it: running requests end with an error, replies finish
// within --drain-timeout, then it exits 0.
#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

#include "apps/kiln/commands.h"
#include "kiln/core/trace.h"
#include "kiln/model/weights.h"
#include "kiln/perf/profiler.h"
#include "kiln/serve/disaggregated.h"
#include "kiln/serve/server.h"
#include "kiln/serve/tensor_parallel.h"
#include "kiln/comm/communicator.h"

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
  int tp = 1;  // --tp: tensor-parallel ranks (mpirun -np T)
  std::string disaggregate;  // --disaggregate P:D (mpirun -np P+D)
  double disagg_timeout_s = 30;
  double request_timeout_s = 10, keep_alive_timeout_s = 5, drain_timeout_s = 10;
  std::string profile;  // --profile FILE.json: a trace from start to shutdown (rank 0)
  std::string graph = "eager";  // --graph eager | capture
};

// SIGINT/SIGTERM: the handler only writes the signal's number to a pipe (async-signal-safe,
// whichever thread it lands on); the main thread reads it and drains the server.
int g_signal_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int sig) {
  const char c = static_cast<char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &c, 1);
}

// Blocks until SIGINT/SIGTERM (returns its number) or until the server stopped by itself (0).
int wait_for_stop_signal(const Server& server) {
  for (;;) {
    pollfd p{g_signal_pipe[0], POLLIN, 0};
    if (::poll(&p, 1, 500) > 0) {
      char c = 0;
      if (::read(g_signal_pipe[0], &c, 1) == 1) return c;
    }
    if (!server.running()) return 0;
  }
}

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

void run_serve(ServeArgs a) {
  auto bytes = parse_bytes(a.kv_mem);
  if (!bytes.ok()) fail(bytes.status());
  a.engine.kv_cache_mem_bytes = *bytes;
  a.engine.enable_prefix_caching = !a.no_prefix_caching;
  a.engine.packed_weights = !a.no_packed_weights;
  apply_graph_mode(a.graph, a.engine.graph_capture, a.engine.graph_pass);
  a.engine.scheduler.batching = *parse_batching_mode(a.batching);
  a.server.request_timeout = millis(a.request_timeout_s);
  a.server.keep_alive_timeout = millis(a.keep_alive_timeout_s);
  auto served = load_served_model(a.model);
  if (!served.ok()) fail(served.status());
  // --tp with --draft-model: the target is sharded, the (small) draft runs whole on rank 0.
  if (!a.disaggregate.empty()) {  // the verdict on every rank before anything is sent
    comm::Communicator& world = comm::Communicator::world();
    Status verdict = parse_disaggregate(a.disaggregate, world.size()).status();
    if (verdict.ok() && (a.tp > 1 || !a.draft_model.empty() || a.batching != "continuous"))
      verdict = invalid_argument("--disaggregate runs with continuous batching, without --tp or --draft-model");
    if (!verdict.ok()) {
      if (world.rank() == 0) fmt::print(stderr, "kiln serve: {}\n", verdict.message());
      comm::finalize();
      throw CLI::RuntimeError(kUserError);
    }
  }
  if (a.tp > 1 && !serve_tensor_parallel(served->model, a.tp, "serve", &served->quantized)) return;  // a follower: done
  const ModelConfig cfg = served->model->config();
  // Disaggregated prefill and decode: rank 0 serves (and decodes); the others prefill until it stops.
  std::unique_ptr<comm::Communicator> disagg_comm;
  std::unique_ptr<MpiPrefillClient> remote;
  if (!a.disaggregate.empty()) {
    comm::Communicator& world = comm::Communicator::world();
    auto split = world.split(0, world.rank());  // its own communicator: no tag meets another's
    if (!split.ok()) fail(split.status());
    disagg_comm = std::move(*split);
    if (world.rank() != 0) {
      signal(SIGINT, SIG_IGN);
      signal(SIGTERM, SIG_IGN);
      const Status st = run_prefill_rank(*served->model, a.engine, *disagg_comm);
      disagg_comm.reset();
      comm::finalize();
      if (!st.ok()) {
        fmt::print(stderr, "kiln serve (prefill rank {}): {}\n", world.rank(), st.message());
        throw CLI::RuntimeError(kUserError);
      }
      return;
    }
    remote = std::make_unique<MpiPrefillClient>(*disagg_comm, cfg.n_layers, served->model->kv_row_width(),
                                                !cfg.is_mla(), a.disagg_timeout_s);
    a.engine.remote_prefill = remote.get();
  }
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
  if (remote) {
    fmt::print("kiln serve: disaggregated: {}\n", remote->describe());
    fmt::print("kiln serve: {}\n", comm::job_survives_rank_failure()
                                       ? "a prefill rank that dies fails the requests it holds; the others go on"
                                       : "a prefill rank that dies ends the job (mpirun --enable-recovery: its "
                                         "requests fail and serving goes on)");
  }
  fmt::print("kiln serve: listening on http://{}:{}\n", a.server.host, (*server)->port());
  std::fflush(stdout);
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) fail(internal_error("cannot create the signal pipe"));
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (!a.profile.empty()) trace::start();
  (*server)->start();
  const int sig = wait_for_stop_signal(**server);
  if (sig != 0) {
    fmt::print("kiln serve: {} received: draining (running requests end with an error; at most {} s)\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", a.drain_timeout_s);
    std::fflush(stdout);
  }
  (*server)->drain(millis(a.drain_timeout_s));
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  (*engine)->stop();
  if (const GraphStats* g = (*engine)->graph_stats()) fmt::print("kiln serve: {}\n", describe(*g));
  if (!a.profile.empty()) {  // written on shutdown
    auto report = perf::finish_profile(a.profile, nullptr, perf::run_profile_meta("serve " + a.model));
    if (!report.ok()) fmt::print(stderr, "kiln serve: {}\n", report.status().message());
    else fmt::print("kiln serve: {}", *report);
  }
  server->reset();
  engine->reset();  // tensor parallelism: the engine's executor tells the other ranks to stop
  if (remote && !remote->shutdown()) {  // a prefill rank was given up on: it may never finalize
    fmt::print(stderr, "kiln serve: a prefill rank stopped answering; ending the job\n");
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  remote.reset();
  disagg_comm.reset();
  fmt::print("kiln serve: stopped\n");
  if (a.tp > 1 || !a.disaggregate.empty()) comm::finalize();
}

}  // namespace

bool serve_tensor_parallel(std::unique_ptr<Transformer>& model, int tp, const char* cmd,
                           const quant::QuantizedState* quantized) {
  comm::Communicator& world = comm::Communicator::world();
  auto shard = shard_for_serving(*model, world, tp, quantized);
  if (!shard.ok()) {
    if (world.rank() == 0) fmt::print(stderr, "kiln {}: {}\n", cmd, shard.status().message());
    comm::finalize();
    throw CLI::RuntimeError(kUserError);
  }
  model = std::move(*shard);  // the whole model is freed
  if (world.rank() == 0) return true;
  // Rank 0 handles SIGINT/SIGTERM (mpirun forwards them to every rank) and stops the others.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  const Status s = follow_tensor_parallel_steps(*model);
  comm::finalize();
  if (!s.ok()) {
    fmt::print(stderr, "kiln {} (rank {}): {}\n", cmd, world.rank(), s.message());
    throw CLI::RuntimeError(kUserError);
  }
  return false;
}

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* s = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, SSE, /metrics)");
  s->add_option("--model", a->model, "Model directory (config.json, model.safetensors, tokenizer.json)")->required();
  s->add_option("--host", a->server.host, "Address to bind (default loopback)");
  s->add_option("--tp", a->tp, "Tensor-parallel ranks (run under mpirun -np T; rank 0 serves HTTP)")
      ->check(CLI::Range(1, 1 << 16));
  s->add_option("--disaggregate", a->disaggregate,
                "P:D prefill and decode ranks (mpirun -np P+D; rank 0 decodes and serves HTTP, the others prefill)");
  s->add_option("--disagg-timeout", a->disagg_timeout_s,
                "Seconds a prefill rank may send nothing while it holds prompts before its requests fail")
      ->check(CLI::Range(0.001, 3600.0));
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
  s->add_option("--batching", a->batching,
                "continuous (default), static (a new batch when the last is done) or classic (padded static: "
                "whole-length KV reserved, batch prefilled, then lockstep decode to its longest member)")
      ->check(CLI::IsMember({"continuous", "static", "classic"}));
  s->add_option("--draft-model", a->draft_model,
                "Speculative decoding: a smaller model directory with the same vocabulary proposes tokens");
  s->add_option("--num-speculative", a->engine.num_speculative, "Draft tokens per decode step (with --draft-model)")
      ->check(CLI::Range(1, 16));
  s->add_option("--speculative-max-batch", a->engine.speculative_max_batch,
                "Speculate only while at most this many sequences decode (0: always)")
      ->check(CLI::Range(0, 1 << 16));
  s->add_flag("--no-prefix-caching", a->no_prefix_caching, "Do not reuse cached prompt blocks");
  s->add_option("--graph", a->graph, "eager (default) | capture: decode steps replay a captured graph per batch size "
                                     "| fused: and its elementwise chains run as JIT-compiled kernels")
      ->check(CLI::IsMember({"eager", "capture", "fused"}));
  s->add_flag("--no-packed-weights", a->no_packed_weights,
              "Do not pack the fp32 weights once at start (the GEMM then packs them per call)");
  s->add_option("--http-threads", a->server.num_http_threads, "Requests served at once (a stream holds one)")
      ->check(CLI::Range(1, 4096));
  s->add_option("--max-connections", a->server.max_connections,
                "Open connections at most (idle and slow ones included); more are answered 503")
      ->check(CLI::Range(1, 1 << 20));
  s->add_option("--request-timeout", a->request_timeout_s,
                "Seconds within which a request's bytes must all arrive (else 408)")
      ->check(CLI::Range(0.001, 3600.0));
  s->add_option("--keep-alive-timeout", a->keep_alive_timeout_s, "Seconds an idle kept-alive connection stays open")
      ->check(CLI::Range(0.001, 3600.0));
  s->add_option("--drain-timeout", a->drain_timeout_s,
                "On SIGTERM/SIGINT: seconds replies may take to finish before their connections are closed")
      ->check(CLI::Range(0.0, 3600.0));
  s->add_option("--profile", a->profile, "Write a Chrome/Perfetto trace on shutdown (FILE.json): engine steps, kernels");
  s->callback([a] { run_serve(*a); });
}

}  // namespace kiln::app
