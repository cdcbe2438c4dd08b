// `kiln bench comm` (collectives beside MPI's own, run under mpirun) and `kiln plan comm`
// (the collectives' cost on named topologies, up to 65,536 ranks; no MPI needed).
#include <cstdlib>
#include <memory>

#include "apps/kiln/commands.h"
#include "bench/comm_bench.h"

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
                  "recursive_halving, pairwise, binomial_tree, chain, auto, mpi or all");
  cmd->add_option("--dtype", opt->dtype, "f32, bf16 or f16")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--redop", opt->redop, "sum, avg or max")->check(CLI::IsMember({"sum", "avg", "max"}));
  cmd->add_option("--min-bytes", opt->min_bytes, "Smallest size (bytes)")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--max-bytes", opt->max_bytes, "Largest size (bytes; sizes go 8, 32, 128, ... by 4)")
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 30));
  cmd->add_option("--reps", opt->reps, "Timed repetitions after warm-up")->check(CLI::Range(1, 1000));
  cmd->add_option("--ranks-per-node", opt->ranks_per_node,
                  "Hierarchical: ranks per node (0 = from MPI_Comm_split_type)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--json", opt->json, "One JSON object per line");
  cmd->add_flag("--calibrate", opt->calibrate,
                "Measure alpha, beta and per-algorithm fits; cache them for --algo auto");
  cmd->callback([opt] {
    const int rc = bench::run_comm_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace

void register_comm(CLI::App& app) {
  if (CLI::App* bench = find_subcommand(app, "bench")) register_bench_comm(*bench);
}

}  // namespace kiln::app
