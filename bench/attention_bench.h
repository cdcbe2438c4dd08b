// `kiln bench attention` (W5 of BENCH.md): naive (T×T GEMM path) and FlashAttention forward and
// forward+backward time and peak extra memory at T = 256..8192 (causal, batch 1, 12 heads, head
// dim 64) with the flash tiles in use, where the flash forward's time goes (Q·Kᵀ, mask, softmax,
// P·V) and its roofline placement, and decode latency of split-KV against a single-thread
// sequential scan at context 512..32768.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::bench {

struct AttentionBenchOptions {
  bool json = false;   // one JSON object per line: impl, T, pass, ms, extra_bytes, ...
  bool quick = false;  // T up to 2048, context up to 8192
  int reps = 3;        // timed repetitions after one warm-up (median)
  std::vector<int64_t> seq_lens;  // T values (default 256..8192)
  std::vector<int64_t> contexts;  // decode contexts (default 512..32768)
  std::string part = "all";       // "train" (fwd / fwd+bwd), "decode" or "all"
  bool naive = true;              // time the naive implementation beside flash
  bool tune = false;              // sweep the flash tiles first (cpu::autotune_flash_tiles) and save them
  int64_t tune_seq = 1024;        // the sweep's T
  // Naive stops where its score blocks would need more than this (it materializes T×S per
  // thread, twice in backward).
  int64_t naive_max_bytes = int64_t{3} << 30;
};

int run_attention_bench(const AttentionBenchOptions& opt);

}  // namespace kiln::bench
