// `kiln bench <what>`: kiln beside its peers in one run (the code lives in bench/).
#include <memory>

#include "apps/kiln/commands.h"
#include "bench/gemm_bench.h"

namespace kiln::app {

void register_bench(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("bench", "Benchmarks: kiln beside its peers, ratios printed");
  cmd->require_subcommand(1);

  // kiln bench gemm: W3 beside OpenBLAS and oneDNN.
  auto gemm_opt = std::make_shared<bench::GemmBenchOptions>();
  CLI::App* gemm = cmd->add_subcommand("gemm", "GEMM (W3) beside OpenBLAS and oneDNN, f32 and bf16");
  gemm->add_flag("--json", gemm_opt->json, "One JSON object per line (per peer)");
  gemm->add_flag("--tune", gemm_opt->tune, "Time (MC, KC, NC) candidates first and save the best");
  gemm->add_flag("--quick", gemm_opt->quick, "A small subset (~20 s)");
  gemm->add_option("--threads-list", gemm_opt->threads_list, "Thread counts, e.g. 1,2")
      ->delimiter(',')
      ->check(CLI::Range(1, 7));
  gemm->add_option("--dtype", gemm_opt->dtype, "f32, bf16 or all")
      ->check(CLI::IsMember({"f32", "bf16", "all"}));
  gemm->add_option("--reps", gemm_opt->reps, "Timed repetitions after warm-up (>= 5 recommended)")
      ->check(CLI::Range(1, 1000));
  gemm->add_option("--shapes", gemm_opt->shapes,
                   "Only these shapes: 512 (square), d4 (M=4 decode, warm+cold), d4w, d4c")
      ->delimiter(',');
  gemm->callback([gemm_opt] {
    const int rc = bench::run_gemm_bench(*gemm_opt);
    if (rc != 0) std::exit(rc);
  });

  register_bench_dp(app);  // kiln bench dp: W7 data parallelism (cmd_bench_dp.cpp)
  register_bench_tp_decode(app);  // kiln bench tp-decode: W2-S decode at tp ranks (cmd_bench_tp_decode.cpp)
  register_bench_tp(app);  // kiln bench tp: W7 tensor parallelism (cmd_bench_tp.cpp)
  register_bench_pp(app);  // kiln bench pp: W7 pipeline parallelism (cmd_bench_pp.cpp)
  register_bench_cp(app);  // kiln bench cp: context-parallel attention (cmd_bench_cp.cpp)
  register_bench_mla_decode(app);  // kiln bench mla-decode: MHA, GQA and MLA decode (cmd_bench_mla_decode.cpp)
  register_bench_graph(app);  // kiln bench graph: decode eager vs captured graphs (cmd_bench_graph.cpp)
  register_bench_fusion(app);  // kiln bench fusion: JIT-fused elementwise chain vs eager (cmd_bench_fusion.cpp)
}

}  // namespace kiln::app
