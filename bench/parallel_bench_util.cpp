// The parallel training benchmarks' shared helpers (parallel_bench_util.h).
#include "bench/parallel_bench_util.h"

#include <chrono>
#include <thread>

#include "kiln/core/rng.h"

namespace kiln::bench {

namespace {
constexpr uint64_t kDataSeed = 7;
constexpr int64_t kNumDataTokens = int64_t{1} << 20;  // random windows are drawn from these
}  // namespace

TokenShard random_tokens(int64_t vocab) {
  TokenShard d;
  d.vocab_size = vocab;
  d.tokens.resize(static_cast<size_t>(kNumDataTokens));
  Rng rng(kDataSeed);
  for (int32_t& t : d.tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return d;
}

void sleeping_barrier(comm::Communicator& c) {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Ibarrier(c.handle(), &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace kiln::bench
