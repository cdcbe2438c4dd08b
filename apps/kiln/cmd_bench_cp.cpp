// `kiln bench cp` (context parallelism) under mpirun -np C: ring with and without zig-zag,
// Ulysses and the 2 × 2 hybrid, per-rank compute, exposed communication and memory
// (bench/cp_bench.h).
#include <memory>

#include "apps/kiln/commands.h"
#include "bench/cp_bench.h"

namespace kiln::app {

void register_bench_cp(CLI::App& app) {
  CLI::App* bench_cmd = app.get_subcommand("bench");
  auto opt = std::make_shared<bench::CpBenchOptions>();
  CLI::App* cmd = bench_cmd->add_subcommand(
      "cp", "Context-parallel attention under mpirun (C = P): ring contiguous vs zig-zag (causal imbalance), "
            "Ulysses, hybrid 2x2 at P = 4; compute, exposed communication and memory per rank");
  cmd->add_option("--seq", opt->seqs, "Sequence lengths, e.g. 8192,16384,32768")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 22));
  cmd->add_option("--heads", opt->heads, "Query heads")->check(CLI::Range(int64_t{1}, int64_t{256}));
  cmd->add_option("--kv-heads", opt->kv_heads, "KV heads (divides --heads)")->check(CLI::Range(int64_t{1}, int64_t{256}));
  cmd->add_option("--head-dim", opt->head_dim, "Head dimension")->check(CLI::Range(int64_t{1}, int64_t{512}));
  cmd->add_option("--reps", opt->reps, "Timed forward + backward calls per row")->check(CLI::Range(1, 1000));
  cmd->add_option("--threads", opt->threads, "Kernel threads per rank")->check(CLI::Range(1, 256));
  cmd->add_flag("!--no-causal", opt->causal, "Full (non-causal) attention");
  cmd->callback([opt] {
    const int rc = bench::run_cp_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
