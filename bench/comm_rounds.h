// The interleaved round schedule of `kiln bench comm` (and its --calibrate), header-only so
// that tests/comm can drive it with a fake clock: every algorithm takes one turn per round, in
// a fresh shuffled order, with the same call counts, and the first calls of a turn are untimed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace kiln::bench {

// One size's schedule. Each turn makes warm_calls untimed calls, then timed_calls timed ones.
struct RoundPlan {
  int rounds = 1;
  int warm_calls = 1;   // the first call after switching algorithms is a warm-up (comm_bench.cpp)
  int timed_calls = 1;  // >= 1
};

// Seconds per timed call, [algorithm][round]. Hooks:
//   call(k)          one collective call of algorithm k (the same sequence on every rank)
//   sync()           a barrier before the timed calls (the ranks start them together)
//   now()            a clock in seconds
//   slowest(s)       the sample every rank agrees on (the slowest rank's s)
// The order is shuffled every round with a fixed seed, so every rank derives the same one: with
// a rotation each algorithm always follows the same one, and what the predecessor leaves behind
// (MPI's buffers, dirty caches) then biases it (auto ran 1.4x faster than the identical
// recursive doubling at 8 MiB all-gather, p = 2).
template <class Call, class Sync, class Now, class Slowest>
std::vector<std::vector<double>> time_rounds(size_t num_algos, const RoundPlan& plan, Call&& call,
                                             Sync&& sync, Now&& now, Slowest&& slowest,
                                             uint32_t seed = 12345) {
  std::vector<std::vector<double>> v(num_algos);
  std::vector<size_t> order(num_algos);
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::mt19937 shuffle_rng(seed);
  const int timed = std::max(plan.timed_calls, 1);
  for (int rep = 0; rep < plan.rounds; ++rep) {
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    for (size_t k : order) {
      for (int i = 0; i < plan.warm_calls; ++i) call(k);
      sync();
      const double t0 = now();
      for (int i = 0; i < timed; ++i) call(k);
      v[k].push_back(slowest((now() - t0) / timed));
    }
  }
  return v;
}

}  // namespace kiln::bench
