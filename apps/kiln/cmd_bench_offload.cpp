// `kiln bench offload`: the optimizer state in memory against offloaded to a file, in one run
// (the code lives in bench/offload_bench.cpp).
#include <memory>

#include "apps/kiln/commands.h"
#include "bench/offload_bench.h"

namespace kiln::app {

void register_bench_offload(CLI::App& app) {
  CLI::App* bench_cmd = app.get_subcommand("bench");
  auto opt = std::make_shared<bench::OffloadBenchOptions>();
  CLI::App* cmd = bench_cmd->add_subcommand(
      "offload", "Training step with AdamW's moments in memory vs offloaded to a file: step times, I/O rate, memory");
  cmd->add_option("--preset", opt->preset, "w1a | w1b (default; GPT-2 124M: ~950 MiB of moments)")
      ->check(CLI::IsMember({"w1a", "w1b"}));
  cmd->add_option("--dir", opt->dir, "Directory for the moments' file (default /var/tmp; a disk measures the disk)")
      ->type_name("DIR");
  cmd->add_option("--threads", opt->threads, "Worker threads (default: kiln's)")->check(CLI::Range(1, 1024));
  cmd->add_option("--steps", opt->steps, "Timed steps after warm-up (median)")->check(CLI::Range(1, 10000));
  cmd->add_option("--warmup", opt->warmup, "Untimed warm-up steps")->check(CLI::Range(0, 1000));
  cmd->add_flag("--json", opt->json, "One JSON object instead of text");
  cmd->callback([opt] {
    const int rc = bench::run_offload_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
