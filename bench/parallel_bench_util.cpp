// The parallel training benchmarks' shared helpers (parallel_bench_util.h).
#include "bench/parallel_bench_util.h"

#include <cctype>
#include <chrono>
#include <thread>

#include "bench/train_bench.h"
#include "kiln/core/rng.h"

namespace kiln::bench {

namespace {
constexpr uint64_t kDataSeed = 7;
constexpr int64_t kNumDataTokens = int64_t{1} << 20;  // random windows are drawn from these
}  // namespace

Expected<ParallelWorkload> parallel_workload(const std::string& flag) {
  std::string key = flag;
  for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto w = train_workload(key);
  if (!w.ok()) return invalid_argument("--workload: unknown workload '{}' (known: W1a, W1b)", flag);
  KILN_ASSIGN_OR_RETURN(ModelConfig cfg, preset(w->preset));
  return ParallelWorkload{key == "w1a" ? "W1a" : "W1b", cfg, w->batch, w->seq_len};
}

TrainOptions bench_train_options(int64_t batch, int64_t seq_len, int steps, uint64_t seed) {
  TrainOptions t;
  t.batch = batch;
  t.seq_len = seq_len;
  t.max_steps = steps;
  t.warmup_steps = 1;
  t.eval_every = 0;
  t.seed = seed;
  return t;
}

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
