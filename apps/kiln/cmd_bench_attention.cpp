// `kiln bench attention` (W5): naive vs FlashAttention forward / forward+backward time and
// extra memory, the flash tiles (--tune sweeps them), where the flash forward's time goes, and
// split-KV decode latency; the code lives in bench/attention_bench.cpp.
#include <cstdlib>
#include <memory>
#include <string>

#include "apps/kiln/commands.h"
#include "bench/attention_bench.h"
#include "bench/attention_cuda_bench.h"

namespace kiln::app {

void register_bench_attention(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto opt = std::make_shared<bench::AttentionBenchOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "attention", "Attention (W5): naive vs FlashAttention time and extra memory, split-KV decode latency");
  cmd->add_flag("--json", opt->json, "One JSON object per line: impl, T, pass, ms, extra_bytes");
  cmd->add_flag("--quick", opt->quick, "T up to 2048, decode context up to 8192");
  cmd->add_option("--reps", opt->reps, "Timed repetitions after warm-up (median)")->check(CLI::Range(1, 1000));
  cmd->add_option("--seq", opt->seq_lens, "Sequence lengths T, e.g. 1024,4096")->delimiter(',')->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--context", opt->contexts, "Decode contexts, e.g. 4096,32768")->delimiter(',')->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--part", opt->part, "Which tables: train (fwd, fwd+bwd), decode, or all")
      ->check(CLI::IsMember({"all", "train", "decode"}));
  cmd->add_flag("!--no-naive", opt->naive, "Time flash only (the naive path is slow at T >= 4096)");
  cmd->add_flag("--tune", opt->tune,
                "Sweep the flash tiles (Br x Bc) first, forward and backward, and save the fastest in the tune file");
  cmd->add_option("--tune-seq", opt->tune_seq, "T of the tile sweep")->check(CLI::Range(64, 1 << 16));
  auto device = std::make_shared<std::string>("cpu");
  cmd->add_option("--device", *device,
                  "cpu (default) | cuda: the CUDA flash forward and forward+backward, checked against the CPU "
                  "kernels (T default 1024,2048,4096; bench/attention_torch.py --device cuda adds SDPA)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([opt, device] {
    int rc = 0;
    if (*device == "cuda") {
      bench::AttentionCudaBenchOptions c;
      if (!opt->seq_lens.empty()) c.seq_lens = opt->seq_lens;
      c.reps = opt->reps;
      c.json = opt->json;
      rc = bench::run_attention_cuda_bench(c);
    } else {
      rc = bench::run_attention_bench(*opt);
    }
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
