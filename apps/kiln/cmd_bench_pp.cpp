// `kiln bench pp` (BENCH.md W7, pipeline parallelism): W1a / W1b training steps under
// mpirun -np P at pp = P (one thread per rank), for each schedule (GPipe, 1F1B, interleaved 1F1B
// over V chunks a rank, ZB-H1) at M micro-batches: the mean step time, the bubble measured beside
// the ideal (the same lists simulated with the measured mean action costs) and the formula
// (parallel::measure_bubble), each stage's peak activation memory beside its schedule's bound,
// and the single-process step of the same model and batch on rank 0 (the speedup). One table,
// then whether the measured bubbles are ordered ZB-H1 <= 1F1B <= GPipe; --json writes the rows.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "bench/bench_util.h"
#include "bench/parallel_bench_util.h"
#include "kiln/comm/communicator.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/env.h"
#include "kiln/core/thread_pool.h"
#include "kiln/model/config.h"
#include "kiln/parallel/pipeline.h"
#include "kiln/train/trainer.h"

namespace kiln::app {
namespace {

struct PpBenchOptions {
  std::vector<std::string> workloads = {"W1a", "W1b"};
  std::string schedule = "all";  // all | gpipe | 1f1b | interleaved | zb-h1
  int micro_batches = 4;
  int virtual_stages = 2;  // interleaved's chunks a rank
  int steps = 5;
  int warmup = 2;
  int threads = 1;  // per rank, and the single-process reference's
  bool single = true;
  std::string json;  // a path: the rows as one JSON array
};

constexpr uint64_t kModelSeed = 1;

using Workload = bench::ParallelWorkload;

// One rank of one schedule's run: its blocks (one range a chunk), the activation micro-batches
// held at once (most over the timed steps; interleaved counts micro-batch-chunks) and their
// bytes, beside the schedule's bound (the bound's bytes: that many of the rank's activation
// slots; zero-bubble's measured bytes also count the output gradients queued for W).
struct StageRow {
  std::vector<BlockRange> blocks;
  int peak_micro_batches = 0, bound_micro_batches = 0;
  double peak_mib = 0, bound_mib = 0;
};

struct Row {
  std::string workload;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::k1F1B;
  bench::Summary step_ms;  // the slowest rank's, per timed step
  double step_ms_mean = 0, single_ms = 0;
  double schedule_ms = 0;  // the measured makespan: first compute action's start to the last's end
  // Means over the timed steps (fractions of P · makespan).
  double bubble_measured = 0, bubble_staged = 0, bubble_ideal = 0, bubble_formula = 0;
  double forward_ms = 0, backward_ms = 0,
         weight_ms = 0;  // mean action costs; weight: zero-bubble's W
  std::string split;     // blocks per virtual stage in model order: "3,3", "2,1,1,2"
  std::vector<StageRow> stages;
};

// Every schedule the executor trains, in the order the table lists them.
constexpr pipeline::ScheduleKind kSchedules[] = {
    pipeline::ScheduleKind::kGpipe, pipeline::ScheduleKind::k1F1B,
    pipeline::ScheduleKind::kInterleaved1F1B, pipeline::ScheduleKind::kZeroBubbleH1};

Expected<std::vector<pipeline::ScheduleKind>> parse_schedules(const std::string& name) {
  if (name == "all")
    return std::vector<pipeline::ScheduleKind>(std::begin(kSchedules), std::end(kSchedules));
  auto kind = pipeline::parse_schedule(name);
  if (!kind.ok()) return invalid_argument("--schedule: {} (or all)", kind.status().message());
  return std::vector<pipeline::ScheduleKind>{*kind};
}

TrainOptions train_options(const Workload& w, const PpBenchOptions& o) {
  return bench::bench_train_options(w.batch, w.seq_len, o.warmup + o.steps, kModelSeed);
}

parallel::PipelineOptions pipeline_options(pipeline::ScheduleKind kind, int p,
                                           const PpBenchOptions& o) {
  parallel::PipelineOptions po;
  po.pp = p;
  po.micro_batches = o.micro_batches;
  po.schedule = kind;
  po.virtual_stages = kind == pipeline::ScheduleKind::kInterleaved1F1B ? o.virtual_stages : 1;
  return po;
}

// Every flag checked, the same verdict on every rank, before any communication.
Status check_flags(const PpBenchOptions& o, int p, std::vector<Workload>& workloads,
                   std::vector<pipeline::ScheduleKind>& schedules) {
  KILN_ASSIGN_OR_RETURN(schedules, parse_schedules(o.schedule));
  if (o.workloads.empty()) return invalid_argument("--workload: give W1a and/or W1b");
  for (const std::string& name : o.workloads) {
    KILN_ASSIGN_OR_RETURN(Workload w, bench::parallel_workload(name));
    workloads.push_back(std::move(w));
  }
  if (p < 2)
    return invalid_argument(
        "a pipeline needs 2 or more stages, one a rank: run it under mpirun -np 2 (this job has "
        "{} rank)",
        p);
  for (const Workload& w : workloads)
    for (const pipeline::ScheduleKind kind : schedules) {
      const Status st = parallel::check_pipeline_parallel(
          pipeline_options(kind, p, o), w.cfg, p, parallel::TensorParallelOptions{},
          parallel::DataParallelOptions{}, train_options(w, o));
      if (!st.ok())
        return invalid_argument("workload {} --micro-batches {}: {}", w.name, o.micro_batches,
                                st.message());
    }
  return {};
}

double mib(double bytes) {
  return bytes / (1024.0 * 1024.0);
}

// Collective over the world: warm-up steps, then the timed ones, each followed by its bubble
// and peaks (gathered outside the step's time).
Expected<Row> measure(const Workload& w, const TokenShard& data, pipeline::ScheduleKind kind,
                      const PpBenchOptions& o) {
  comm::Communicator& world = comm::Communicator::world();
  const int p = world.size();
  const TrainOptions t = train_options(w, o);
  KILN_ASSIGN_OR_RETURN(
      auto plan, parallel::PipelineParallelPlan::create(world, pipeline_options(kind, p, o),
                                                        parallel::TensorParallelOptions{},
                                                        parallel::DataParallelOptions{}, w.cfg, t));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model,
                        Transformer::create(w.cfg, kModelSeed, plan->shard(), plan->stage()));
  Trainer trainer(*model, data, nullptr, t, plan.get());
  for (int s = 0; s < o.warmup; ++s) (void)trainer.step();
  Row r;
  r.workload = w.name;
  r.schedule = kind;
  r.stages.resize(static_cast<size_t>(p));
  std::vector<double> seconds;
  for (int s = 0; s < o.steps; ++s) {
    seconds.push_back(trainer.step().seconds);
    const parallel::PipelineBubble b = parallel::measure_bubble(*plan);
    r.schedule_ms += 1e3 * b.measured_stats.makespan / o.steps;
    r.bubble_measured += b.measured_stats.bubble_fraction / o.steps;
    r.bubble_ideal += b.ideal_stats.bubble_fraction / o.steps;
    r.bubble_staged += b.staged_stats.bubble_fraction / o.steps;
    r.bubble_formula += b.formula / o.steps;
    r.forward_ms += 1e3 * b.costs.forward / o.steps;
    r.backward_ms += 1e3 * b.backward_seconds / o.steps;
    if (b.split_backward) r.weight_ms += 1e3 * b.costs.backward_weight / o.steps;
    const std::vector<parallel::StagePeak> peaks = plan->gather_peaks();
    for (size_t i = 0; i < peaks.size(); ++i) {
      r.stages[i].peak_micro_batches =
          std::max(r.stages[i].peak_micro_batches, peaks[i].micro_batches);
      r.stages[i].peak_mib =
          std::max(r.stages[i].peak_mib, mib(static_cast<double>(peaks[i].bytes)));
    }
  }
  // The slowest rank's time of each step.
  MPI_Allreduce(MPI_IN_PLACE, seconds.data(), static_cast<int>(seconds.size()), MPI_DOUBLE, MPI_MAX,
                world.handle());
  for (double& s : seconds) s *= 1e3;
  r.step_ms = bench::summarize(seconds);
  for (double s : seconds) r.step_ms_mean += s / static_cast<double>(seconds.size());
  // One activation slot's bytes on every rank (pp = P: world rank r is pipeline rank r).
  const double slot = static_cast<double>(model->saved_activation_bytes());
  std::vector<double> slots(static_cast<size_t>(p));
  MPI_Allgather(&slot, 1, MPI_DOUBLE, slots.data(), 1, MPI_DOUBLE, world.handle());
  const std::vector<int> bound = pipeline::activation_bound(plan->schedule().spec);
  const std::vector<BlockRange>& stages = plan->stages();  // every virtual stage, model order
  for (size_t v = 0; v < stages.size(); ++v) {
    r.split += fmt::format("{}{}", r.split.empty() ? "" : ",", stages[v].size());
    r.stages[v % r.stages.size()].blocks.push_back(stages[v]);  // rank r holds r, r + P, …
  }
  for (size_t i = 0; i < r.stages.size(); ++i) {
    r.stages[i].bound_micro_batches = bound[i];
    r.stages[i].bound_mib = mib(bound[i] * slots[i]);
  }
  return r;
}

// The single-process trainer at the same batch (one pass, no micro-batches), with one rank's
// threads: its mean step in ms.
Expected<double> measure_single(const Workload& w, const TokenShard& data,
                                const PpBenchOptions& o) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::create(w.cfg, kModelSeed));
  Trainer trainer(*model, data, nullptr, train_options(w, o));
  for (int s = 0; s < o.warmup; ++s) (void)trainer.step();
  double sum = 0;
  for (int s = 0; s < o.steps; ++s) sum += trainer.step().seconds;
  return 1e3 * sum / o.steps;
}

std::string percent(double fraction) {
  return fmt::format("{:.1f}%", 100 * fraction);
}

void print_table(const std::vector<Row>& rows) {
  if (rows.empty()) return;
  std::string head =
      "| workload | schedule | blocks per stage | step ms (mean) | min-max | schedule ms | single "
      "ms | "
      "speedup | bubble measured | at stage costs | ideal | formula | F / B / W ms |";
  std::string rule = "|---|---|---|---|---|---|---|---|---|---|---|---|---|";
  for (size_t s = 0; s < rows[0].stages.size(); ++s) {
    head += fmt::format(" rank {}: peak / bound mb, MiB |", s);
    rule += "---|";
  }
  fmt::print("{}\n{}\n", head, rule);
  for (const Row& r : rows) {
    std::string line = fmt::format(
        "| {} | {} | {} | {:.1f} | {:.1f}-{:.1f} | {:.1f} | {} | {} | {} | {} | {} | {} | {:.2f} / "
        "{:.2f} / "
        "{} |",
        r.workload, pipeline::schedule_name(r.schedule), r.split, r.step_ms_mean, r.step_ms.min,
        r.step_ms.max, r.schedule_ms, r.single_ms > 0 ? fmt::format("{:.1f}", r.single_ms) : "-",
        r.single_ms > 0 ? fmt::format("{:.2f}x", r.single_ms / r.step_ms_mean) : "-",
        percent(r.bubble_measured), percent(r.bubble_staged), percent(r.bubble_ideal), percent(r.bubble_formula),
        r.forward_ms, r.backward_ms, r.weight_ms > 0 ? fmt::format("{:.2f}", r.weight_ms) : "-");
    for (const StageRow& s : r.stages)
      line += fmt::format(" {} / {}, {:.1f} / {:.1f} |", s.peak_micro_batches,
                          s.bound_micro_batches, s.peak_mib, s.bound_mib);
    fmt::print("{}\n", line);
  }
  fmt::print(
      "# blocks per stage: virtual stages in model order (rank r holds r, r + P, ...); schedule "
      "ms: "
      "the measured makespan of the step's actions (the step adds the tied embedding's sum over "
      "the stages, the gradient norm and AdamW); bubble: idle over P x makespan, mean of the timed "
      "steps; at stage costs: the lists simulated with each stage's own mean F / B / W; ideal: with "
      "the mean over every stage (balanced); peak / bound: activation "
      "micro-batches (interleaved: micro-batch-chunks) held at once (the MiB bound: that many of "
      "the rank's slots; zb-h1's peak also holds the output gradients queued for W); speedup: "
      "single / step\n");
}

// Prints, per workload, whether the measured bubbles fall as the schedules promise (a
// benchmark says so; it does not assert).
void print_order(const std::vector<Row>& rows, const std::vector<Workload>& workloads) {
  for (const Workload& w : workloads) {
    double bubble[3] = {-1, -1, -1};  // gpipe, 1f1b, zb-h1
    for (const Row& r : rows) {
      if (r.workload != w.name) continue;
      if (r.schedule == pipeline::ScheduleKind::kGpipe) bubble[0] = r.bubble_measured;
      if (r.schedule == pipeline::ScheduleKind::k1F1B) bubble[1] = r.bubble_measured;
      if (r.schedule == pipeline::ScheduleKind::kZeroBubbleH1) bubble[2] = r.bubble_measured;
    }
    if (bubble[0] < 0 || bubble[1] < 0 || bubble[2] < 0) {
      fmt::print("{} order: zb-h1 ≤ 1f1b ≤ gpipe: n/a (needs --schedule all)\n", w.name);
      continue;
    }
    // GPipe and 1F1B have the same bubble formula, (P − 1) / (M + P − 1): their measured order is
    // noise; 1F1B's gain is memory (P − r micro-batches held instead of M).
    fmt::print("{} order: zb-h1 ≤ 1f1b ≤ gpipe: {} (measured bubble {:.2f}% ≤ {:.2f}% ≤ {:.2f}%); zb-h1 below "
               "1f1b: {}; 1f1b and gpipe share the formula, so their order is within noise ({:+.2f} points)\n",
               w.name, bubble[2] <= bubble[1] && bubble[1] <= bubble[0] ? "yes" : "no", 100 * bubble[2],
               100 * bubble[1], 100 * bubble[0], bubble[2] < bubble[1] ? "yes" : "no",
               100 * (bubble[1] - bubble[0]));
  }
}

Status write_json(const std::string& path, const std::vector<Row>& rows, int p,
                  const PpBenchOptions& o) {
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json stages = nlohmann::json::array();
    for (const StageRow& s : r.stages) {
      nlohmann::json blocks = nlohmann::json::array();
      for (const BlockRange& b : s.blocks) blocks.push_back({b.begin, b.end});
      stages.push_back({{"blocks", blocks},
                        {"peak_micro_batches", s.peak_micro_batches},
                        {"bound_micro_batches", s.bound_micro_batches},
                        {"peak_mib", s.peak_mib},
                        {"bound_mib", s.bound_mib}});
    }
    out.push_back({{"bench", "pp"},
                   {"workload", r.workload},
                   {"schedule", std::string(pipeline::schedule_name(r.schedule))},
                   {"P", p},
                   {"micro_batches", o.micro_batches},
                   {"virtual_stages", pipeline_options(r.schedule, p, o).virtual_stages},
                   {"blocks_per_stage", r.split},
                   {"threads_per_rank", o.threads},
                   {"steps", o.steps},
                   {"step_ms_mean", r.step_ms_mean},
                   {"step_ms_median", r.step_ms.median},
                   {"step_ms_min", r.step_ms.min},
                   {"step_ms_max", r.step_ms.max},
                   {"schedule_ms", r.schedule_ms},
                   {"single_ms", r.single_ms > 0 ? nlohmann::json(r.single_ms) : nlohmann::json()},
                   {"bubble_measured", r.bubble_measured},
                   {"bubble_ideal", r.bubble_ideal},
                   {"bubble_at_stage_costs", r.bubble_staged},
                   {"bubble_formula", r.bubble_formula},
                   {"forward_ms", r.forward_ms},
                   {"backward_ms", r.backward_ms},
                   {"weight_ms", r.weight_ms},
                   {"stages", stages},
                   {"cpu", cpu_features().brand}});
  }
  std::ofstream f(path);
  f << out.dump(2) << "\n";
  if (!f) return invalid_argument("--json {}: cannot write the file", path);
  return {};
}

int run_pp_bench(const PpBenchOptions& o) {
  comm::init();
  int rc = 0;
  {
    comm::Communicator& world = comm::Communicator::world();
    const int p = world.size(), rank = world.rank();
    std::vector<Workload> workloads;
    std::vector<pipeline::ScheduleKind> schedules;
    if (const Status st = check_flags(o, p, workloads, schedules); !st.ok()) {
      if (rank == 0) fmt::print(stderr, "kiln bench pp: {}\n", st.message());
      comm::finalize();
      return kUserError;
    }
    set_num_threads(o.threads);
    if (rank == 0)
      fmt::print(
          "# bench pp P {} (pp {}; interleaved: {} chunks a rank) M {} steps {} warmup {} "
          "threads/rank {} cpu {}\n",
          p, p, o.virtual_stages, o.micro_batches, o.steps, o.warmup, num_threads(),
          cpu_features().brand);
    std::vector<Row> rows;
    for (const Workload& w : workloads) {
      const TokenShard data = bench::random_tokens(w.cfg.vocab_size);  // the same on every rank
      if (rank == 0)
        fmt::print("# workload {}: {}; batch {} x seq {}, {} rows a micro-batch\n", w.name,
                   w.cfg.describe(), w.batch, w.seq_len, w.batch / o.micro_batches);
      const size_t first = rows.size();
      for (const pipeline::ScheduleKind kind : schedules) {
        auto r = measure(w, data, kind, o);
        if (!r.ok()) {  // the same verdict on every rank (a config or plan error)
          if (rank == 0)
            fmt::print(stderr, "kiln bench pp: workload {} schedule {}: {}\n", w.name,
                       pipeline::schedule_name(kind), r.status().message());
          rc = 1;
          continue;
        }
        if (rank == 0) {
          fmt::print(
              "# {} {}: step {:.1f} ms (mean of {}), bubble measured {}, blocks per stage {}\n",
              w.name, pipeline::schedule_name(kind), r->step_ms_mean, o.steps,
              percent(r->bubble_measured), r->split);
          std::fflush(stdout);
        }
        rows.push_back(std::move(*r));
      }
      if (!o.single) continue;
      // The one-process trainer on rank 0 while the others sleep (their cores left free).
      double single_ms = 0;
      if (rank == 0) {
        auto s = measure_single(w, data, o);
        if (s.ok()) {
          single_ms = *s;
          fmt::print("# {} single process: step {:.1f} ms (mean of {})\n", w.name, single_ms,
                     o.steps);
          std::fflush(stdout);
        } else {
          fmt::print(stderr, "kiln bench pp: workload {} single process: {}\n", w.name,
                     s.status().message());
          rc = 1;
        }
      }
      bench::sleeping_barrier(world);
      for (size_t i = first; i < rows.size(); ++i) rows[i].single_ms = single_ms;
    }
    if (rank == 0) {
      print_table(rows);
      print_order(rows, workloads);
      if (!o.json.empty()) {
        if (const Status st = write_json(o.json, rows, p, o); !st.ok()) {
          fmt::print(stderr, "kiln bench pp: {}\n", st.message());
          rc = 1;
        } else {
          fmt::print("json: {}\n", o.json);
        }
      }
      std::fflush(stdout);
    }
  }
  comm::finalize();
  return rc;
}

}  // namespace

void register_bench_pp(CLI::App& app) {
  CLI::App* bench_cmd = app.get_subcommand("bench");
  auto opt = std::make_shared<PpBenchOptions>();
  CLI::App* cmd = bench_cmd->add_subcommand(
      "pp",
      "Pipeline parallelism (W7) under mpirun -np P: GPipe, 1F1B, interleaved 1F1B, ZB-H1 step "
      "time, bubble measured / ideal / formula, peak activations per rank vs the bound, speedup "
      "over one process");
  cmd->add_option("--workload", opt->workloads,
                  "W1a (B 8, T 256), W1b (GPT-2 124M; B 4, T 64); comma list, default both")
      ->delimiter(',');
  cmd->add_option("--schedule", opt->schedule, "all, gpipe, 1f1b, interleaved or zb-h1");
  cmd->add_option("--micro-batches", opt->micro_batches,
                  "Micro-batches M per step (the batch must split into M)")
      ->check(CLI::Range(1, 1 << 12));
  cmd->add_option("--virtual-stages", opt->virtual_stages,
                  "Model chunks a rank for interleaved (M must be a multiple of P)")
      ->check(CLI::Range(2, 64));
  cmd->add_option("--steps", opt->steps, "Timed steps after warm-up (mean, min-max)")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--warmup", opt->warmup, "Untimed warm-up steps")->check(CLI::Range(0, 1000));
  cmd->add_option("--threads", opt->threads,
                  "Worker threads per rank (and for the single-process reference)")
      ->check(CLI::Range(1, static_cast<int>(kMaxThreads)));
  cmd->add_flag("--single,!--no-single", opt->single,
                "The single-process step of the same model and batch on rank 0, for the speedup "
                "(default on)");
  cmd->add_option("--json", opt->json, "Also write the rows to this file as a JSON array");
  cmd->callback([opt] {
    const int rc = run_pp_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
