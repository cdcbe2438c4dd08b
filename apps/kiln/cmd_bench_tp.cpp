// `kiln bench tp` (BENCH.md W7, tensor parallelism): training steps of a W1a-like model under
// mpirun at tp = P (or --tp), with and without sequence parallelism. One line per layout: the
// forward and backward time per block (from ModelHooks timestamps), the TP collectives' bytes
// per step beside the formula of perf/tp_model.h (their ratio must be 1.000), the share of the
// step blocked in them, and the activation memory per rank; then the saving sequence
// parallelism gives.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "bench/bench_util.h"
#include "bench/parallel_bench_util.h"
#include "kiln/comm/communicator.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/thread_pool.h"
#include "kiln/model/config.h"
#include "kiln/parallel/tensor_parallel.h"
#include "kiln/perf/memory_model.h"
#include "kiln/perf/tp_model.h"
#include "kiln/train/trainer.h"

namespace kiln::app {
namespace {

struct TpBenchOptions {
  std::string workload = "w1a-tp";
  int64_t batch = 0, seq = 0;  // 0: the workload's
  int steps = 10;
  int warmup = 2;
  int tp = 0;                  // 0: every rank (tp = P)
  std::string sp = "both";     // on | off | both
};

constexpr uint64_t kModelSeed = 1;

struct Workload {
  std::string name;
  ModelConfig cfg;
  int64_t batch = 0, seq = 0;
};

// W1a and W1b (BENCH.md) do not split over tp ranks: vocabularies 65 and 50257 divide by no
// tp > 1, and W1a's 6 heads not by 4. The "-tp" workloads are their shapes with Megatron's
// vocabulary padding (to a multiple of 128, which tp = 1, 2, 4, 8 divide) and, for W1a, 8 heads
// of 48 instead of 6 of 64. Any other preset runs at its own shape if it splits.
Expected<Workload> parse_workload(const TpBenchOptions& o) {
  Workload w;
  w.name = o.workload;
  if (o.workload == "w1a-tp") {
    KILN_ASSIGN_OR_RETURN(w.cfg, preset("w1a"));
    w.cfg.vocab_size = 128;
    w.cfg.n_heads = w.cfg.n_kv_heads = 8;
    w.batch = 8, w.seq = 256;
  } else if (o.workload == "w1b-tp") {
    KILN_ASSIGN_OR_RETURN(w.cfg, preset("gpt2-124m"));
    w.cfg.vocab_size = 50304;
    w.batch = 4, w.seq = 64;
  } else {
    auto p = preset(o.workload);
    if (!p.ok())
      return invalid_argument("--workload: unknown workload '{}' (w1a-tp, w1b-tp or a preset: {})", o.workload,
                              fmt::join(preset_names(), ", "));
    w.cfg = *p;
    w.batch = 8, w.seq = std::min<int64_t>(256, w.cfg.max_seq_len);
  }
  if (o.batch > 0) w.batch = o.batch;
  if (o.seq > 0) w.seq = o.seq;
  if (w.seq > w.cfg.max_seq_len)
    return invalid_argument("--seq {}: workload {} has a context of {}", w.seq, w.name, w.cfg.max_seq_len);
  return w;
}

// The plan's hooks, passed through, with a timestamp around each block's forward and backward
// (the plan's own hook work falls outside them).
class BlockTimer final : public ModelHooks {
 public:
  explicit BlockTimer(ModelHooks& inner) : inner_(inner) {}
  void before_model(Pass pass) override { inner_.before_model(pass); }
  void before_block(int64_t block, Pass pass) override {
    inner_.before_block(block, pass);
    start_ = bench::now_seconds();
  }
  void after_block(int64_t block, Pass pass) override {
    (pass == Pass::kForward ? forward_s : backward_s) += bench::now_seconds() - start_;
    inner_.after_block(block, pass);
  }
  void grads_ready(ParamRange range) override { inner_.grads_ready(range); }

  double forward_s = 0, backward_s = 0;  // summed over blocks and steps

 private:
  ModelHooks& inner_;
  double start_ = 0;
};

struct Result {
  double step_ms = 0, step_ms_median = 0, fwd_ms_per_layer = 0, bwd_ms_per_layer = 0, act_mb = 0;
  // Blocked in the layers' TP collectives per step: the most and the least blocked rank (a
  // collective also waits for the slowest peer, so the gap is skew between the ranks), and
  // the most blocked rank's share of its step.
  double tp_comm_ms = 0, tp_comm_ms_min = 0, tp_comm_pct = 0;
  double exposed_pct = 0;  // all the plan's exposed communication: + partial-gradient all-reduces, DDP
  TensorParallelTraffic per_step;  // measured bytes per step (times: the fields above)
  bool same_on_every_rank = true;
};

TrainOptions train_options(const Workload& w, const TpBenchOptions& o) {
  return bench::bench_train_options(w.batch, w.seq, o.warmup + o.steps, kModelSeed);
}

// Collective over the world: warm-up steps, then the timed ones. Times are the slowest rank's.
Expected<Result> measure(const Workload& w, const TokenShard& data, int tp, bool sp, const TpBenchOptions& o) {
  comm::Communicator& world = comm::Communicator::world();
  const TrainOptions t = train_options(w, o);
  KILN_ASSIGN_OR_RETURN(auto plan, parallel::TensorParallelPlan::create(
                                       world, {tp, sp}, parallel::DataParallelOptions{}, w.cfg, t));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::create(w.cfg, kModelSeed, plan->shard()));
  BlockTimer timer(*plan);
  Trainer trainer(*model, data, nullptr, t, plan.get());
  model->set_hooks(&timer);  // the Trainer installed the plan; the timer forwards to it
  for (int s = 0; s < o.warmup; ++s) (void)trainer.step();
  (void)plan->take_tp_traffic();
  timer.forward_s = timer.backward_s = 0;
  std::vector<double> seconds;
  double total_s = 0, exposed_s = 0;
  for (int s = 0; s < o.steps; ++s) {
    const StepStats st = trainer.step();
    seconds.push_back(st.seconds);
    total_s += st.seconds;
    exposed_s += st.comm.exposed_seconds;
  }
  const TensorParallelTraffic m = plan->take_tp_traffic();
  const double per_layer = 1e3 / (static_cast<double>(o.steps) * w.cfg.n_layers);
  // [max] the slowest rank's times (means over the timed steps, as the per-layer times, and the
  // median step); the bytes' max and -min tell whether the ranks agree.
  const double blocked_s = m.seconds / o.steps;
  double v[] = {total_s / o.steps, bench::summarize(seconds).median, blocked_s, -blocked_s, timer.forward_s * per_layer, timer.backward_s * per_layer,
                m.seconds / total_s, exposed_s / total_s, static_cast<double>(model->activation_bytes()),
                static_cast<double>(m.all_reduce_bytes + m.all_gather_bytes + m.reduce_scatter_bytes),
                -static_cast<double>(m.all_reduce_bytes + m.all_gather_bytes + m.reduce_scatter_bytes)};
  MPI_Allreduce(MPI_IN_PLACE, v, 11, MPI_DOUBLE, MPI_MAX, world.handle());
  Result r;
  r.step_ms = 1e3 * v[0];
  r.step_ms_median = 1e3 * v[1];
  r.tp_comm_ms = 1e3 * v[2];
  r.tp_comm_ms_min = -1e3 * v[3];
  r.fwd_ms_per_layer = v[4];
  r.bwd_ms_per_layer = v[5];
  r.tp_comm_pct = 100 * v[6];
  r.exposed_pct = 100 * v[7];
  r.act_mb = v[8] / (1024.0 * 1024.0);
  r.same_on_every_rank = v[9] == -v[10];
  auto per_step = [&](int64_t bytes) { return bytes / o.steps; };
  r.per_step.all_reduce_bytes = per_step(m.all_reduce_bytes);
  r.per_step.all_gather_bytes = per_step(m.all_gather_bytes);
  r.per_step.reduce_scatter_bytes = per_step(m.reduce_scatter_bytes);
  r.per_step.cross_entropy_bytes = per_step(m.cross_entropy_bytes);
  return r;
}

int64_t collective_bytes(const TensorParallelTraffic& t) {
  return t.all_reduce_bytes + t.all_gather_bytes + t.reduce_scatter_bytes;
}

void print_row(const Workload& w, int p, int tp, bool sp, const Result& r, const TensorParallelTraffic& f) {
  const int64_t got = collective_bytes(r.per_step), want = collective_bytes(f);
  const bool exact = r.per_step.all_reduce_bytes == f.all_reduce_bytes &&
                     r.per_step.all_gather_bytes == f.all_gather_bytes &&
                     r.per_step.reduce_scatter_bytes == f.reduce_scatter_bytes &&
                     r.per_step.cross_entropy_bytes == f.cross_entropy_bytes && r.same_on_every_rank;
  const double ratio = want > 0 ? static_cast<double>(got) / static_cast<double>(want) : (got == 0 ? 1.0 : 0.0);
  fmt::print(
      "layout tp {} sp {} workload {} P {} dp {} batch {} seq {} step_ms {:.1f} step_ms_median {:.1f} fwd_ms_per_layer {:.2f} "
      "bwd_ms_per_layer {:.2f} comm_bytes {} formula_bytes {} ratio {:.3f} exact {} all_reduce_bytes {} "
      "all_gather_bytes {} reduce_scatter_bytes {} ce_bytes {} tp_comm_ms {:.1f} tp_comm_ms_min {:.1f} tp_comm_pct {:.1f} exposed_pct {:.1f} act_mb {:.1f}\n",
      tp, sp ? "on" : "off", w.name, p, p / tp, w.batch, w.seq, r.step_ms, r.step_ms_median, r.fwd_ms_per_layer, r.bwd_ms_per_layer,
      got, want, ratio, exact ? "yes" : "no", r.per_step.all_reduce_bytes, r.per_step.all_gather_bytes,
      r.per_step.reduce_scatter_bytes, r.per_step.cross_entropy_bytes, r.tp_comm_ms, r.tp_comm_ms_min, r.tp_comm_pct,
      r.exposed_pct, r.act_mb);
  std::fflush(stdout);
}

int run_tp_bench(const TpBenchOptions& o) {
  comm::init();
  int rc = 0;
  {
    comm::Communicator& world = comm::Communicator::world();
    const int p = world.size(), rank = world.rank();
    const int tp = o.tp > 0 ? o.tp : p;
    // Every flag checked with no communication: the same verdict on every rank.
    auto w = parse_workload(o);
    std::vector<bool> sps;
    if (o.sp == "off" || o.sp == "both" || tp == 1) sps.push_back(false);  // tp 1: nothing to split
    if ((o.sp == "on" || o.sp == "both") && tp > 1) sps.push_back(true);
    Status st = w.status();
    for (bool sp : sps) {
      if (!st.ok()) break;
      const TrainOptions t = train_options(*w, o);
      st = parallel::check_tensor_parallel({tp, sp}, w->cfg, p, parallel::DataParallelOptions{}, t);
      if (st.ok()) st = parallel::check_data_parallel(parallel::DataParallelOptions{}, p / tp, t);
    }
    if (!st.ok()) {
      if (rank == 0) fmt::print(stderr, "kiln bench tp: {}\n", st.message());
      comm::finalize();
      return kUserError;
    }
    const int64_t rows = w->batch / (p / tp) * w->seq;  // one rank's token rows
    if (rank == 0) {
      fmt::print("# bench tp P {} tp {} dp {} sp {} steps {} warmup {} threads/rank {} cpu {}\n", p, tp, p / tp,
                 o.sp, o.steps, o.warmup, num_threads(), cpu_features().brand);
      fmt::print("# workload {}: {}; batch {} x seq {} ({} rows per rank)\n", w->name, w->cfg.describe(), w->batch,
                 w->seq, rows);
      fmt::print("# formula per step: {} blocks; fp32 buffers of rows x d_model = {} B; no SP: (2 fwd + 2 bwd) "
                 "all-reduces per block + embedding (fwd) + head (bwd); SP: fwd 2 AG + 2 RS, bwd 4 AG + 2 RS per "
                 "block, + embedding RS and final-norm AG (fwd), head RS and embedding AG (bwd)\n",
                 w->cfg.n_layers, rows * w->cfg.d_model * 4);
      if (tp == 1 && o.sp != "off") fmt::print("# tp 1: sequence parallelism has nothing to split; sp off only\n");
    }
    const TokenShard data = bench::random_tokens(w->cfg.vocab_size);
    double act_mb[2] = {0, 0};  // [sp off, on]
    for (bool sp : sps) {
      auto r = measure(*w, data, tp, sp, o);
      if (!r.ok()) {  // the same verdict on every rank
        if (rank == 0) fmt::print(stderr, "kiln bench tp: {}\n", r.status().message());
        rc = 1;
        continue;
      }
      act_mb[sp ? 1 : 0] = r->act_mb;
      if (rank == 0) print_row(*w, p, tp, sp, *r, perf::tp_traffic_formula(w->cfg, tp, sp, rows));
    }
    if (rank == 0 && act_mb[0] > 0 && act_mb[1] > 0) {
      // The memory model's activations (perf/memory_model.h: the same buffers, as requested).
      auto predicted = [&](bool sp) {
        const perf::MemoryPrediction m =
            perf::predict_memory(w->cfg, w->batch, w->seq, Precision::kF32, CheckpointMode::kNone,
                                 perf::DataParallelMemory{.dp = p / tp}, perf::TensorParallelMemory{tp, sp});
        return static_cast<double>(m.group_bytes("layer activations") + m.group_bytes("other activations") +
                                   m.group_bytes("scratch")) / (1024.0 * 1024.0);
      };
      const double pred_off = predicted(false), pred_on = predicted(true);
      fmt::print("workload {} tp {} act_mb_sp_off {:.1f} act_mb_sp_on {:.1f} act_saving_pct {:.1f} "
                 "predicted_act_mb_sp_off {:.1f} predicted_act_mb_sp_on {:.1f} predicted_saving_pct {:.1f}\n",
                 w->name, tp, act_mb[0], act_mb[1], 100 * (1 - act_mb[1] / act_mb[0]), pred_off, pred_on,
                 100 * (1 - pred_on / pred_off));
    }
  }
  comm::finalize();
  return rc;
}

}  // namespace

void register_bench_tp(CLI::App& app) {
  CLI::App* bench_cmd = app.get_subcommand("bench");
  auto opt = std::make_shared<TpBenchOptions>();
  CLI::App* cmd = bench_cmd->add_subcommand(
      "tp", "Tensor parallelism (W7) under mpirun: per-layer fwd/bwd time, TP bytes beside the formula, "
            "time blocked in TP collectives, activation memory with and without --sp");
  cmd->add_option("--workload,--preset", opt->workload,
                  "w1a-tp (W1a, vocab padded to 128, 8 heads; B 8, T 256), w1b-tp (W1b, vocab 50304; B 4, "
                  "T 64) or a model preset");
  cmd->add_option("--batch", opt->batch, "Global batch (default: the workload's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--seq", opt->seq, "Sequence length (default: the workload's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--steps", opt->steps, "Timed steps after warm-up")->check(CLI::Range(1, 10000));
  cmd->add_option("--warmup", opt->warmup, "Untimed warm-up steps")->check(CLI::Range(0, 1000));
  cmd->add_option("--tp", opt->tp, "Tensor-parallel ranks (default: all of mpirun's P; P / tp is dp)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--sp", opt->sp, "Sequence parallelism: on, off or both (two rows)")
      ->check(CLI::IsMember({"on", "off", "both"}));
  cmd->callback([opt] {
    const int rc = run_tp_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
