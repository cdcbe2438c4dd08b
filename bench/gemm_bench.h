// `kiln bench gemm`: kiln's GEMM beside OpenBLAS and oneDNN on the W3 shapes (square 256..4096,
// decode-like M = 1..8 with K = N = 4096 warm and cold), f32 and bf16, 1 and 2 threads; % of the
// measured FMA peak and, for decode shapes, effective weight bandwidth vs measured DRAM reads.
#pragma once

#include <string>
#include <vector>

namespace kiln::bench {

struct GemmBenchOptions {
  bool json = false;   // one JSON object per line (per peer) instead of the table
  bool tune = false;   // time (MC, KC, NC) candidates first and save the best to the tune file
  bool quick = false;  // small subset, ~20 s
  bool pack = false;   // only the packing of B (a 3072 x 768 weight, both layouts, cold and warm)
  bool tiles = false;  // only the f32 micro-kernel's register tilings in L1 beside the FMA loop
  std::vector<int> threads_list = {1, 2};
  std::string dtype = "all";  // f32 | bf16 | all, or f16: the fp16-arithmetic GEMM's own table
  int f16_chunk = 64;         // --dtype f16: k steps summed in fp16 (gemm_f16.h)
  int reps = 5;               // timed repetitions after one warm-up; median, min-max printed
  // Only these shapes when not empty: "512" a square, "256x3072x768" M x N x K (B stored K x N),
  // "256x3072x768t" (B stored N x K, as weights are), "d4" decode-like M = 4 warm and cold,
  // "d4w" / "d4c" warm or cold only. A token that is none of these is an error before any timing.
  std::vector<std::string> shapes;
};

int run_gemm_bench(const GemmBenchOptions& opt);

}  // namespace kiln::bench
