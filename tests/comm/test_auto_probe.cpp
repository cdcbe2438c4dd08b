// `auto`'s in-process probe (auto_probe.h): exact results while it runs, one pinned algorithm
// on every rank decided by the MAX of the per-rank times, the documented number of calls,
// the model's pick with the probe off, and no probe where the model is confident or the call
// is small. Times are faked through the test hook; no timing is asserted.
#include <algorithm>
#include <cmath>
#include <map>
#include <ostream>
#include <memory>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/comm/collectives.h"
#include "kiln/comm/cost_model.h"

namespace kiln::comm {

// gtest prints these by name.
void PrintTo(Algo a, std::ostream* os) { *os << algo_name(a); }
void PrintTo(AutoSource s, std::ostream* os) { *os << auto_source_name(s); }

namespace {

// 60 KiB f32 = 4 * 60 * 1024 B: >= kProbeMinBytes and divisible by 4 p for p = 1..5, so the
// per-rank ops split it exactly and their nccl-tests size is this.
constexpr int64_t kProbeSize = int64_t{4} * 60 * 1024;
constexpr int64_t kElems = kProbeSize / 4;

// A fresh communicator over the world's ranks: its own `auto` state, gone after the test.
std::unique_ptr<Communicator> fresh() {
  Communicator& w = Communicator::world();
  return w.split(0, w.rank()).value();
}

// A cost table whose fits predict `us` microseconds at `size` for the listed algorithms of
// `op` and 1 s (never close) for the others; predictions scale with the bandwidth term.
AlphaBetaTable table_at(Communicator& c, CollOp op, int64_t size, const std::map<Algo, double>& us) {
  AlphaBetaTable t;
  t.fitted_p = c.size();
  t.hier_ranks_per_node = c.hierarchical_node_size();  // collective on first use
  for (const AlgoInfo& info : kAlgoInfos) {
    if (info.algo == Algo::kAuto || info.algo == Algo::kMpi || !algo_implements(info.algo, op))
      continue;
    const auto it = us.find(info.algo);
    const double seconds = it != us.end() ? it->second * 1e-6 : 1.0;
    const AlgoCost cost = algo_cost(op, info.algo, c.size(), static_cast<double>(size), t.hier_ranks_per_node);
    PiecewiseAlphaBeta& f = t.fit_of(op, info.algo);
    f.num_knots = 1;
    f.knots[0].bytes = static_cast<double>(size);
    f.knots[0].ab = {0.0, cost.bw_bytes > 0 ? seconds / cost.bw_bytes : 1.0};
  }
  return t;
}

// Element i of rank `who`'s data: a small integer, exact in every summation order.
float value_of(int who, int64_t i) { return static_cast<float>((i * 7 + who * 3 + i / 5) % 9 - 4); }

// One `auto` call of `op` on kElems f32 (the nccl-tests size kProbeSize), checked against a
// direct computation; returns the wrong elements summed over ranks (the same on every rank).
int64_t auto_call_wrong(Communicator& c, CollOp op) {
  const int p = c.size(), r = c.rank();
  const int64_t per = kElems / p;  // per-rank block of the per-rank ops
  std::vector<float> send(kElems), recv(kElems, NAN);
  int64_t wrong = 0;
  auto sum_at = [&](int64_t i) {
    float s = 0;
    for (int q = 0; q < p; ++q) s += value_of(q, i);
    return s;
  };
  switch (op) {
    case CollOp::kAllReduce:
      for (int64_t i = 0; i < kElems; ++i) send[i] = value_of(r, i);
      EXPECT_TRUE(all_reduce(c, send.data(), recv.data(), kElems, DType::kF32, ReduceOp::kSum).ok());
      for (int64_t i = 0; i < kElems; ++i) wrong += recv[i] != sum_at(i);
      break;
    case CollOp::kAllGather:
      for (int64_t i = 0; i < per; ++i) send[i] = value_of(r, i);
      EXPECT_TRUE(all_gather(c, send.data(), recv.data(), per, DType::kF32).ok());
      for (int64_t i = 0; i < per * p; ++i) wrong += recv[i] != value_of(static_cast<int>(i / per), i % per);
      break;
    case CollOp::kReduceScatter:
      for (int64_t i = 0; i < kElems; ++i) send[i] = value_of(r, i);
      EXPECT_TRUE(reduce_scatter(c, send.data(), recv.data(), per, DType::kF32, ReduceOp::kSum).ok());
      for (int64_t i = 0; i < per; ++i) wrong += recv[i] != sum_at(r * per + i);
      break;
    case CollOp::kAllToAll:
      for (int j = 0; j < p; ++j)
        for (int64_t i = 0; i < per; ++i) send[j * per + i] = value_of(r * p + j, i);
      EXPECT_TRUE(all_to_all(c, send.data(), recv.data(), per, DType::kF32).ok());
      for (int64_t i = 0; i < per * p; ++i) wrong += recv[i] != value_of(static_cast<int>(i / per) * p + r, i % per);
      break;
    case CollOp::kBroadcast:
      if (r == 0)
        for (int64_t i = 0; i < kElems; ++i) recv[i] = value_of(0, i);
      EXPECT_TRUE(broadcast(c, recv.data(), kElems, DType::kF32, 0).ok());
      for (int64_t i = 0; i < kElems; ++i) wrong += recv[i] != value_of(0, i);
      break;
    default:
      break;
  }
  int64_t total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, c.handle());
  return total;
}

// Whether every rank holds the same value.
bool same_on_every_rank(Communicator& c, int v) {
  int lo = 0, hi = 0;
  MPI_Allreduce(&v, &lo, 1, MPI_INT, MPI_MIN, c.handle());
  MPI_Allreduce(&v, &hi, 1, MPI_INT, MPI_MAX, c.handle());
  return lo == hi;
}

// Two close candidates per op (three for all-reduce), the first the model's pick.
std::map<Algo, double> close_candidates(CollOp op) {
  switch (op) {
    case CollOp::kAllReduce:
      return {{Algo::kRing, 100}, {Algo::kRecursiveDoubling, 110}, {Algo::kRabenseifner, 120}};
    case CollOp::kAllGather: return {{Algo::kRing, 100}, {Algo::kRecursiveDoubling, 110}};
    case CollOp::kReduceScatter: return {{Algo::kRing, 100}, {Algo::kRecursiveHalving, 110}};
    case CollOp::kAllToAll: return {{Algo::kPairwise, 100}, {Algo::kScattered, 110}};
    default: return {{Algo::kBinomialTree, 100}, {Algo::kChain, 110}};
  }
}

// (a) Every op at a probed size: every call exact while the probe runs its candidates in
// turn and after it pinned a candidate other than the model's pick.
TEST(DistAutoProbe, ResultsExactDuringAndAfterProbe) {
  for (int o = 0; o < kNumCollOps; ++o) {
    const CollOp op = static_cast<CollOp>(o);
    auto c = fresh();
    const std::map<Algo, double> cands = close_candidates(op);
    c->set_cost_table(table_at(*c, op, kProbeSize, cands));
    // The model's pick looks slow to the probe, so the pinned algorithm differs from it.
    const Algo model = std::min_element(cands.begin(), cands.end(), [](const auto& a, const auto& b) {
                         return a.second < b.second;
                       })->first;
    set_auto_probe_cost_hook(*c, [model](CollOp, Algo a, double) { return a == model ? 2e-3 : 1e-3; });
    const AutoChoice first = auto_choice(*c, op, kProbeSize);
    const int n = c->size() < 2 ? 3 : probe_calls(static_cast<int>(first.candidates.size())) + 3;
    std::set<Algo> ran;
    for (int k = 0; k < n; ++k) {
      const Algo now = resolve_algo(*c, op, kProbeSize);
      ran.insert(now);
      EXPECT_EQ(auto_call_wrong(*c, op), 0) << coll_op_name(op) << " call " << k << " ran "
                                            << algo_name(now);
    }
    const AutoChoice after = auto_choice(*c, op, kProbeSize);
    if (c->size() < 2) {
      EXPECT_EQ(after.source, AutoSource::kModel);
      continue;
    }
    EXPECT_EQ(first.source, AutoSource::kProbing) << coll_op_name(op);
    EXPECT_EQ(first.model_pick, model);
    EXPECT_EQ(ran.size(), cands.size()) << coll_op_name(op) << ": every candidate ran";
    EXPECT_EQ(after.source, AutoSource::kProbe) << coll_op_name(op);
    EXPECT_NE(after.algo, model) << coll_op_name(op);
  }
}

// (b) Rank 0 sees ring fastest, rank 1 recursive doubling: each rank's own verdict differs,
// the MAX over ranks (ring 5, recursive doubling 5, rabenseifner 3) decides rabenseifner on
// every rank, and the calls after it stay exact.
TEST(DistAutoProbe, EveryRankPinsTheSameAlgorithmFromMaxOverRanks) {
  auto c = fresh();
  if (c->size() < 2) GTEST_SKIP() << "one rank: no probe";
  const CollOp op = CollOp::kAllReduce;
  c->set_cost_table(table_at(*c, op, kProbeSize, close_candidates(op)));
  const int r = c->rank();
  // Fake seconds per probe call: rank 0 ring 1, recursive doubling 5, rabenseifner 3;
  // rank 1 ring 5, recursive doubling 1, rabenseifner 3; other ranks 1 for all (below both).
  set_auto_probe_cost_hook(*c, [r](CollOp, Algo a, double) {
    if (r > 1) return 1.0;
    if (a == Algo::kRabenseifner) return 3.0;
    const Algo fastest_here = r == 0 ? Algo::kRing : Algo::kRecursiveDoubling;
    return a == fastest_here ? 1.0 : 5.0;
  });
  const AutoChoice first = auto_choice(*c, op, kProbeSize);
  ASSERT_EQ(first.candidates.size(), 3u);
  const int n = probe_calls(3);
  for (int k = 0; k < n; ++k) ASSERT_EQ(auto_call_wrong(*c, op), 0) << "probe call " << k;
  const AutoChoice ch = auto_choice(*c, op, kProbeSize);
  ASSERT_TRUE(same_on_every_rank(*c, static_cast<int>(ch.algo)))
      << "rank " << r << " pinned " << algo_name(ch.algo);
  EXPECT_EQ(ch.source, AutoSource::kProbe);
  EXPECT_EQ(ch.algo, Algo::kRabenseifner);
  ASSERT_EQ(ch.measured_s.size(), 3u);
  EXPECT_EQ(ch.measured_s[0], 5.0);  // ring: rank 1's
  EXPECT_EQ(ch.measured_s[1], 5.0);  // recursive doubling: rank 0's
  EXPECT_EQ(ch.measured_s[2], 3.0);
  for (int k = 0; k < 2; ++k) EXPECT_EQ(auto_call_wrong(*c, op), 0);
}

// (c) A non-model candidate clearly faster: the probe runs candidate (k / kProbeBlock) mod 3
// at call k, pins it after exactly probe_calls(3) calls; within the tie tolerance the model's
// pick stays; with the probe off the model's pick is taken at once.
TEST(DistAutoProbe, PinsFasterCandidateAfterDocumentedCalls) {
  auto c = fresh();
  if (c->size() < 2) GTEST_SKIP() << "one rank: no probe";
  const CollOp op = CollOp::kAllReduce;
  c->set_cost_table(table_at(*c, op, kProbeSize, close_candidates(op)));
  std::map<Algo, int> windows;  // samples the probe took, per candidate
  set_auto_probe_cost_hook(*c, [&windows](CollOp, Algo a, double) {
    ++windows[a];
    return a == Algo::kRecursiveDoubling ? 0.5e-3 : 1e-3;
  });
  const std::vector<Algo> want = {Algo::kRing, Algo::kRecursiveDoubling, Algo::kRabenseifner};
  const int n = probe_calls(3);
  EXPECT_EQ(n, kProbeRounds * 3 * kProbeBlock);
  for (int k = 0; k < n; ++k) {
    const AutoChoice ch = auto_choice(*c, op, kProbeSize);
    ASSERT_TRUE(ch.probing()) << "call " << k;
    EXPECT_EQ(ch.candidates, want);
    EXPECT_EQ(ch.calls_done, k);
    EXPECT_EQ(ch.algo, want[(k / kProbeBlock) % 3]) << "call " << k;
    EXPECT_EQ(resolve_algo(*c, op, kProbeSize), ch.algo);
    ASSERT_EQ(auto_call_wrong(*c, op), 0);
  }
  // One timed window per block of the timed rounds.
  for (Algo a : want) EXPECT_EQ(windows[a], kProbeRounds - kProbeWarmRounds) << algo_name(a);
  AutoChoice ch = auto_choice(*c, op, kProbeSize);
  EXPECT_EQ(ch.source, AutoSource::kProbe);
  EXPECT_EQ(ch.algo, Algo::kRecursiveDoubling);
  EXPECT_EQ(ch.model_pick, Algo::kRing);
  EXPECT_EQ(resolve_algo(*c, op, kProbeSize), Algo::kRecursiveDoubling);

  // 3% faster is within kProbeTieTolerance: the model's pick stays.
  c->set_auto_probe(true);  // clears the decisions
  set_auto_probe_cost_hook(*c, [](CollOp, Algo a, double) {
    return a == Algo::kRecursiveDoubling ? 0.97e-3 : 1e-3;
  });
  for (int k = 0; k < n; ++k) ASSERT_EQ(auto_call_wrong(*c, op), 0);
  ch = auto_choice(*c, op, kProbeSize);
  EXPECT_EQ(ch.source, AutoSource::kProbe);
  EXPECT_EQ(ch.algo, Algo::kRing);

  // Probe off: the model's pick from the first call on, whatever the (fake) times.
  c->set_auto_probe(false);
  set_auto_probe_cost_hook(*c, [](CollOp, Algo a, double) {
    return a == Algo::kRecursiveDoubling ? 0.5e-3 : 1e-3;
  });
  for (int k = 0; k < n + 1; ++k) {
    ch = auto_choice(*c, op, kProbeSize);
    EXPECT_EQ(ch.source, AutoSource::kModel);
    EXPECT_EQ(ch.why, "probe off");
    EXPECT_EQ(ch.algo, Algo::kRing);
    ASSERT_EQ(auto_call_wrong(*c, op), 0);
  }
}

// (e) The watch after the pin: the first window's agreed median is the reference; later
// windows within kDriftFactor of it keep the pin; a window whose agreed median drifted beyond
// it (slower, or faster) runs the probe again at the window's last call, and the next window
// is twice as long (its first window the new reference).
TEST(DistAutoProbe, DriftOfThePinnedAlgorithmProbesAgain) {
  std::map<Algo, double> cost = {{Algo::kRing, 1e-3}, {Algo::kRecursiveDoubling, 0.5e-3},
                                 {Algo::kRabenseifner, 1e-3}};
  auto c = fresh();
  if (c->size() < 2) GTEST_SKIP() << "one rank: no probe";
  const CollOp op = CollOp::kAllReduce;
  c->set_cost_table(table_at(*c, op, kProbeSize, close_candidates(op)));
  set_auto_probe_cost_hook(*c, [&cost](CollOp, Algo a, double) { return cost.at(a); });
  auto calls = [&](int n) {
    for (int k = 0; k < n; ++k) ASSERT_EQ(auto_call_wrong(*c, op), 0) << "call " << k;
  };
  const int n = probe_calls(3);
  calls(n);
  AutoChoice ch = auto_choice(*c, op, kProbeSize);
  ASSERT_EQ(ch.algo, Algo::kRecursiveDoubling);
  // The reference window at the probed time, one at 1.4x (inside kDriftFactor): still pinned.
  static_assert(kDriftFactor > 1.4);
  calls(kWatchWindow);
  cost[Algo::kRecursiveDoubling] = 0.7e-3;
  calls(kWatchWindow);
  ch = auto_choice(*c, op, kProbeSize);
  EXPECT_EQ(ch.source, AutoSource::kProbe);
  EXPECT_EQ(ch.reprobes, 0);
  // 4x slower: the window's last call starts the probe again; it pins the model's pick (ring,
  // tied with rabenseifner) on every rank.
  cost[Algo::kRecursiveDoubling] = 2e-3;
  calls(kWatchWindow - 1);
  EXPECT_EQ(auto_choice(*c, op, kProbeSize).source, AutoSource::kProbe);
  calls(1);
  ch = auto_choice(*c, op, kProbeSize);
  EXPECT_TRUE(ch.probing());
  EXPECT_EQ(ch.reprobes, 1);
  EXPECT_EQ(ch.calls_done, 0);
  calls(n);
  ch = auto_choice(*c, op, kProbeSize);
  EXPECT_EQ(ch.source, AutoSource::kProbe);
  EXPECT_EQ(ch.algo, Algo::kRing);
  EXPECT_TRUE(same_on_every_rank(*c, static_cast<int>(ch.algo)));
  // The new pin's reference window (doubled), then ring 3x faster: a drift too, noticed after
  // the next doubled window.
  calls(2 * kWatchWindow);
  EXPECT_EQ(auto_choice(*c, op, kProbeSize).source, AutoSource::kProbe);
  cost[Algo::kRing] = 0.3e-3;
  calls(2 * kWatchWindow - 1);
  EXPECT_EQ(auto_choice(*c, op, kProbeSize).source, AutoSource::kProbe);
  calls(1);
  ch = auto_choice(*c, op, kProbeSize);
  EXPECT_TRUE(ch.probing());
  EXPECT_EQ(ch.reprobes, 2);
  calls(n);
  ch = auto_choice(*c, op, kProbeSize);
  EXPECT_EQ(ch.algo, Algo::kRing);
  EXPECT_EQ(resolve_algo(*c, op, kProbeSize), Algo::kRing);
}

// (d) A confident model (runner-up predicted 3x) and a call below kProbeMinBytes (runners-up
// close) keep the model's pick at once.
TEST(DistAutoProbe, ConfidentAndSmallSizesAreNotProbed) {
  const CollOp op = CollOp::kAllReduce;
  auto c = fresh();
  const std::map<Algo, double> far = {{Algo::kRing, 100}, {Algo::kRecursiveDoubling, 300},
                                      {Algo::kRabenseifner, 400}};
  static_assert(kProbeCandidateFactor < 3.0);
  c->set_cost_table(table_at(*c, op, kProbeSize, far));
  set_auto_probe_cost_hook(*c, [](CollOp, Algo a, double) { return a == Algo::kRing ? 1.0 : 1e-3; });
  for (int k = 0; k < 3; ++k) {
    const AutoChoice ch = auto_choice(*c, op, kProbeSize);
    EXPECT_EQ(ch.source, AutoSource::kModel);
    EXPECT_EQ(ch.why, c->size() < 2 ? "one rank" : "no close runner-up");
    if (c->size() >= 2) {
      EXPECT_EQ(ch.algo, Algo::kRing);
    }
    EXPECT_TRUE(ch.candidates.empty());
    ASSERT_EQ(auto_call_wrong(*c, op), 0);
  }
  // 1 KiB (256 f32) with close predictions: below the floor.
  const int64_t small = 1024;
  static_assert(small < kProbeMinBytes);
  c->set_cost_table(table_at(*c, op, small, close_candidates(op)));
  std::vector<float> send(small / 4, 1.0f), recv(small / 4);
  for (int k = 0; k < 3; ++k) {
    const AutoChoice ch = auto_choice(*c, op, small);
    EXPECT_EQ(ch.source, AutoSource::kModel);
    EXPECT_EQ(ch.why, c->size() < 2 ? "one rank" : "below the probe floor");
    if (c->size() >= 2) {
      EXPECT_EQ(ch.algo, Algo::kRing);
    }
    ASSERT_TRUE(all_reduce(*c, send.data(), recv.data(), small / 4, DType::kF32, ReduceOp::kSum).ok());
    EXPECT_EQ(recv[0], static_cast<float>(c->size()));
  }
}

}  // namespace
}  // namespace kiln::comm
