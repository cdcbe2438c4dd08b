// `kiln bench comm`'s round schedule (bench/comm_rounds.h) driven by a fake clock: each turn's
// first call (cold, after another algorithm ran) is untimed, every algorithm makes the same
// calls, and each round runs every algorithm once in a shuffled order. No real timing.
#include <algorithm>
#include <cstddef>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "bench/comm_rounds.h"

namespace kiln::bench {
namespace {

// A machine where the first call after switching algorithms costs kCold, every other kWarm.
struct FakeMachine {
  static constexpr double kCold = 10.0, kWarm = 1.0;
  double clock = 0;
  size_t last = static_cast<size_t>(-1);
  std::vector<size_t> calls;  // algorithm of every call, in order
  std::vector<size_t> timed_starts;  // calls.size() when each timed window began
  int syncs = 0;

  std::vector<std::vector<double>> run(size_t n, const RoundPlan& plan) {
    return time_rounds(
        n, plan,
        [&](size_t k) {
          clock += k == last ? kWarm : kCold;
          last = k;
          calls.push_back(k);
        },
        [&] { ++syncs; },
        [&] {
          // The schedule reads the clock twice per turn: at the start and the end of the
          // timed calls; record the starts.
          if (timed_starts.size() == static_cast<size_t>(syncs - 1)) timed_starts.push_back(calls.size());
          return clock;
        },
        [](double s) { return s; });
  }
};

TEST(CommBenchRounds, WarmUpCallOfEachTurnIsNotTimed) {
  constexpr size_t kAlgos = 4;
  RoundPlan plan;
  plan.rounds = 9;
  plan.warm_calls = 1;
  plan.timed_calls = 3;
  FakeMachine m;
  const std::vector<std::vector<double>> v = m.run(kAlgos, plan);
  ASSERT_EQ(v.size(), kAlgos);
  for (size_t k = 0; k < kAlgos; ++k) {
    ASSERT_EQ(v[k].size(), static_cast<size_t>(plan.rounds));
    // Only warm calls timed: exactly kWarm per call, whatever ran before.
    for (double s : v[k]) EXPECT_DOUBLE_EQ(s, FakeMachine::kWarm);
    // Equal call counts per algorithm (the pairing).
    EXPECT_EQ(std::count(m.calls.begin(), m.calls.end(), k),
              plan.rounds * (plan.warm_calls + plan.timed_calls));
  }
  // Turns are contiguous blocks of warm + timed calls of one algorithm; a timed window starts
  // after the warm-up call of its turn; each round runs every algorithm once.
  const size_t turn = plan.warm_calls + plan.timed_calls;
  ASSERT_EQ(m.calls.size(), kAlgos * plan.rounds * turn);
  ASSERT_EQ(m.timed_starts.size(), kAlgos * plan.rounds);
  std::set<std::vector<size_t>> orders;
  for (int r = 0; r < plan.rounds; ++r) {
    std::vector<size_t> order;
    for (size_t j = 0; j < kAlgos; ++j) {
      const size_t b = (r * kAlgos + j) * turn;
      EXPECT_EQ(m.timed_starts[r * kAlgos + j], b + plan.warm_calls);
      for (size_t i = 1; i < turn; ++i) EXPECT_EQ(m.calls[b + i], m.calls[b]);
      order.push_back(m.calls[b]);
    }
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t j = 0; j < kAlgos; ++j) EXPECT_EQ(sorted[j], j);
    orders.insert(order);
  }
  EXPECT_GT(orders.size(), 1u);  // shuffled, not one fixed order
}

// Without the warm-up the cold call lands in the window: the fake machine shows it, so the test
// above would catch a schedule that timed it.
TEST(CommBenchRounds, WithoutWarmUpTheColdCallIsTimed) {
  RoundPlan plan;
  plan.rounds = 5;
  plan.warm_calls = 0;
  plan.timed_calls = 2;
  FakeMachine m;
  const std::vector<std::vector<double>> v = m.run(3, plan);
  double worst = 0;
  for (const auto& a : v)
    for (double s : a) worst = std::max(worst, s);
  EXPECT_DOUBLE_EQ(worst, (FakeMachine::kCold + FakeMachine::kWarm) / 2);
}

}  // namespace
}  // namespace kiln::bench
