// `kiln bench comm` (collectives beside MPI's own, run under mpirun) and `kiln plan comm`
// (the collectives' cost on named topologies, up to 65,536 ranks; no MPI needed).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/kiln/commands.h"
#include "bench/comm_bench.h"
#include "kiln/perf/comm_model.h"

namespace kiln::app {
namespace {

CLI::App* find_subcommand(CLI::App& app, const std::string& name) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == name) return sub;
  return nullptr;
}

void register_bench_comm(CLI::App& bench) {
  auto opt = std::make_shared<bench::CommBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "comm", "Collectives (W4) beside MPI's own: mpirun -np P kiln bench comm [--op ...] [--algo ...]");
  cmd->add_option("--op", opt->op, "allreduce, allgather, reducescatter, alltoall or bcast")
      ->check(CLI::IsMember({"allreduce", "allgather", "reducescatter", "alltoall", "bcast"}));
  cmd->add_option("--algo", opt->algo,
                  "ring, recursive_doubling, rabenseifner, double_binary_tree, hierarchical, "
                  "recursive_halving, pairwise, scattered, binomial_tree, chain, auto, mpi or all");
  cmd->add_option("--dtype", opt->dtype, "f32, bf16 or f16")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--redop", opt->redop, "sum, avg or max")->check(CLI::IsMember({"sum", "avg", "max"}));
  cmd->add_option("--min-bytes", opt->min_bytes, "Smallest size (bytes)")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--max-bytes", opt->max_bytes, "Largest size (bytes; sizes go 8, 32, 128, ... by 4)")
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 30));
  cmd->add_option("--reps", opt->reps, "Least number of interleaved timing rounds per size (more when they fit in ~0.3 s)")->check(CLI::Range(1, 1000));
  cmd->add_option("--ranks-per-node", opt->ranks_per_node,
                  "Hierarchical: ranks per node (0 = the real node, or virtual nodes on one machine)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--chunk-bytes", opt->chunk_bytes,
                  "Pipeline chunk of ring, double_binary_tree and chain for a sweep (0 = per-size defaults)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_flag("--json", opt->json, "One JSON object per line");
  cmd->add_flag("--calibrate", opt->calibrate,
                "Measure alpha, beta and per-algorithm fits; cache them for --algo auto");
  cmd->add_flag("--pool", opt->pool,
                "With --calibrate: fit through the per-size median of this launch's times and those "
                "of the last 2 launches stored for the same p and placement (a launch in a slow "
                "process state then cannot decide alone)")
      ->needs("--calibrate");
  cmd->add_flag_callback("--no-auto-probe", [opt] { opt->auto_probe = false; },
                         "`auto` takes the alpha-beta model's pick alone, without the in-process probe "
                         "of close candidates");
  cmd->callback([opt] {
    const int rc = bench::run_comm_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

struct PlanCommOptions {
  std::string topology;
  int ranks = 0;
  std::string size;  // empty: sweep 1 KiB .. 16 GiB
  std::string op = "allreduce";
  bool json = false;
  bool list = false;
};

int run_plan_comm(const PlanCommOptions& o) {
  if (o.list || o.topology.empty()) {
    for (const perf::Topology& t : perf::topologies())
      fmt::print("{:<14} up to {:>6} ranks: {}\n", t.name, t.max_ranks, t.description);
    return o.list ? 0 : (std::fprintf(stderr, "kiln plan comm: --topology is required\n"), kUserError);
  }
  const auto topo = perf::find_topology(o.topology);
  if (!topo) {
    std::fprintf(stderr, "kiln plan comm: unknown topology %s (see --list)\n", o.topology.c_str());
    return kUserError;
  }
  const auto op = perf::parse_model_op(o.op);
  std::vector<double> sizes;
  if (o.size.empty()) {
    for (double s = 1024; s <= 16.0 * (1 << 30); s *= 16) sizes.push_back(s);
  } else {
    const auto b = perf::parse_bytes(o.size);
    if (!b.ok()) {
      std::fprintf(stderr, "kiln plan comm: --size: %s\n", b.status().message().c_str());
      return kUserError;
    }
    sizes.push_back(*b);
  }
  if (!o.json)
    fmt::print("# {} on {} ranks of {}: {}\n# busbw factor {:.4f}; * = least time\n", o.op, o.ranks,
               topo->name, topo->description, perf::busbw_factor(*op, o.ranks));
  for (double n : sizes) {
    const auto preds = perf::predict_comm(*topo, *op, o.ranks, n);
    if (!preds.ok()) {
      std::fprintf(stderr, "kiln plan comm: %s\n", preds.status().message().c_str());
      return kUserError;
    }
    size_t best = 0;
    for (size_t i = 1; i < preds->size(); ++i)
      if ((*preds)[i].seconds < (*preds)[best].seconds) best = i;
    if (!o.json) fmt::print("#\n# size {:.0f} B\n#  {:<20} {:>14} {:>12} {:>12}  {}\n", n, "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "note");
    for (size_t i = 0; i < preds->size(); ++i) {
      const perf::CommPrediction& c = (*preds)[i];
      if (o.json) {
        fmt::print("{}\n", nlohmann::json{{"topology", topo->name}, {"op", o.op}, {"ranks", o.ranks},
                                          {"size", n}, {"algo", c.algo}, {"time_us", c.seconds * 1e6},
                                          {"algbw_GBps", c.algbw / 1e9}, {"busbw_GBps", c.busbw / 1e9},
                                          {"best", i == best}, {"note", c.note}}.dump());
      } else {
        fmt::print("{} {:<20} {:>14.2f} {:>12.2f} {:>12.2f}  {}\n", i == best ? '*' : ' ', c.algo,
                   c.seconds * 1e6, c.algbw / 1e9, c.busbw / 1e9, c.note);
      }
    }
  }
  return 0;
}

void register_plan_comm(CLI::App& plan) {
  auto opt = std::make_shared<PlanCommOptions>();
  CLI::App* cmd = plan.add_subcommand(
      "comm", "Predicted time, algbw and busbw of each collective algorithm on a named topology");
  cmd->add_option("--topology", opt->topology, "h100-node, h100-ib, dgx2-v100, tpu-torus-2d or tpu-torus-3d");
  cmd->add_option("--ranks", opt->ranks, "Number of ranks p")->check(CLI::Range(2, 65536));
  cmd->add_option("--size", opt->size, "Bytes, e.g. 1GiB, 256MiB, 4096 (default: sweep 1 KiB..16 GiB)");
  cmd->add_option("--op", opt->op, "allreduce, allgather, reducescatter or alltoall")
      ->check(CLI::IsMember({"allreduce", "allgather", "reducescatter", "alltoall"}));
  cmd->add_flag("--json", opt->json, "One JSON object per line");
  cmd->add_flag("--list", opt->list, "List the topologies");
  cmd->callback([opt] {
    if (!opt->list && !opt->topology.empty() && opt->ranks < 2) {
      std::fprintf(stderr, "kiln plan comm: --ranks is required (2..65536)\n");
      std::exit(kUserError);
    }
    const int rc = run_plan_comm(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace

void register_comm(CLI::App& app) {
  if (CLI::App* bench = find_subcommand(app, "bench")) register_bench_comm(*bench);
  CLI::App* plan = find_subcommand(app, "plan");
  if (plan == nullptr) {
    plan = app.add_subcommand("plan", "Performance models: predicted cost of layouts and collectives");
    plan->require_subcommand(1);
  }
  register_plan_comm(*plan);
}

}  // namespace kiln::app
