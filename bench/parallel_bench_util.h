// What the parallel training benchmarks (`kiln bench dp`, `bench tp`, `bench pp`) share: the
// W1a / W1b workloads as they print them, their training options, the random token stream every
// rank draws the same windows from, and a barrier that waits without taking a core while one
// rank runs the single-process baseline.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/comm/communicator.h"
#include "kiln/core/status.h"
#include "kiln/model/config.h"
#include "kiln/train/data.h"
#include "kiln/train/trainer.h"

namespace kiln::bench {

// A --workload (BENCH.md W1a / W1b), resolved: the name as printed, the model and the global
// batch.
struct ParallelWorkload {
  std::string name;  // "W1a" | "W1b"
  ModelConfig cfg;
  int64_t batch = 0, seq_len = 0;
};
// Case-insensitive "w1a" | "w1b"; InvalidArgument naming --workload and the known ones.
Expected<ParallelWorkload> parallel_workload(const std::string& flag);

// The benchmarks' trainer: `batch` (global) × `seq_len`, `steps` steps in all, a one-step
// learning-rate warm-up, no evaluation.
TrainOptions bench_train_options(int64_t batch, int64_t seq_len, int steps, uint64_t seed);

// 2^20 tokens from a fixed seed, uniform over [0, vocab): the same on every rank; speed does not
// depend on the values (BENCH.md).
TokenShard random_tokens(int64_t vocab);

// A barrier that sleeps between polls: the ranks waiting while rank 0 runs the single-process
// baseline must not take its cores (ranks may outnumber cores), and may wait for minutes (no
// timeout, unlike the communication layer's polite waits).
void sleeping_barrier(comm::Communicator& c);

}  // namespace kiln::bench
