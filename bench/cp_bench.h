// `kiln bench cp` (context parallelism): under mpirun -np C, causal attention of one sequence
// split over the C ranks, forward and backward, by ring (contiguous and zig-zag layouts),
// Ulysses and (C = 4) the 2 × 2 hybrid. Per rank: compute, communication and exposed
// communication, bytes sent and memory; the causal imbalance (max / min compute over ranks)
// with and without zig-zag, and each method's time against ring zig-zag.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::bench {

struct CpBenchOptions {
  std::vector<int64_t> seqs = {8192, 16384, 32768};
  int64_t heads = 2, kv_heads = 2, head_dim = 16;
  bool causal = true;
  int reps = 1;     // timed forward + backward pairs per row (after one untimed)
  int threads = 1;  // kernel threads per rank
};

// Collective over the world; returns the process exit code.
int run_cp_bench(const CpBenchOptions& o);

}  // namespace kiln::bench
