// `kiln bench dp` (BENCH.md W7): data-parallel training steps of W1a / W1b under mpirun, one
// line per (workload, layout, overlap) with the median step time, tokens/s, the communication
// per step and the part of it the compute thread waited for, and the peak memory (max over
// ranks). --single adds the one-process baseline on rank 0 for weak-scaling efficiency.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "bench/bench_util.h"
#include "bench/parallel_bench_util.h"
#include "kiln/comm/communicator.h"
#include "kiln/core/allocator.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/env.h"
#include "kiln/core/thread_pool.h"
#include "kiln/model/config.h"
#include "kiln/parallel/data_parallel.h"
#include "kiln/train/trainer.h"

namespace kiln::app {
namespace {

struct DpBenchOptions {
  std::vector<std::string> workloads = {"W1a", "W1b"};
  std::vector<std::string> layouts = {"ddp", "zero1", "zero2", "zero3"};
  int steps = 10;
  int warmup = 2;
  int threads = 1;             // per rank
  std::string overlap = "on";  // on | off | both
  int64_t per_rank_batch = 0;  // > 0: weak scaling, global batch = this × P
  double bucket_mb = 25;       // DataParallelOptions' default (PyTorch's)
  int prefetch = 1;
  bool single = false;
};

constexpr uint64_t kModelSeed = 1;

using Workload = bench::ParallelWorkload;  // batch: the global batch

// A --layout: its ZeRO stage and HSDP shard group (0: shard over all ranks).
struct Layout {
  std::string name;
  int zero = 0, shard_group = 0;
};

struct Result {
  double step_s = 0, tokens_per_s = 0, comm_s = 0, exposed_s = 0;  // comm, exposed: per step
  double peak_bytes = 0;
};

Expected<Workload> parse_workload(const std::string& flag, int p, int64_t per_rank_batch) {
  KILN_ASSIGN_OR_RETURN(Workload out, bench::parallel_workload(flag));
  if (per_rank_batch > 0) out.batch = per_rank_batch * p;
  if (out.batch % p != 0)
    return invalid_argument(
        "workload {}: its batch {} (the global batch) does not divide over P = {} ranks; "
        "give --per-rank-batch for weak scaling",
        out.name, out.batch, p);
  return out;
}

Expected<Layout> parse_layout(const std::string& name, int p) {
  if (name == "ddp") return Layout{name, 0, 0};
  if (name == "zero1") return Layout{name, 1, 0};
  if (name == "zero2") return Layout{name, 2, 0};
  if (name == "zero3" || name == "fsdp") return Layout{name, 3, 0};
  if (name == "hsdp") {
    if (p < 4 || p % 2 != 0)
      return invalid_argument(
          "--layout hsdp shards within groups of 2 ranks and replicates across >= 2 groups: "
          "it needs an even P >= 4 (P is {})",
          p);
    return Layout{name, 3, 2};
  }
  return invalid_argument(
      "--layout: unknown layout '{}' (known: ddp, zero1, zero2, zero3, fsdp, hsdp)", name);
}

TrainOptions train_options(const Workload& w, int64_t batch, const DpBenchOptions& o) {
  return bench::bench_train_options(batch, w.seq_len, o.warmup + o.steps, kModelSeed);
}

parallel::DataParallelOptions dp_options(const Layout& l, bool overlap, const DpBenchOptions& o) {
  parallel::DataParallelOptions d;
  d.zero = l.zero;
  d.shard_group = l.shard_group;
  d.bucket_mb = o.bucket_mb;
  d.overlap = overlap;
  d.prefetch = o.prefetch;
  return d;
}

// Warm-up steps, then the timed ones; `dpo` null: the single-process trainer. Collective when
// dpo is given (every rank runs it), local otherwise.
Expected<Result> measure(const Workload& w, const TokenShard& data, const TrainOptions& t,
                         const parallel::DataParallelOptions* dpo, const DpBenchOptions& o) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::create(w.cfg, kModelSeed));
  std::unique_ptr<parallel::DataParallelPlan> plan;  // destroyed after the trainer
  if (dpo) {
    KILN_ASSIGN_OR_RETURN(plan,
                          parallel::DataParallelPlan::create(comm::Communicator::world(), *dpo, t));
  }
  Trainer trainer(*model, data, nullptr, t, plan.get());
  for (int s = 0; s < o.warmup; ++s) (void)trainer.step();
  default_allocator().reset_peak();
  std::vector<double> seconds;
  Result r;
  for (int s = 0; s < o.steps; ++s) {
    const StepStats st = trainer.step();
    seconds.push_back(st.seconds);
    r.comm_s += st.comm.comm_seconds;
    r.exposed_s += st.comm.exposed_seconds;
  }
  r.step_s = bench::summarize(seconds).median;
  r.tokens_per_s = static_cast<double>(t.batch * t.seq_len) / r.step_s;
  r.comm_s /= o.steps;
  r.exposed_s /= o.steps;
  r.peak_bytes = static_cast<double>(default_allocator().stats().peak_bytes_in_use);
  return r;
}

void print_row(const std::string& layout, int p, const std::string& workload,
               const std::string& overlap, const Result& r) {
  const double pct = r.comm_s > 0 ? 100 * r.exposed_s / r.comm_s : 0;
  fmt::print(
      "layout {} P {} workload {} overlap {} step_ms {:.2f} tokens_per_s {:.1f} comm_ms {:.3f} "
      "exposed_ms {:.3f} exposed_pct {:.1f} peak_mb {:.1f}\n",
      layout, p, workload, overlap, 1e3 * r.step_s, r.tokens_per_s, 1e3 * r.comm_s,
      1e3 * r.exposed_s, pct, r.peak_bytes / (1024.0 * 1024.0));
  std::fflush(stdout);
}

// Every flag checked, the same verdict on every rank, before any communication.
Status check_flags(const DpBenchOptions& o, int p, std::vector<Workload>& workloads,
                   std::vector<Layout>& layouts, std::vector<bool>& overlaps) {
  if (o.workloads.empty()) return invalid_argument("--workload: give W1a and/or W1b");
  if (o.layouts.empty()) return invalid_argument("--layout: give at least one layout");
  for (const std::string& name : o.workloads) {
    KILN_ASSIGN_OR_RETURN(Workload w, parse_workload(name, p, o.per_rank_batch));
    workloads.push_back(std::move(w));
  }
  for (const std::string& name : o.layouts) {
    KILN_ASSIGN_OR_RETURN(Layout l, parse_layout(name, p));
    layouts.push_back(std::move(l));
  }
  if (o.overlap == "on" || o.overlap == "both") overlaps.push_back(true);
  if (o.overlap == "off" || o.overlap == "both") overlaps.push_back(false);
  if (overlaps.empty()) return invalid_argument("--overlap {}: on, off or both", o.overlap);
  for (const Workload& w : workloads)
    for (const Layout& l : layouts) {
      const Status st = parallel::check_data_parallel(dp_options(l, true, o), p,
                                                      train_options(w, w.batch, o));
      if (!st.ok())
        return invalid_argument("workload {} layout {}: {}", w.name, l.name, st.message());
    }
  return {};
}

int run_dp_bench(const DpBenchOptions& o) {
  comm::init();
  int rc = 0;
  {
    comm::Communicator& world = comm::Communicator::world();
    const int p = world.size(), rank = world.rank();
    std::vector<Workload> workloads;
    std::vector<Layout> layouts;
    std::vector<bool> overlaps;
    if (const Status st = check_flags(o, p, workloads, layouts, overlaps); !st.ok()) {
      if (rank == 0) fmt::print(stderr, "kiln bench dp: {}\n", st.message());
      comm::finalize();
      return kUserError;
    }
    set_num_threads(o.threads);
    if (rank == 0) {
      std::string names;
      for (const Layout& l : layouts) names += (names.empty() ? "" : ",") + l.name;
      fmt::print(
          "# bench dp P {} threads {} layouts {} overlap {} steps {} warmup {} bucket_mb {} "
          "prefetch {} "
          "per_rank_batch {} cpu {}\n",
          p, o.threads, names, o.overlap, o.steps, o.warmup, o.bucket_mb, o.prefetch,
          o.per_rank_batch, cpu_features().brand);
    }
    for (const Workload& w : workloads) {
      const TokenShard data = bench::random_tokens(w.cfg.vocab_size);  // the same on every rank
      const int64_t rank_batch = w.batch / p;
      if (rank == 0)
        fmt::print("# workload {}: {}; global batch {} ({} per rank) x seq {}\n", w.name,
                   w.cfg.describe(), w.batch, rank_batch, w.seq_len);
      double ddp_tokens_per_s[2] = {0, 0};  // [overlap on, off]
      for (const Layout& l : layouts)
        for (const bool overlap : overlaps) {
          const parallel::DataParallelOptions dpo = dp_options(l, overlap, o);
          auto r = measure(w, data, train_options(w, w.batch, o), &dpo, o);
          if (!r.ok()) {  // the same verdict on every rank (a config or plan error)
            if (rank == 0)
              fmt::print(stderr, "kiln bench dp: workload {} layout {}: {}\n", w.name, l.name,
                         r.status().message());
            rc = 1;
            continue;
          }
          double peak = r->peak_bytes;
          MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_MAX, world.handle());
          r->peak_bytes = peak;
          if (l.name == "ddp") ddp_tokens_per_s[overlap ? 0 : 1] = r->tokens_per_s;
          if (rank == 0) print_row(l.name, p, w.name, overlap ? "on" : "off", *r);
        }
      if (!o.single) continue;
      // The one-process trainer at the per-rank batch, on rank 0 while the others sleep.
      Result single;
      if (rank == 0) {
        auto r = measure(w, data, train_options(w, rank_batch, o), nullptr, o);
        if (r.ok()) {
          single = *r;
          print_row("single", 1, w.name, "-", single);
        } else {
          fmt::print(stderr, "kiln bench dp: workload {} layout single: {}\n", w.name,
                     r.status().message());
          rc = 1;
        }
      }
      bench::sleeping_barrier(world);
      if (rank == 0 && o.per_rank_batch > 0 && single.tokens_per_s > 0)
        for (const bool overlap : overlaps)
          if (const double ddp = ddp_tokens_per_s[overlap ? 0 : 1]; ddp > 0) {
            fmt::print("workload {} overlap {} weak_scaling_efficiency {:.3f}\n", w.name,
                       overlap ? "on" : "off", ddp / (p * single.tokens_per_s));
            std::fflush(stdout);
          }
    }
  }
  comm::finalize();
  return rc;
}

}  // namespace

void register_bench_dp(CLI::App& app) {
  CLI::App* bench_cmd = app.get_subcommand("bench");
  auto opt = std::make_shared<DpBenchOptions>();
  CLI::App* cmd =
      bench_cmd->add_subcommand("dp",
                                "Data-parallel training (W7) under mpirun: DDP, ZeRO-1/2/3, FSDP, "
                                "HSDP; step time, comm, exposed, memory");
  cmd->add_option("--workload", opt->workloads,
                  "W1a, W1b (repeatable or a comma list; default both)")
      ->delimiter(',');
  cmd->add_option("--layout", opt->layouts,
                  "ddp, zero1, zero2, zero3, fsdp (= zero3), hsdp (zero3 in shard groups of 2; "
                  "even P >= 4); "
                  "comma list, default ddp,zero1,zero2,zero3")
      ->delimiter(',');
  cmd->add_option("--steps", opt->steps, "Timed steps after warm-up (median)")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--warmup", opt->warmup, "Untimed warm-up steps")->check(CLI::Range(0, 1000));
  cmd->add_option("--threads", opt->threads, "Worker threads per rank")
      ->check(CLI::Range(1, static_cast<int>(kMaxThreads)));
  cmd->add_option("--overlap", opt->overlap,
                  "Reductions during backward: on, off or both (two rows)")
      ->check(CLI::IsMember({"on", "off", "both"}));
  cmd->add_option("--per-rank-batch", opt->per_rank_batch,
                  "Weak scaling: global batch = this x P (default: the workload's batch is the "
                  "global batch)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--bucket-mb", opt->bucket_mb, "DDP / ZeRO-1 gradient bucket size in MiB")
      ->check(CLI::Range(1e-3, 65536.0));
  cmd->add_option("--prefetch", opt->prefetch, "ZeRO-3 units gathered ahead (0: on demand)")
      ->check(CLI::Range(0, 64));
  cmd->add_flag(
      "--single", opt->single,
      "Also the single-process trainer at the per-rank batch on rank 0 (weak-scaling baseline)");
  cmd->callback([opt] {
    const int rc = run_dp_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
