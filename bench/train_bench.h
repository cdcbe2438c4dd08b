// `kiln bench train`: full training steps (forward, backward, AdamW) of the W1a / W1b shapes
// (BENCH.md) on random tokens, timed as median of >= 5 after warm-up; tokens/s, GFLOP/s and
// MFU against the measured FMA peak. bench/compare_pytorch.sh runs PyTorch's step beside it.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/core/status.h"

namespace kiln::bench {

// The W1a / W1b shapes of BENCH.md, shared by `bench train` and `bench dp`: the ModelConfig
// preset with the same shape, the batch and the sequence length.
struct TrainWorkload {
  const char* preset;
  int64_t batch, seq_len;
};
// "w1a" | "w1b" (InvalidArgument naming the known ones otherwise).
Expected<TrainWorkload> train_workload(const std::string& name);

struct TrainBenchOptions {
  std::string preset = "w1a";  // w1a (GPT-2 style, vocab 65, d 384, 6 layers; B 8, T 256) | w1b (GPT-2 124M; B 4, T 64)
  int threads = 0;             // 0: kiln's current thread count
  int steps = 5;               // timed steps after warm-up (median, min-max)
  int warmup = 2;
  bool json = false;           // one JSON object instead of the text lines
  // fp32 | bf16 | fp16 | fp8 | all (every precision, interleaved step by step in one run,
  // each reported against fp32). fp16 and fp8 are emulated (rounding around the f32 GEMM).
  std::string precision = "fp32";
  std::string checkpoint = "none";  // none | full | selective
  std::string profile;              // Chrome trace of the timed steps (perf/profiler.h); empty: off
};

int run_train_bench(const TrainBenchOptions& opt);

}  // namespace kiln::bench
