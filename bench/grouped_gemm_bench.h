// The grouped-GEMM benchmark (`kiln bench grouped-gemm`, and `kiln bench moe`'s gemm section):
// the expert GEMMs of one dropless MoE layer as one cpu::grouped_gemm call beside a loop of
// cpu::gemm over the experts, timed interleaved, for routings given by name or as counts.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::bench {

struct GroupedBenchOptions {
  std::string command = "kiln bench grouped-gemm";  // names the caller in messages
  // "e<E>-balanced" | "e<E>-zipf": rows per expert computed from the name.
  std::vector<std::string> routings = {"e8-balanced", "e8-zipf", "e64-balanced", "e64-zipf"};
  // More routings as (name, rows per expert), e.g. a real router's counts; each sums to
  // tokens × top_k.
  std::vector<std::pair<std::string, std::vector<int64_t>>> counted;
  std::vector<std::string> patterns = {"forward", "input-grad", "weight-grad"};
  std::vector<int> threads = {1, 2};
  int reps = 5;
  int64_t tokens = 2048, d_model = 384, ffn = 1024, top_k = 2;
};

// Prints one table row per routing × pattern × thread count (GFLOP/s of each, `ratio: X` =
// grouped / loop). Returns 0, or kiln::app's user-error code 2 after a message on a bad routing
// or pattern name.
int run_grouped_gemm_bench(const GroupedBenchOptions& opt);

}  // namespace kiln::bench
