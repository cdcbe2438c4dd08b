// kiln: one CLI for training, generation, serving, quantization, benchmarks and profiling.
#include <cstdio>
#include <string>

#include "apps/kiln/commands.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/thread_pool.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: train, parallelize, quantize, serve and measure transformer language models"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");

  int threads = 0;
  std::string simd;
  app.add_option("--threads", threads, "Worker threads for every kernel (default: all CPUs, or KILN_NUM_THREADS)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--simd", simd, "Force a lower SIMD target (also KILN_SIMD)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  app.parse_complete_callback([&] {
    if (threads > 0) kiln::set_num_threads(threads);
    if (!simd.empty()) {
      for (const auto& info : kiln::kSimdTargets) {
        if (info.name == simd && !kiln::set_simd_target(info.target)) {
          std::fprintf(stderr, "kiln: --simd %s is not supported by this CPU\n", simd.c_str());
          std::exit(kiln::app::kUserError);
        }
      }
    }
  });

  kiln::app::register_info(app);
  kiln::app::register_bench(app);
  kiln::app::register_bench_attention(app);
  kiln::app::register_tokenizer(app);
  kiln::app::register_train(app);
  kiln::app::register_bench_tokenizer(app);
  kiln::app::register_comm(app);  // after bench: adds `bench comm` and `plan comm`
  kiln::app::register_eval(app);
  kiln::app::register_bench_train(app);  // after bench: adds `bench train`
  kiln::app::register_bench_numerics(app);  // after bench: adds `bench numerics`
  kiln::app::register_serve(app);
  kiln::app::register_bench_serve(app);  // after bench: adds `bench serve`
  kiln::app::register_quantize(app);  // after bench: adds `bench quant-decode`
  kiln::app::register_convert(app);
  kiln::app::register_bench_quant(app);  // after bench: adds `bench quant`
  kiln::app::register_bench_prepacked(app);  // after bench: adds `bench prepacked`

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
