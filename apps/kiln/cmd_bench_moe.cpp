// `kiln bench moe` (BENCH.md W1-MoE): the MoE layer and its training, in sections printable
// alone (--only):
//   gemm      the W1-MoE layer's expert GEMMs, one grouped call vs a gemm per expert
//             (bench/grouped_gemm_bench.h), under balanced, Zipf and a random router's routing;
//   balance   llama-moe-tiny trained on the KJV corpus with and without the load-balancing loss
//             (same seed and steps): tokens per expert max / mean per step, a table, an SVG, and
//             both final validation losses;
//   capacity  the balanced model's weights under capacity factors: drop rate and validation loss;
//   ep        (mpirun -np 2) training steps at ep 2 over dispatch chunks against ep 1 (DDP), the
//             all-to-all time and its exposed share, one thread per rank;
//   torch     the W1-MoE layer's forward + backward beside PyTorch eager's Mixtral-style loop
//             (bench/torch_moe.py) at each thread count, `ratio: X` = torch ms / kiln ms.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "bench/bench_util.h"
#include "bench/grouped_gemm_bench.h"
#include "bench/moe_layer_bench.h"
#include "bench/parallel_bench_util.h"
#include "kiln/comm/communicator.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/env.h"
#include "kiln/core/thread_pool.h"
#include "kiln/model/config.h"
#include "kiln/model/weights.h"
#include "kiln/parallel/expert_parallel.h"
#include "kiln/perf/svg.h"
#include "kiln/run/train_run.h"
#include "kiln/train/corpus.h"
#include "kiln/train/trainer.h"

namespace kiln::app {
namespace {

constexpr const char* kCmd = "kiln bench moe";
const std::vector<std::string> kSections = {"gemm", "balance", "capacity", "ep", "torch"};

struct MoeBenchOptions {
  std::vector<std::string> only = {"all"};
  std::vector<int> threads = {1, 2};  // gemm and torch: each count; balance and capacity: the largest
  int reps = 5;
  uint64_t seed = 1;
  // balance and capacity
  std::string preset = "llama-moe-tiny";
  std::string data = "data/kjv";
  int64_t steps = 200, print_every = 20, eval_batches = 8;
  double aux_coef = 0.01;
  std::vector<double> capacity_factors = {1.0, 1.25, 2.0};
  std::string svg = "moe_balance.svg";
  std::string save;  // a directory: the model trained with the balancing loss (kiln save_model)
  // ep
  std::vector<int> ep_chunks = {1, 2, 4};
  int ep_steps = 5, ep_warmup = 2;
  std::string load;  // a directory from --save: ep trains from those weights (its routing)
  // torch
  std::string python = "/work/V/bin/python";
  std::string torch_script = "bench/torch_moe.py";
};

bool wants(const std::vector<std::string>& only, const std::string& s) {
  return std::find(only.begin(), only.end(), s) != only.end();
}

// The sections to run: --only checked, "all" resolved for this launch (under mpirun: ep alone;
// otherwise every other section).
Expected<std::vector<std::string>> resolve_sections(const MoeBenchOptions& o, bool mpi) {
  std::vector<std::string> out;
  for (const std::string& s : o.only) {
    if (s == "all") {
      for (const std::string& k : kSections)
        if ((k == "ep") == mpi && !wants(out, k)) out.push_back(k);
    } else if (std::find(kSections.begin(), kSections.end(), s) == kSections.end()) {
      return invalid_argument("--only {}: gemm, balance, capacity, ep, torch or all expected", s);
    } else if (!wants(out, s)) {
      out.push_back(s);
    }
  }
  const bool ep = wants(out, "ep");
  if (ep && !mpi) return invalid_argument("--only ep runs under mpirun -np 2 (one thread per rank)");
  if (mpi && (!ep || out.size() > 1))
    return invalid_argument("under mpirun only the ep section runs (--only ep); run the others in one process");
  for (double cf : o.capacity_factors)
    if (!(cf > 0) || !std::isfinite(cf)) return invalid_argument("--capacity-factors {}: positive numbers expected", cf);
  return out;
}

// ---- gemm ----------------------------------------------------------------------------------

int run_gemm(const MoeBenchOptions& o) {
  fmt::print("\n## gemm: W1-MoE expert GEMMs, grouped vs a loop per expert\n");
  bench::MoeLayerShape shape;
  bench::GroupedBenchOptions g;
  g.command = fmt::format("{} --only gemm", kCmd);
  g.routings = {"e8-balanced", "e8-zipf"};
  bench::MoeLayerBench layer(shape, o.seed);
  layer.forward();  // a random router's counts: what the torch section's layer routes
  g.counted.emplace_back("e8-router", layer.tokens_per_expert());
  g.threads = o.threads;
  g.reps = o.reps;
  g.tokens = shape.tokens;
  g.d_model = shape.d_model;
  g.ffn = shape.ffn;
  g.top_k = shape.top_k;
  return bench::run_grouped_gemm_bench(g);
}

// ---- balance and capacity ------------------------------------------------------------------

struct Corpus {
  TokenShard train, val;
  std::string dir;
};

Expected<Corpus> load_corpus(const std::string& dir) {
  PrepareOptions p;
  p.out_dir = dir;
  std::string log;
  KILN_ASSIGN_OR_RETURN(const CorpusPaths paths, prepare_corpus(p, &log));
  Corpus c;
  c.dir = paths.dir;
  KILN_ASSIGN_OR_RETURN(c.train, read_shard(paths.train));
  KILN_ASSIGN_OR_RETURN(c.val, read_shard(paths.val));
  return c;
}

Expected<ModelConfig> corpus_config(const std::string& name, const Corpus& d) {
  auto cfg = preset(name);
  if (!cfg.ok()) return invalid_argument("--preset: {}", cfg.status().message());
  if (!cfg->is_moe()) return invalid_argument("--preset {}: not a MoE model (llama-moe-tiny or w1-moe)", name);
  cfg->vocab_size = d.train.vocab_size;
  return *cfg;
}

TrainOptions balance_train_options(const ModelConfig& cfg, const MoeBenchOptions& o) {
  TrainOptions t;
  t.batch = 8;
  t.seq_len = std::min<int64_t>(256, cfg.max_seq_len);
  t.max_steps = o.steps;
  t.warmup_steps = std::min<int64_t>(50, std::max<int64_t>(1, o.steps / 4));
  t.eval_every = 0;
  t.seed = o.seed;
  return t;
}

// Mean over blocks of each block's max / mean tokens per expert (MoeStats::max_over_mean is the
// worst block's).
double mean_block_load(const MoeStats& s) {
  if (s.blocks == 0 || s.tokens_per_expert.empty()) return 0;
  const auto E = static_cast<int64_t>(s.tokens_per_expert.size()) / s.blocks;
  double sum = 0;
  for (int64_t b = 0; b < s.blocks; ++b) {
    const auto first = s.tokens_per_expert.begin() + b * E;
    const double mean = static_cast<double>(std::accumulate(first, first + E, int64_t{0})) / static_cast<double>(E);
    if (mean > 0) sum += static_cast<double>(*std::max_element(first, first + E)) / mean;
  }
  return sum / static_cast<double>(s.blocks);
}

struct BalanceRun {
  double aux_coef = 0;
  std::vector<double> loss, aux, worst, mean_block;  // per step
  double val_loss = 0, seconds = 0;
  std::unique_ptr<Transformer> model;
};

Expected<BalanceRun> train_balance(ModelConfig cfg, double aux_coef, const Corpus& d, const MoeBenchOptions& o) {
  cfg.router_aux_loss_coef = aux_coef;
  BalanceRun r;
  r.aux_coef = aux_coef;
  KILN_ASSIGN_OR_RETURN(r.model, Transformer::create(cfg, o.seed));
  const TrainOptions t = balance_train_options(cfg, o);
  Trainer trainer(*r.model, d.train, &d.val, t);
  while (!trainer.done()) {
    const StepStats s = trainer.step();
    r.loss.push_back(s.loss);
    r.aux.push_back(s.moe.aux_mean());
    r.worst.push_back(s.moe.max_over_mean());
    r.mean_block.push_back(mean_block_load(s.moe));
    r.seconds += s.seconds;
    if (s.step % o.print_every == 0) {
      fmt::print("#   aux coef {}: step {}/{} loss {:.3f} load {:.2f}x\n", aux_coef, s.step, o.steps, s.loss,
                 r.worst.back());
      std::fflush(stdout);
    }
  }
  r.val_loss = evaluate(*r.model, d.val, t.batch, t.seq_len, o.eval_batches);
  (void)r.model->take_moe_stats();
  return r;
}

void write_balance_svg(const std::vector<BalanceRun>& runs, const std::string& preset_name, const std::string& path) {
  std::vector<Series> series;
  const char* colors[] = {"#1f77b4", "#d62728"};
  const char* light[] = {"#9ecae1", "#fcae91"};
  for (size_t i = 0; i < runs.size(); ++i) {
    Series worst{fmt::format("aux coef {}: worst block", runs[i].aux_coef), {}, colors[i % 2], false};
    Series mean{fmt::format("aux coef {}: mean over blocks", runs[i].aux_coef), {}, light[i % 2], false};
    for (size_t s = 0; s < runs[i].worst.size(); ++s) {
      worst.points.emplace_back(static_cast<double>(s + 1), runs[i].worst[s]);
      mean.points.emplace_back(static_cast<double>(s + 1), runs[i].mean_block[s]);
    }
    series.push_back(std::move(worst));
    series.push_back(std::move(mean));
  }
  ChartOptions chart;
  chart.title = fmt::format("{} on KJV: tokens per expert, max / mean, per training step", preset_name);
  chart.x_label = "step";
  chart.y_label = "max / mean tokens per expert (1 = balanced)";
  chart.width = 860;
  std::ofstream(path) << line_chart_svg(series, chart);
}

int run_balance(const MoeBenchOptions& o, const Corpus& d, const ModelConfig& cfg, std::vector<BalanceRun>& runs) {
  const TrainOptions t = balance_train_options(cfg, o);
  fmt::print("\n## balance: {} on {} ({} train tokens), {} steps, batch {} x seq {}, seed {}, {} threads\n", o.preset,
             d.dir, d.train.tokens.size(), o.steps, t.batch, t.seq_len, o.seed, num_threads());
  fmt::print("# model: {}; router z-loss coef {}\n", cfg.describe(), cfg.router_z_loss_coef);
  for (double coef : {o.aux_coef, 0.0}) {
    auto r = train_balance(cfg, coef, d, o);
    if (!r.ok()) {
      fmt::print(stderr, "{} --only balance: {}\n", kCmd, r.status().message());
      return 1;
    }
    runs.push_back(std::move(*r));
  }
  const BalanceRun &on = runs[0], &off = runs[1];
  fmt::print("load = max / mean tokens per expert of the step (worst block; mean over the {} blocks in brackets)\n",
             cfg.num_moe_layers());
  fmt::print("| step | aux {} loss | aux | load | aux 0 loss | aux | load |\n|---|---|---|---|---|---|---|\n",
             on.aux_coef);
  for (size_t s = 0; s < on.loss.size(); ++s) {
    const auto step = static_cast<int64_t>(s + 1);
    if (step != 1 && step % o.print_every != 0 && s + 1 != on.loss.size()) continue;
    fmt::print("| {} | {:.3f} | {:.3f} | {:.2f}x ({:.2f}x) | {:.3f} | {:.3f} | {:.2f}x ({:.2f}x) |\n", step,
               on.loss[s], on.aux[s], on.worst[s], on.mean_block[s], off.loss[s], off.aux[s], off.worst[s],
               off.mean_block[s]);
  }
  auto mean_last = [](const std::vector<double>& v) {  // the last quarter of the run
    const size_t from = v.size() - std::max<size_t>(1, v.size() / 4);
    return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from), v.end(), 0.0) /
           static_cast<double>(v.size() - from);
  };
  fmt::print("mean load over the last quarter of the steps: aux {} {:.2f}x ({:.2f}x), aux 0 {:.2f}x ({:.2f}x)\n",
             on.aux_coef, mean_last(on.worst), mean_last(on.mean_block), mean_last(off.worst),
             mean_last(off.mean_block));
  fmt::print("final validation loss ({} batches): aux {} {:.4f}, aux 0 {:.4f} (difference {:+.4f}); train time {:.0f} s, "
             "{:.0f} s\n",
             o.eval_batches, on.aux_coef, on.val_loss, off.val_loss, on.val_loss - off.val_loss, on.seconds,
             off.seconds);
  write_balance_svg(runs, o.preset, o.svg);
  fmt::print("svg: {}\n", o.svg);
  if (!o.save.empty()) {
    if (const Status st = save_model(o.save, *on.model); !st.ok()) {
      fmt::print(stderr, "{} --save {}: {}\n", kCmd, o.save, st.message());
      return 1;
    }
    fmt::print("saved the aux {} model: {}\n", on.aux_coef, o.save);
  }
  return 0;
}

int run_capacity(const MoeBenchOptions& o, const Corpus& d, Transformer& trained) {
  const ModelConfig& base = trained.config();
  const TrainOptions t = balance_train_options(base, o);
  const int64_t N = t.batch * t.seq_len, K = base.num_experts_per_tok, E = base.num_experts;
  fmt::print("\n## capacity: the aux {} model's weights under capacity factors, {} validation batches of {} tokens\n",
             base.router_aux_loss_coef, o.eval_batches, N);
  fmt::print("| capacity factor | capacity per expert | drop rate | load | val loss |\n|---|---|---|---|---|\n");
  std::vector<double> factors = {0.0};
  factors.insert(factors.end(), o.capacity_factors.begin(), o.capacity_factors.end());
  for (double cf : factors) {
    ModelConfig cfg = base;
    cfg.capacity_factor = cf;
    auto model = Transformer::create(cfg, o.seed);
    if (!model.ok()) {
      fmt::print(stderr, "{} --only capacity: {}\n", kCmd, model.status().message());
      return 1;
    }
    KILN_CHECK((*model)->num_params() == trained.num_params());  // the same layout
    std::copy(trained.params().begin(), trained.params().end(), (*model)->params().begin());
    (void)(*model)->take_moe_stats();
    const double val = evaluate(**model, d.val, t.batch, t.seq_len, o.eval_batches);
    const MoeStats s = (*model)->take_moe_stats();
    const std::string cap =
        cf > 0 ? fmt::format("{}", static_cast<int64_t>(std::ceil(cf * static_cast<double>(K * N) / E))) : "-";
    fmt::print("| {} | {} | {:.2f}% | {:.2f}x | {:.4f} |\n", cf > 0 ? fmt::format("{}", cf) : "dropless", cap,
               100 * s.drop_rate(), s.max_over_mean(), val);
  }
  fmt::print("# capacity per expert = ceil(CF x k x N / E), N = {} tokens a forward; a dropped assignment adds "
             "nothing (the token keeps its residual and its other expert); load: worst block's max / mean\n",
             N);
  return 0;
}

// ---- ep ------------------------------------------------------------------------------------

struct EpRow {
  int ep = 1, chunks = 1;
  bench::Summary step_ms;
  double step_mean = 0, a2a_ms = 0, a2a_exposed_ms = 0, grad_ms = 0, grad_exposed_ms = 0, a2a_mib = 0, load = 0;
};

double max_over_ranks(comm::Communicator& c, double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, c.handle());
  return x;
}

Expected<EpRow> measure_ep(int ep, int chunks, const ModelConfig& cfg, const std::vector<float>& full,
                           const TokenShard& data, const MoeBenchOptions& o) {
  comm::Communicator& world = comm::Communicator::world();
  const TrainOptions t = bench::bench_train_options(8, 256, o.ep_warmup + o.ep_steps, o.seed);
  parallel::ExpertParallelOptions eo{ep, chunks};
  KILN_RETURN_IF_ERROR(parallel::check_expert_parallel(eo, cfg, world.size(), {}, t));
  KILN_ASSIGN_OR_RETURN(auto plan, parallel::ExpertParallelPlan::create(world, eo, {}, cfg, t));
  KILN_ASSIGN_OR_RETURN(auto model, Transformer::create(cfg, o.seed, {}, {}, plan->shard()));
  if (!full.empty()) model->load_from_full(full);
  Trainer trainer(*model, data, nullptr, t, plan.get());
  for (int s = 0; s < o.ep_warmup; ++s) (void)trainer.step();
  EpRow r;
  r.ep = ep;
  r.chunks = chunks;
  std::vector<double> ms;
  for (int s = 0; s < o.ep_steps; ++s) {
    const StepStats st = trainer.step();
    ms.push_back(1e3 * max_over_ranks(world, st.seconds));
    r.a2a_ms += 1e3 * max_over_ranks(world, st.moe.all_to_all_seconds) / o.ep_steps;
    r.a2a_exposed_ms += 1e3 * max_over_ranks(world, st.moe.exposed_seconds) / o.ep_steps;
    r.grad_ms += 1e3 * max_over_ranks(world, st.comm.comm_seconds) / o.ep_steps;
    r.grad_exposed_ms += 1e3 * max_over_ranks(world, st.comm.exposed_seconds) / o.ep_steps;
    r.a2a_mib += max_over_ranks(world, static_cast<double>(st.moe.all_to_all_bytes)) / (1 << 20) / o.ep_steps;
    r.load += st.moe.max_over_mean() / o.ep_steps;
  }
  r.step_ms = bench::summarize(ms);
  r.step_mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  return r;
}

std::string percent_of(double part, double whole) {
  return whole > 0 ? fmt::format("{:.0f}%", 100 * part / whole) : "-";
}

int run_ep(const MoeBenchOptions& o) {
  comm::init();
  int rc = 0;
  {
    comm::Communicator& world = comm::Communicator::world();
    const int p = world.size(), rank = world.rank();
    set_num_threads(1);
    // Rank 0 prepares the corpus if it is missing; the others read it after.
    Expected<Corpus> d = rank == 0 ? load_corpus(o.data) : Expected<Corpus>(Corpus{});
    bench::sleeping_barrier(world);
    if (rank != 0) d = load_corpus(o.data);
    Expected<ModelConfig> cfg = d.ok() ? corpus_config(o.preset, *d) : Expected<ModelConfig>(d.status());
    std::vector<float> full;
    std::string from = "initial weights (seed " + std::to_string(o.seed) + ")";
    if (cfg.ok() && !o.load.empty()) {
      auto m = load_model(o.load);
      if (!m.ok()) {
        cfg = invalid_argument("--load {}: {}", o.load, m.status().message());
      } else {
        cfg = (*m)->config();
        full.assign((*m)->params().begin(), (*m)->params().end());
        from = "the weights in " + o.load;
      }
    }
    if (cfg.ok() && p < 2) cfg = invalid_argument("--only ep needs 2 or more ranks (mpirun -np 2); this job has {}", p);
    if (!cfg.ok()) {
      if (rank == 0) fmt::print(stderr, "{} --only ep: {}\n", kCmd, cfg.status().message());
      comm::finalize();
      return kUserError;
    }
    if (rank == 0) {
      fmt::print("## ep: {} ({}), {} ranks x 1 thread, batch 8 x seq 256 on {}, from {}; {} timed steps after {}; "
                 "{}\n",
                 o.preset, cfg->describe(), p, d->dir, from, o.ep_steps, o.ep_warmup, cpu_features().brand);
      std::fflush(stdout);
    }
    std::vector<EpRow> rows;
    std::vector<std::pair<int, int>> runs = {{1, 1}};
    for (int c : o.ep_chunks) runs.emplace_back(p, c);
    for (const auto& [ep, chunks] : runs) {
      auto r = measure_ep(ep, chunks, *cfg, full, d->train, o);
      if (!r.ok()) {  // the same verdict on every rank (a config or plan error)
        if (rank == 0) fmt::print(stderr, "{} --only ep: ep {} chunks {}: {}\n", kCmd, ep, chunks, r.status().message());
        rc = 1;
        continue;
      }
      if (rank == 0) {
        fmt::print("# ep {} chunks {}: step {:.1f} ms\n", ep, chunks, r->step_mean);
        std::fflush(stdout);
      }
      rows.push_back(*r);
    }
    if (rank == 0 && !rows.empty()) {
      const double base = rows[0].ep == 1 ? rows[0].step_mean : 0;
      fmt::print("| ep | chunks | step ms (mean) | min-max | a2a ms | a2a exposed | a2a MiB/rank | grad comm ms | "
                 "grad exposed | load | vs ep 1 |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
      for (const EpRow& r : rows)
        fmt::print("| {} | {} | {:.1f} | {:.1f}-{:.1f} | {:.1f} | {} | {:.1f} | {:.1f} | {} | {:.2f}x | {} |\n", r.ep,
                   r.ep == 1 ? "-" : std::to_string(r.chunks), r.step_mean, r.step_ms.min, r.step_ms.max, r.a2a_ms,
                   percent_of(r.a2a_exposed_ms, r.a2a_ms), r.a2a_mib, r.grad_ms,
                   percent_of(r.grad_exposed_ms, r.grad_ms), r.load,
                   base > 0 && r.ep > 1 ? fmt::format("ratio: {:.2f}", base / r.step_mean) : "-");
      fmt::print("# per step, the slowest rank's; a2a: the MoE all-to-alls (dispatch and combine, forward and "
                 "backward) on the communication thread, exposed: the compute thread's wait for them; grad comm: the "
                 "gradient all-reduces (ep 1: all of them; ep > 1: replicated values over every rank, experts over "
                 "their replicas); load: worst block's max / mean tokens per expert; ratio = ep 1 step / this step "
                 "(> 1: faster than DDP)\n");
      std::fflush(stdout);
    }
  }
  comm::finalize();
  return rc;
}

// ---- torch ---------------------------------------------------------------------------------

// Runs bench/torch_moe.py at `threads`; its JSON line, or a reason it did not run.
Expected<nlohmann::json> run_torch_peer(const MoeBenchOptions& o, const bench::MoeLayerShape& s, int threads) {
  if (!std::filesystem::exists(o.python)) return not_found("{} not found", o.python);
  if (!std::filesystem::exists(o.torch_script)) return not_found("{} not found (run from the repository root)", o.torch_script);
  const std::string cmd = fmt::format(
      "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS={0} MKL_NUM_THREADS={0} OPENBLAS_NUM_THREADS={0} "
      "'{1}' '{2}' --threads {0} --reps {3} --tokens {4} --d-model {5} --ffn {6} --experts {7} --top-k {8} 2>&1",
      threads, o.python, o.torch_script, o.reps, s.tokens, s.d_model, s.ffn, s.experts, s.top_k);
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return not_found("cannot run {}", o.python);
  std::string out;
  char buf[4096];
  for (size_t got; (got = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, got);
  const int rc = pclose(pipe);
  const size_t brace = out.rfind("\n{") == std::string::npos ? out.find('{') : out.rfind("\n{") + 1;
  if (rc != 0 || brace == std::string::npos) {
    const size_t nl = out.find_last_of('\n', out.size() > 1 ? out.size() - 2 : 0);
    return not_found("{} exited {}: {}", o.torch_script, rc, nl == std::string::npos ? out : out.substr(nl + 1));
  }
  auto j = nlohmann::json::parse(out.substr(brace), nullptr, false);
  if (j.is_discarded() || !j.contains("fwd_bwd_ms")) return not_found("{} printed no result", o.torch_script);
  return j;
}

double load_of(const std::vector<int64_t>& counts) {
  const double mean = static_cast<double>(std::accumulate(counts.begin(), counts.end(), int64_t{0})) /
                      static_cast<double>(counts.size());
  return mean > 0 ? static_cast<double>(*std::max_element(counts.begin(), counts.end())) / mean : 0;
}

int run_torch(const MoeBenchOptions& o) {
  const bench::MoeLayerShape s;
  fmt::print("\n## torch: one W1-MoE layer forward + backward, N {} (batch 8 x seq 256), d {}, {} experts of SwiGLU "
             "width {}, top-{}, renormalized gates, dropless, fp32; median of {}\n",
             s.tokens, s.d_model, s.experts, s.ffn, s.top_k, o.reps);
  fmt::print("# kiln: MoeBlock (router GEMM, top-k, sort by expert, cpu::grouped_gemm SwiGLU experts); torch: eager, "
             "a loop over experts with index_select / index_add_ (HF Mixtral); each side its own random weights and "
             "inputs (random router, roughly balanced: load below); no router losses on either side\n");
  fmt::print("| threads | kiln ms | kiln load | torch ms | torch load | ratio |\n|---|---|---|---|---|---|\n");
  std::string skipped;
  for (int threads : o.threads) {
    set_num_threads(threads);
    bench::MoeLayerBench layer(s, o.seed);
    const bench::Summary k = bench::time_interleaved(o.reps, {[&] { layer.forward_backward(); }})[0];
    const double kiln_ms = 1e3 * k.median, kiln_load = load_of(layer.tokens_per_expert());
    auto peer = run_torch_peer(o, s, threads);
    if (!peer.ok()) {
      skipped = peer.status().message();
      fmt::print("| {} | {:.1f} | {:.2f}x | skipped | - | - |\n", threads, kiln_ms, kiln_load);
      continue;
    }
    const double torch_ms = (*peer)["fwd_bwd_ms"].get<double>();
    fmt::print("| {} | {:.1f} | {:.2f}x | {:.1f} | {:.2f}x | ratio: {:.2f} |\n", threads, kiln_ms, kiln_load, torch_ms,
               (*peer)["load"].get<double>(), torch_ms / kiln_ms);
    if (threads == o.threads.front())
      fmt::print("# torch {} ({})\n", (*peer)["torch"].get<std::string>(), o.python);
  }
  if (!skipped.empty()) fmt::print("torch: skipped: {}\n", skipped);
  fmt::print("ratio = torch ms / kiln ms (> 1: kiln faster)\n");
  return 0;
}

int run_moe_bench(const MoeBenchOptions& o) {
  const bool mpi = run::launched_by_mpi();
  auto sections = resolve_sections(o, mpi);
  if (!sections.ok()) {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr || std::string(rank) == "0") fmt::print(stderr, "{}: {}\n", kCmd, sections.status().message());
    return kUserError;
  }
  if (mpi) return run_ep(o);
  const int threads = *std::max_element(o.threads.begin(), o.threads.end());
  fmt::print("# {}: sections {}; {}; threads {}\n", kCmd, fmt::join(*sections, ","), cpu_features().brand,
             fmt::join(o.threads, ","));
  int rc = 0;
  if (wants(*sections, "gemm")) rc = std::max(rc, run_gemm(o));
  if (wants(*sections, "balance") || wants(*sections, "capacity")) {
    set_num_threads(threads);
    auto d = load_corpus(o.data);
    Expected<ModelConfig> cfg = d.ok() ? corpus_config(o.preset, *d) : Expected<ModelConfig>(d.status());
    if (!cfg.ok()) {
      fmt::print(stderr, "{}: {}\n", kCmd, cfg.status().message());
      return kUserError;
    }
    std::vector<BalanceRun> runs;
    if (wants(*sections, "balance")) {
      rc = std::max(rc, run_balance(o, *d, *cfg, runs));
    } else {  // capacity alone: train the balanced model quietly
      fmt::print("\n# capacity: training {} with aux coef {} for {} steps first\n", o.preset, o.aux_coef, o.steps);
      auto r = train_balance(*cfg, o.aux_coef, *d, o);
      if (!r.ok()) {
        fmt::print(stderr, "{}: {}\n", kCmd, r.status().message());
        return 1;
      }
      runs.push_back(std::move(*r));
    }
    if (wants(*sections, "capacity") && !runs.empty()) rc = std::max(rc, run_capacity(o, *d, *runs[0].model));
  }
  if (wants(*sections, "torch")) rc = std::max(rc, run_torch(o));
  if (!wants(*sections, "ep"))
    fmt::print("\nep: not in this run (mpirun -np 2 {} --only ep)\n", kCmd);
  return rc;
}

}  // namespace

void register_bench_moe(CLI::App& app) {
  CLI::App* bench_cmd = app.get_subcommand("bench");
  auto opt = std::make_shared<MoeBenchOptions>();
  CLI::App* cmd = bench_cmd->add_subcommand(
      "moe", "MoE (W1-MoE): grouped GEMM, load balance over training, capacity drops, expert parallelism, the "
             "layer vs PyTorch eager");
  cmd->add_option("--only", opt->only,
                  "Sections: gemm, balance, capacity, ep (under mpirun -np 2), torch, or all (default: every "
                  "section this launch can run)")
      ->delimiter(',');
  cmd->add_option("--threads-list", opt->threads, "Thread counts of gemm and torch; balance and capacity use the largest")
      ->delimiter(',')
      ->check(CLI::Range(1, static_cast<int>(kMaxThreads)));
  cmd->add_option("--reps", opt->reps, "Timed rounds (median) of gemm and torch")->check(CLI::Range(1, 1000));
  cmd->add_option("--seed", opt->seed, "Seed of weights and data order");
  cmd->add_option("--preset", opt->preset, "MoE preset of balance, capacity and ep (llama-moe-tiny, w1-moe)");
  cmd->add_option("--data", opt->data, "Prepared KJV directory (made on first use, as kiln train does)");
  cmd->add_option("--steps", opt->steps, "balance: training steps of each run")->check(CLI::Range(1, 1000000));
  cmd->add_option("--print-every", opt->print_every, "balance: a table row every N steps")->check(CLI::Range(1, 1000000));
  cmd->add_option("--eval-batches", opt->eval_batches, "Validation batches of the losses and the capacity section")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--aux-coef", opt->aux_coef, "balance: the load-balancing coefficient of the first run (the second: 0)")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--capacity-factors", opt->capacity_factors, "capacity: factors beside dropless, e.g. 1,1.25,2")
      ->delimiter(',');
  cmd->add_option("--svg", opt->svg, "balance: the plot of max / mean per step");
  cmd->add_option("--save", opt->save, "balance: save the model trained with the balancing loss to this directory");
  cmd->add_option("--ep-chunks", opt->ep_chunks, "ep: dispatch chunk counts at ep = the ranks")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  cmd->add_option("--ep-steps", opt->ep_steps, "ep: timed steps per layout")->check(CLI::Range(1, 10000));
  cmd->add_option("--ep-warmup", opt->ep_warmup, "ep: untimed steps first")->check(CLI::Range(0, 1000));
  cmd->add_option("--load", opt->load, "ep: start from a model saved by --save (its trained routing)");
  cmd->add_option("--python", opt->python, "torch: the Python with PyTorch");
  cmd->add_option("--torch-script", opt->torch_script, "torch: the peer script");
  cmd->callback([opt] {
    const int rc = run_moe_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
