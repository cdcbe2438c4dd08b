// `kiln bench train`: registered under the existing `bench` subcommand (the code lives in
// bench/train_bench.cpp); bench/compare_pytorch.sh runs it beside PyTorch.
#include <memory>

#include "apps/kiln/commands.h"
#include "bench/train_bench.h"

namespace kiln::app {

void register_bench_train(CLI::App& app) {
  CLI::App* bench_cmd = app.get_subcommand("bench");
  auto opt = std::make_shared<bench::TrainBenchOptions>();
  CLI::App* cmd = bench_cmd->add_subcommand("train", "Training step (W1a / W1b): forward, backward, AdamW; tokens/s, MFU");
  cmd->add_option("--preset", opt->preset, "w1a (vocab 65, d 384, 6 layers, B 8, T 256) | w1b (GPT-2 124M, B 4, T 64)")
      ->check(CLI::IsMember({"w1a", "w1b"}));
  cmd->add_option("--threads", opt->threads, "Worker threads (default: kiln's)")->check(CLI::Range(1, 1024));
  cmd->add_option("--steps", opt->steps, "Timed steps after warm-up (median; >= 5 recommended)")->check(CLI::Range(1, 10000));
  cmd->add_option("--warmup", opt->warmup, "Untimed warm-up steps")->check(CLI::Range(0, 1000));
  cmd->add_flag("--json", opt->json, "One JSON object instead of text");
  cmd->add_option("--precision", opt->precision,
                  "fp32 | bf16 | fp16 | fp8 (fp16, fp8 emulated) | all (each against fp32, interleaved in one run)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8", "all"}));
  cmd->add_option("--checkpoint", opt->checkpoint, "Activation checkpointing: none | full | selective")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  cmd->add_option("--profile", opt->profile, "Write a Chrome/Perfetto trace of the timed steps (FILE.json)");
  cmd->callback([opt] {
    const int rc = bench::run_train_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
