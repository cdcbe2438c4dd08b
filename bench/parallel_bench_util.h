// What the parallel training benchmarks (`kiln bench dp`, `bench tp`, `bench pp`) share: the
// random token stream every rank draws the same windows from, and a barrier that waits without
// taking a core while one rank runs the single-process baseline.
#pragma once

#include <cstdint>

#include "kiln/comm/communicator.h"
#include "kiln/train/data.h"

namespace kiln::bench {

// 2^20 tokens from a fixed seed, uniform over [0, vocab): the same on every rank; speed does not
// depend on the values (BENCH.md).
TokenShard random_tokens(int64_t vocab);

// A barrier that sleeps between polls: the ranks waiting while rank 0 runs the single-process
// baseline must not take its cores (ranks may outnumber cores), and may wait for minutes (no
// timeout, unlike the communication layer's polite waits).
void sleeping_barrier(comm::Communicator& c);

}  // namespace kiln::bench
