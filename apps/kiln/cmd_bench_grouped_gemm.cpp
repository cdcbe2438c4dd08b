// `kiln bench grouped-gemm`: the expert GEMMs of a dropless MoE layer (W1-MoE: d_model 384,
// expert FFN 1024, 2048 tokens routed top-2) as one cpu::grouped_gemm call beside a loop of
// cpu::gemm over the experts, timed interleaved in the same run: the forward (y_e = x_e·W_eᵀ),
// input gradient (dx_e = dy_e·W_e) and weight gradient (dW_e += dy_eᵀ·x_e, ragged k) patterns,
// under balanced and Zipf-skewed routing over E = 8 and 64 experts, at 1 and 2 threads
// (bench/grouped_gemm_bench.cpp; `kiln bench moe --only gemm` runs it on W1-MoE's routing).
#include <cstdlib>
#include <memory>

#include "apps/kiln/commands.h"
#include "bench/grouped_gemm_bench.h"

namespace kiln::app {

void register_bench_grouped_gemm(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto opt = std::make_shared<bench::GroupedBenchOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "grouped-gemm", "MoE expert GEMMs: one grouped call vs a loop of gemm per expert");
  cmd->add_option("--routing", opt->routings,
                  "Routings e<E>-balanced | e<E>-zipf, e.g. e8-zipf,e64-zipf")
      ->delimiter(',');
  cmd->add_option("--patterns", opt->patterns, "forward, input-grad, weight-grad")->delimiter(',');
  cmd->add_option("--threads-list", opt->threads, "Thread counts, e.g. 1,2")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  cmd->add_option("--reps", opt->reps, "Timed rounds (median)")->check(CLI::Range(1, 1000));
  cmd->add_option("--tokens", opt->tokens, "Tokens routed (N)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--top-k", opt->top_k, "Experts per token")->check(CLI::Range(1, 64));
  cmd->add_option("--d-model", opt->d_model, "Model width C")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--ffn", opt->ffn, "Expert FFN width F")->check(CLI::Range(1, 1 << 16));
  cmd->callback([opt] {
    const int rc = bench::run_grouped_gemm_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
