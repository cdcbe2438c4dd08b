// `kiln bench <what>`: kiln beside its peers in one run (the code lives in bench/).
#include <cstdio>
#include <memory>
#include <string>

#include "apps/kiln/commands.h"
#include "bench/gemm_bench.h"
#include "bench/gemm_cuda_bench.h"

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
  gemm->add_flag("--pack", gemm_opt->pack, "Only the packing of B (1 thread; --shapes and --threads-list are not used): a 3072 x 768 weight in both layouts, cold and warm, GB/s");
  gemm->add_flag("--tiles", gemm_opt->tiles,
                 "Only the f32 micro-kernel's register tilings (the one used and its neighbours), "
                 "each in L1 beside the FMA loop, 1 thread");
  gemm->add_option("--threads-list", gemm_opt->threads_list, "Thread counts, e.g. 1,2")
      ->delimiter(',')
      ->check(CLI::Range(1, 7));
  gemm->add_option("--dtype", gemm_opt->dtype,
                   "f32, bf16 or all; f16: the fp16-arithmetic GEMM (AVX512-FP16) "
                   "beside f32 and oneDNN's f16, with its error against f32")
      ->check(CLI::IsMember({"f32", "bf16", "all", "f16"}));
  gemm->add_option("--f16-chunk", gemm_opt->f16_chunk,
                   "--dtype f16: k steps summed in fp16 before the f32 add")
      ->check(CLI::Range(1, 4096));
  gemm->add_option("--reps", gemm_opt->reps, "Timed repetitions after warm-up (>= 5 recommended)")
      ->check(CLI::Range(1, 1000));
  gemm->add_option("--shapes", gemm_opt->shapes,
                   "Only these shapes: 512 (square), 256x3072x768 (M x N x K), 256x3072x768t (B as N x K), d4 (M=4 decode, warm+cold), d4w, d4c")
      ->delimiter(',');
  // --device cuda: the CUDA GEMM ladder beside cuBLAS (bench/gemm_cuda_bench.h) instead.
  auto gemm_device = std::make_shared<std::string>("host");
  gemm->add_option("--device", *gemm_device, "host (the CPU GEMM beside its peers) or cuda (the CUDA "
                   "ladder beside cuBLAS; --shapes are square sizes there)")
      ->check(CLI::IsMember({"host", "cuda"}));
  gemm->callback([gemm_opt, gemm_device] {
    if (*gemm_device == "cuda") {
      bench::GemmCudaBenchOptions cuda_opt;
      cuda_opt.dtype = gemm_opt->dtype;
      cuda_opt.reps = gemm_opt->reps;
      cuda_opt.json = gemm_opt->json;
      if (gemm_opt->quick) cuda_opt.sizes = {1024, 2048};
      if (!gemm_opt->shapes.empty()) {
        cuda_opt.sizes.clear();
        for (const std::string& s : gemm_opt->shapes) {
          if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) {
            std::fprintf(stderr, "kiln bench gemm --device cuda: --shapes takes square sizes, got '%s'\n", s.c_str());
            std::exit(2);
          }
          cuda_opt.sizes.push_back(std::stoi(s));
        }
      }
      const int rc = bench::run_gemm_cuda_bench(cuda_opt);
      if (rc != 0) std::exit(rc);
      return;
    }
    const int rc = bench::run_gemm_bench(*gemm_opt);
    if (rc != 0) std::exit(rc);
  });

  register_bench_dp(app);  // kiln bench dp: W7 data parallelism (cmd_bench_dp.cpp)
  register_bench_tp_decode(app);  // kiln bench tp-decode: W2-S decode at tp ranks (cmd_bench_tp_decode.cpp)
  register_bench_tp(app);  // kiln bench tp: W7 tensor parallelism (cmd_bench_tp.cpp)
  register_bench_pp(app);  // kiln bench pp: W7 pipeline parallelism (cmd_bench_pp.cpp)
  register_bench_cp(app);  // kiln bench cp: context-parallel attention (cmd_bench_cp.cpp)
  register_bench_mla_decode(app);  // kiln bench mla-decode: MHA, GQA and MLA decode (cmd_bench_mla_decode.cpp)
  register_bench_launch(app);  // kiln bench launch: CPU and GPU launch cost (cmd_bench_launch.cpp)
  register_bench_graph(app);  // kiln bench graph: decode eager vs captured graphs (cmd_bench_graph.cpp)
  register_bench_train_graph(app);  // kiln bench train-graph: training steps per graph mode (cmd_bench_train_graph.cpp)
  register_bench_fusion(app);  // kiln bench fusion: JIT-fused elementwise chain vs eager (cmd_bench_fusion.cpp)
}

}  // namespace kiln::app
