// `kiln bench graph` (issue 22): the serving decode step eager vs replayed from its captured
// graph (serve/graph_bench.h), per batch size, in one run: ms per step, the ratio, the graph's
// nodes and levels, what each op costs eagerly beyond its kernel, and the activation memory
// the graph's arena plan needs beside eager's buffers.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "apps/kiln/commands.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/thread_pool.h"
#include "kiln/serve/graph_bench.h"

namespace kiln::app {
namespace {

struct GraphBenchArgs {
  std::string preset = "llama-tiny";
  int64_t d_model = 0, layers = 0;  // overrides (0: the preset's), for small, overhead-bound shapes
  GraphBenchOptions bench;
  bool fused = false;  // a third column: the graphs after the fusion pass
};

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "kiln bench graph: {}\n", s.message());
  throw CLI::RuntimeError(kUserError);
}

void run(GraphBenchArgs a) {
  auto cfg = preset(a.preset);
  if (!cfg.ok()) fail(cfg.status());
  if (a.d_model > 0) {
    cfg->d_model = a.d_model;
    cfg->d_ff = cfg->is_llama() ? a.d_model * 8 / 3 / 16 * 16 : 4 * a.d_model;
  }
  if (a.layers > 0) cfg->n_layers = a.layers;
  if (Status s = check_config(*cfg); !s.ok()) fail(s);
  a.bench.config = *cfg;
  if (a.fused) a.bench.pass = graph_fusion_pass();
  auto rows = run_graph_bench(a.bench);
  if (!rows.ok()) fail(rows.status());
  fmt::print("# decode step of {} ({}), {} cached positions, {} steps per run, median of {} runs; {} threads; {}\n",
             a.preset, cfg->describe(), a.bench.cached, a.bench.steps, a.bench.reps, num_threads(), cpu_features().brand);
  fmt::print("{:>4} | {:>9} {:>9} {:>7} | {:>5} {:>6} {:>11} | {:>10} {:>10} | {:<9} | {}\n", "S", "eager ms", "graph ms",
             "speedup", "nodes", "levels", "us/op saved", "eager KiB", "arena KiB", "logits", a.fused ? "fused" : "");
  for (const GraphBenchRow& r : *rows)
    fmt::print("{:>4} | {:>9.3f} {:>9.3f} {:>6.2f}x | {:>5} {:>6} {:>11.2f} | {:>10.1f} {:>10.1f} | {:<9} | {}\n", r.seqs,
               r.eager_s * 1e3, r.replay_s * 1e3, r.eager_s / r.replay_s, r.nodes, r.levels,
               r.overhead_per_op_s() * 1e6, r.eager_bytes / 1024.0, r.arena_bytes / 1024.0,
               r.same_logits ? "identical" : "DIFFER",
               a.fused ? fmt::format("{:.3f} ms, {:.2f}x eager, {} nodes fused", r.fused_s * 1e3, r.eager_s / r.fused_s,
                                     r.fused_nodes)
                       : std::string());
}

}  // namespace

void register_bench_graph(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto a = std::make_shared<GraphBenchArgs>();
  CLI::App* cmd = bench->add_subcommand("graph", "Decode steps eager vs replayed from a captured graph (per batch size)");
  cmd->add_option("--preset", a->preset, "Model preset (random weights), e.g. llama-tiny, w2-s");
  cmd->add_option("--d-model", a->d_model, "Override the preset's width (d_ff follows; heads stay)")->check(CLI::Range(8, 1 << 16));
  cmd->add_option("--layers", a->layers, "Override the preset's layer count")->check(CLI::Range(1, 1 << 10));
  cmd->add_option("--seqs", a->bench.seqs, "Batch sizes, e.g. 1,4,16")->delimiter(',')->check(CLI::Range(1, 1024));
  cmd->add_option("--cached", a->bench.cached, "Positions already cached per sequence")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--steps", a->bench.steps, "Decode steps per timed run")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--reps", a->bench.reps, "Timed runs (median)")->check(CLI::Range(1, 1000));
  cmd->add_flag("--fused", a->fused, "Also replay the graphs after the fusion pass (--graph fused)");
  cmd->add_flag("--split-epilogues", a->bench.split_epilogues,
                "Each GEMM's bias and residual as kernels of their own (PyTorch eager's shape), for --fused to fuse");
  cmd->callback([a] { run(*a); });
}

}  // namespace kiln::app
