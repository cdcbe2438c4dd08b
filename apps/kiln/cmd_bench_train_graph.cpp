// `kiln bench train-graph` (issue 22): whole training steps (the Trainer's: data, forward,
// backward, unscale, clip, AdamW) of one workload in several modes, each its own model and
// trainer from the same seed, interleaved step by step (the order rotating every round) so the
// machine's drift falls on all alike:
//   eager      the eager step, profiler off
//   eager-b    a second eager trainer: the A/A pair, what this machine's noise floor is
//   capture    the step replayed from its captured joint graph (--graph capture)
//   fused      the same after the fusion pass (--graph fused)
//   profiled   the eager step with the trace recorder on (--profile), events dropped per step
//   split      eager with each GEMM's bias and residual as kernels of their own (PyTorch eager's
//              unfused shape; Transformer::set_split_epilogues)
//   split-fused  that, captured, after the fusion pass: what the pass recovers
// Per mode: the median step time and tokens/s, and against eager the median of the per-round
// ratios (paired, so slow phases of the machine cancel) with its quartiles.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "bench/parallel_bench_util.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/median.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"
#include "kiln/train/trainer.h"

namespace kiln::app {
namespace {

struct TrainGraphBenchArgs {
  std::string workload = "W1a";
  std::string preset;           // instead of a workload: a preset at --batch × --seq
  int64_t batch = 2, seq = 64;  // with --preset
  int steps = 20, warmup = 2;
  std::vector<std::string> modes = {"eager", "eager-b", "capture", "fused", "profiled", "split", "split-fused"};  // all
};

struct Mode {
  std::string name;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<Trainer> trainer;
  std::vector<double> seconds;
  float last_loss = 0;
  int64_t events = 0;  // trace events of the last profiled step
};

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "kiln bench train-graph: {}\n", s.message());
  throw CLI::RuntimeError(kUserError);
}

// The q-quantile of v (nearest rank).
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

void run(const TrainGraphBenchArgs& a) {
  ModelConfig cfg;
  int64_t batch = a.batch, seq = a.seq;
  std::string what;
  if (!a.preset.empty()) {
    auto c = preset(a.preset);
    if (!c.ok()) fail(c.status());
    cfg = *c;
    what = a.preset;
  } else {
    auto w = bench::parallel_workload(a.workload);
    if (!w.ok()) fail(w.status());
    cfg = w->cfg;
    batch = w->batch;
    seq = w->seq_len;
    what = w->name;
  }
  if (seq > cfg.max_seq_len) fail(invalid_argument("--seq {} exceeds the model's max_seq_len {}", seq, cfg.max_seq_len));
  if (a.modes.empty() || a.modes.front() != "eager")
    fail(invalid_argument("--modes: the first mode must be eager (the others are reported against it)"));
  const TokenShard data = bench::random_tokens(cfg.vocab_size);
  TrainOptions t = bench::bench_train_options(batch, seq, a.warmup + a.steps, 1);
  std::vector<Mode> modes;
  for (const std::string& name : a.modes) {
    Mode m;
    m.name = name;
    auto model = Transformer::create(cfg, 1);
    if (!model.ok()) fail(model.status());
    m.model = std::move(*model);
    TrainOptions o = t;
    o.split_epilogues = name == "split" || name == "split-fused";
    o.graph_capture = name == "capture" || name == "fused" || name == "split-fused";
    if (name == "fused" || name == "split-fused") o.graph_pass = graph_fusion_pass();
    m.trainer = std::make_unique<Trainer>(*m.model, data, nullptr, o);
    modes.push_back(std::move(m));
  }
  const size_t n = modes.size();
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    for (size_t k = 0; k < n; ++k) {
      Mode& m = modes[(k + static_cast<size_t>(s)) % n];  // rotate: no mode always runs first
      const bool profiled = m.name == "profiled";
      if (profiled) trace::start();
      const StepStats st = m.trainer->step();
      if (profiled) {
        trace::stop();
        m.events = 0;
        for (const trace::ThreadEvents& te : trace::snapshot()) m.events += static_cast<int64_t>(te.events.size());
      }
      if (s >= a.warmup) m.seconds.push_back(st.seconds);
      m.last_loss = st.loss;
    }
  }
  fmt::print("# kiln bench train-graph: {} ({}), batch {} x seq {}, {} steps after {} warm-up, modes interleaved; "
             "{} threads; {}\n",
             what, cfg.describe(), batch, seq, a.steps, a.warmup, num_threads(), cpu_features().brand);
  fmt::print("{:<11} | {:>9} {:>10} | {:>9} {:>16} | {:>9} | {}\n", "mode", "step ms", "tokens/s", "t/t_eager",
             "paired q1..q3", "last loss", "graph / profile");
  const std::vector<double>& base = modes.front().seconds;
  for (const Mode& m : modes) {
    std::vector<double> ratio;
    for (size_t i = 0; i < m.seconds.size(); ++i) ratio.push_back(m.seconds[i] / base[i]);
    const double step = median(m.seconds);
    std::string note;
    if (const graph::GraphStats* g = m.trainer->graph_stats()) {
      note = fmt::format("{} nodes, {} levels, {} replayed, {} fused, arena {:.1f} of {:.1f} MiB", g->nodes, g->levels,
                         g->replays, g->fused_nodes, g->arena_bytes / 1048576.0, g->eager_bytes / 1048576.0);
      if (!g->breaks.empty()) note += "; break: " + g->breaks.front();
    }
    if (m.name == "profiled") note = fmt::format("{} events per step", m.events);
    fmt::print("{:<11} | {:>9.2f} {:>10.1f} | {:>7.3f}x {:>8.3f}..{:<7.3f} | {:>9.4f} | {}\n", m.name, step * 1e3,
               static_cast<double>(batch * seq) / step, median(ratio), quantile(ratio, 0.25), quantile(ratio, 0.75),
               m.last_loss, note);
  }
  fmt::print("# t/t_eager: the median over steps of (this mode's step time / eager's step time in the same round); "
             "eager-b is a second eager trainer (the noise floor)\n");
}

}  // namespace

void register_bench_train_graph(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto a = std::make_shared<TrainGraphBenchArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "train-graph", "Training steps eager vs captured vs fused vs profiled, interleaved in one run (W1a by default)");
  cmd->add_option("--workload", a->workload, "W1a | W1b (BENCH.md)");
  cmd->add_option("--preset", a->preset, "A model preset instead (random weights) at --batch x --seq, e.g. llama-tiny");
  cmd->add_option("--batch", a->batch, "Rows per step with --preset")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--seq", a->seq, "Tokens per row with --preset")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--steps", a->steps, "Timed steps per mode")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", a->warmup, "Untimed steps per mode first")->check(CLI::Range(0, 1000));
  cmd->add_option("--modes", a->modes,
                  "Comma list, eager first: eager, eager-b, capture, fused, profiled, split, split-fused")
      ->delimiter(',')
      ->check(CLI::IsMember(TrainGraphBenchArgs().modes));
  cmd->callback([a] { run(*a); });
}

}  // namespace kiln::app
