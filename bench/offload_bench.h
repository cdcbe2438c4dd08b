// `kiln bench offload`: what offloading the optimizer state costs (train/offload.h). Two
// Trainers of the W1a / W1b shape on the same random tokens, one with AdamW's moments in memory
// and one with them in a file, stepped in turn in one run: the step times and their ratio, the
// traffic and the rate the file moved at, the time the update waited for it (exposed), and the
// memory the moments no longer take. The two runs' losses must agree bitwise; it says so.
#pragma once

#include <string>

namespace kiln::bench {

struct OffloadBenchOptions {
  std::string preset = "w1b";    // w1a | w1b (bench/train_bench.h's workloads)
  std::string dir = "/var/tmp";  // where the moments' file goes (a disk, not tmpfs, to measure one)
  int threads = 0;               // 0: kiln's current thread count
  int steps = 5;                 // timed steps after warm-up (median)
  int warmup = 1;
  bool json = false;
};

int run_offload_bench(const OffloadBenchOptions& opt);

}  // namespace kiln::bench
