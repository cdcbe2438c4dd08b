// `kiln bench tp-decode` (issue 18's serving figures, BENCH.md W2-S): decode through the serving
// engine with the model split over the tp ranks of mpirun (kiln serve --tp's path: rank 0 runs
// the engine and broadcasts each step; every rank runs its shard), batch 1 and 8, prefill 128
// tokens then 128 decoded. Prints decode tokens/s and the share of rank 0's time blocked in the
// tensor-parallel collectives. Run it at tp 1 (one process, 2 threads) and tp 2 (2 ranks × 1
// thread) on the same machine and compare the lines: both read the same weight bytes per step
// from the one DRAM they share; tp trades the thread pool's fork-join per op for collectives.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "kiln/comm/communicator.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/model/config.h"
#include "kiln/run/train_run.h"
#include "kiln/serve/engine.h"
#include "kiln/serve/generate.h"
#include "kiln/serve/tensor_parallel.h"

namespace kiln::app {
namespace {

struct TpDecodeOptions {
  std::string preset = "w2-s";
  int64_t prompt = 128, decode = 128;
  std::vector<int64_t> batches = {1, 8};
  int repeats = 3;  // the best of these per batch, after one untimed warm-up run
};

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "kiln bench tp-decode: {}\n", s.message());
  throw CLI::RuntimeError(kUserError);
}

// One request of `batch` samples (they share the prompt's blocks, then decode together):
// seconds for prefill + 1 token, and for prefill + `decode` tokens, the best of `repeats`.
struct Timing {
  double first = 1e30, all = 1e30, tp_seconds = 0, tp_all = 0;
};

Timing time_batch(Engine& e, Transformer& model, const TpDecodeOptions& o, int64_t batch) {
  Rng rng(5);
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt));
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(model.config().vocab_size)));
  GenerationParams p;
  p.n = batch;
  p.sampling.temperature = 1.0f;  // distinct samples; no stop token: every sample decodes `decode` tokens
  p.seed = 3;
  Timing t;
  p.max_tokens = o.decode;  // warm-up: first-touch of the KV blocks and packed weights, caches
  if (auto g = generate(e, prompt, p); !g.ok()) fail(g.status());
  for (int r = 0; r < o.repeats; ++r) {
    for (int64_t len : {int64_t{1}, o.decode}) {
      p.max_tokens = len;
      (void)model.take_tp_traffic();
      auto g = generate(e, prompt, p);
      if (!g.ok()) fail(g.status());
      const double tp = model.take_tp_traffic().seconds;
      if (len == 1) {
        if (g->seconds < t.first) { t.first = g->seconds; t.tp_seconds = tp; }
      } else if (g->seconds < t.all) {
        t.all = g->seconds;
        t.tp_all = tp;
      }
    }
  }
  return t;
}

void run(const TpDecodeOptions& o) {
  auto cfg = preset(o.preset);
  if (!cfg.ok()) fail(cfg.status());
  cfg->max_seq_len = std::max(cfg->max_seq_len, o.prompt + o.decode);
  const bool mpi = run::launched_by_mpi();
  comm::Communicator* world = mpi ? &comm::Communicator::world() : nullptr;
  const int tp = world ? world->size() : 1;
  auto full = Transformer::create(*cfg, 1);  // random weights: decode speed does not depend on them
  if (!full.ok()) fail(full.status());
  std::unique_ptr<Transformer> model = std::move(*full);
  if (world) {
    auto shard = shard_for_serving(*model, *world, tp);
    if (!shard.ok()) {
      if (world->rank() == 0) fmt::print(stderr, "kiln bench tp-decode: {}\n", shard.status().message());
      comm::finalize();
      throw CLI::RuntimeError(kUserError);
    }
    model = std::move(*shard);
    if (world->rank() != 0) {
      const Status s = follow_tensor_parallel_steps(*model);
      comm::finalize();
      if (!s.ok()) fail(s);
      return;
    }
  }
  Transformer& m = *model;
  EngineConfig ec;
  ec.kv_cache_mem_bytes = int64_t{256} << 20;
  auto engine = Engine::create(std::move(model), ec);
  if (!engine.ok()) fail(engine.status());
  fmt::print("# {} ({}), tp {} × {} thread(s) per rank; prefill {} then {} decoded tokens; best of {} after a warm-up\n", o.preset,
             cfg->describe(), tp, num_threads(), o.prompt, o.decode, o.repeats);
  for (int64_t b : o.batches) {
    const Timing t = time_batch(**engine, m, o, b);
    const double decode_s = t.all - t.first;
    const double tok_s = static_cast<double>(b * (o.decode - 1)) / decode_s;
    const double tp_pct = decode_s > 0 ? 100.0 * (t.tp_all - t.tp_seconds) / decode_s : 0.0;
    fmt::print("tp {} threads {} batch {} prefill_ms {:.1f} decode_tok_s {:.1f} ms_per_step {:.2f} tp_comm_pct {:.1f}\n",
               tp, num_threads(), b, 1e3 * t.first, tok_s, 1e3 * decode_s / static_cast<double>(o.decode - 1), tp_pct);
  }
  if (tp > 1)
    fmt::print("# note: the ranks of one machine share its DRAM bandwidth, which decode is bound by (each step reads\n"
               "# the weights once); here tp trades the thread pool's fork-join per op for the collectives. Across GPUs\n"
               "# each rank has its own memory bandwidth and tp divides the bytes per rank.\n");
  engine->reset();  // tells the followers to stop
  if (world) comm::finalize();
}

}  // namespace

void register_bench_tp_decode(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto o = std::make_shared<TpDecodeOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "tp-decode", "W2-S decode through the serving engine at tp = the ranks of mpirun (serve --tp's path)");
  cmd->add_option("--preset", o->preset, "Model preset (default w2-s)");
  cmd->add_option("--prompt", o->prompt, "Prompt tokens")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->add_option("--decode", o->decode, "Decoded tokens")->check(CLI::Range(int64_t{2}, int64_t{1} << 16));
  cmd->add_option("--batch", o->batches, "Batch sizes (samples decoding together)")->check(CLI::Range(int64_t{1}, int64_t{64}));
  cmd->add_option("--repeats", o->repeats, "Runs per batch (the best is kept)")->check(CLI::Range(1, 100));
  cmd->callback([o] { run(*o); });
}

}  // namespace kiln::app
