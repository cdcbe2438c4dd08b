// Graph capture and replay (core/graph.h) on small chains of real kernels: what is recorded,
// replay on new inputs, the arena plan (internal vs external regions, lifetimes, relocation),
// levels of independent nodes, breaks and guard keys.
#include <gtest/gtest.h>

#include <vector>

#include "kiln/core/graph.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/elementwise.h"

namespace kiln {
namespace {

constexpr int64_t kN = 1000;

// y = 2·(a + b) + a through two temporaries t1, t2 (t2 = 2·t1, y = t2 + a).
struct Chain {
  std::vector<float> a = std::vector<float>(kN), b = std::vector<float>(kN), t1 = std::vector<float>(kN),
                     t2 = std::vector<float>(kN), y = std::vector<float>(kN);
  void run() {
    cpu::add(t1.data(), a.data(), b.data(), kN);
    cpu::scale(t2.data(), t1.data(), 2.0f, kN);
    cpu::add(y.data(), t2.data(), a.data(), kN);
  }
  void set_inputs(float s) {
    for (int64_t i = 0; i < kN; ++i) {
      a[static_cast<size_t>(i)] = s * static_cast<float>(i % 7);
      b[static_cast<size_t>(i)] = 1.0f - static_cast<float>(i % 5) / s;
    }
  }
  float expected(int64_t i) const { return 2.0f * (a[static_cast<size_t>(i)] + b[static_cast<size_t>(i)]) + a[static_cast<size_t>(i)]; }
};

TEST(Graph, RecordsEachKernelAndReplaysOnNewInputs) {
  Chain c;
  c.set_inputs(1.0f);
  graph::Graph g;
  {
    graph::Capture cap(g);
    EXPECT_TRUE(graph::recording());
    c.run();
  }
  EXPECT_FALSE(graph::recording());
  ASSERT_EQ(g.nodes().size(), 3u);
  EXPECT_STREQ(g.nodes()[0].name, "add");
  EXPECT_STREQ(g.nodes()[1].name, "scale");
  EXPECT_EQ(c.y[10], c.expected(10)) << "the capture ran the kernels";
  c.set_inputs(3.0f);
  g.replay();
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(c.y[static_cast<size_t>(i)], c.expected(i)) << i;
}

// The temporaries are internal (written first, not kept); y is kept (an output). t1 and t2 are
// live together (scale reads t1, writes t2), so the arena holds both; a longer chain reuses them
// (next test).
TEST(Graph, PlanSeparatesInternalFromExternalAndRelocates) {
  Chain c;
  c.set_inputs(1.0f);
  graph::Graph g;
  {
    graph::Capture cap(g);
    c.run();
  }
  g.keep(c.y.data(), kN * 4);
  const graph::Plan& p = g.plan(/*relocate=*/true);
  EXPECT_EQ(p.num_internal, 2);  // t1, t2
  EXPECT_EQ(p.num_external, 3);  // a, b (read first), y (kept)
  EXPECT_EQ(p.eager_bytes, 2 * kN * 4);
  EXPECT_GE(p.arena_bytes, 2 * kN * 4);
  EXPECT_TRUE(p.relocated);
  // Replay no longer touches the eager temporaries.
  std::fill(c.t1.begin(), c.t1.end(), -7.0f);
  std::fill(c.t2.begin(), c.t2.end(), -7.0f);
  c.set_inputs(5.0f);
  g.replay();
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(c.y[static_cast<size_t>(i)], c.expected(i)) << i;
    ASSERT_EQ(c.t1[static_cast<size_t>(i)], -7.0f);
  }
}

// A chain of 6 temporaries, each dead after the next op: the arena needs two at a time.
TEST(Graph, ArenaReusesDeadRegions) {
  std::vector<std::vector<float>> t(7, std::vector<float>(kN));
  std::vector<float> x(kN, 1.5f), out(kN);
  graph::Graph g;
  {
    graph::Capture cap(g);
    cpu::scale(t[0].data(), x.data(), 2.0f, kN);
    for (size_t i = 1; i < t.size(); ++i) cpu::scale(t[i].data(), t[i - 1].data(), 1.5f, kN);
    cpu::add(out.data(), t.back().data(), x.data(), kN);
  }
  const std::vector<float> eager = out;
  g.keep(out.data(), kN * 4);
  const graph::Plan& p = g.plan(true);
  EXPECT_EQ(p.num_internal, 7);
  EXPECT_EQ(p.eager_bytes, 7 * kN * 4);
  EXPECT_LE(p.arena_bytes, 2 * (kN * 4 + 128)) << "two live at a time (a slot is its bytes + up to two cache lines)";
  std::fill(out.begin(), out.end(), 0.0f);
  g.replay();
  EXPECT_EQ(out, eager);
}

// A buffer the graph reads before it writes (in place) comes from outside: never relocated.
TEST(Graph, ReadBeforeWriteIsExternal) {
  std::vector<float> x(kN, 1.0f), y(kN, 2.0f);
  graph::Graph g;
  {
    graph::Capture cap(g);
    cpu::accumulate(x.data(), y.data(), kN);  // x += y
  }
  const graph::Plan& p = g.plan(true);
  EXPECT_EQ(p.num_internal, 0);
  g.replay();
  EXPECT_EQ(x[0], 5.0f);
}

// Independent consecutive nodes share a level (one parallel region); dependent ones do not.
TEST(Graph, IndependentNodesShareALevel) {
  constexpr int64_t kBig = 64 * 1024;  // a level worth a parallel region (small ones run serially)
  std::vector<float> a(kBig, 1.0f), b(kBig, 2.0f), c(kBig), d(kBig), e(kBig);
  graph::Graph g;
  {
    graph::Capture cap(g);
    cpu::scale(c.data(), a.data(), 3.0f, kBig);  // level 0
    cpu::scale(d.data(), b.data(), 3.0f, kBig);  // level 0 (independent of c)
    cpu::add(e.data(), c.data(), d.data(), kBig);  // level 1 (reads both)
  }
  g.keep(e.data(), kBig * 4);
  EXPECT_EQ(g.plan(false).num_levels, 2);
  std::fill(e.begin(), e.end(), 0.0f);
  const int threads = num_threads();
  set_num_threads(2);
  g.replay();
  set_num_threads(threads);
  EXPECT_EQ(e[3], 9.0f);
  // The same three nodes on small buffers: not worth a region, three levels.
  std::vector<float> sa(16, 1.0f), sb(16, 2.0f), sc(16), sd(16), se(16);
  graph::Graph h;
  {
    graph::Capture cap(h);
    cpu::scale(sc.data(), sa.data(), 3.0f, 16);
    cpu::scale(sd.data(), sb.data(), 3.0f, 16);
    cpu::add(se.data(), sc.data(), sd.data(), 16);
  }
  EXPECT_EQ(h.plan(false).num_levels, 3);
}

// A step with host code: one node for the op; the kernels inside it are part of it.
TEST(Graph, OpsRecordOnceAndBreaksStopReplay) {
  std::vector<float> x(kN, 1.0f), y(kN);
  float factor = 2.0f;
  graph::Graph g;
  {
    graph::Capture cap(g);
    graph::op("scaled_by_state", {graph::writes(y.data(), kN), graph::reads(x.data(), kN)},
              [&factor](const graph::Access* io) { cpu::scale(io[0].mut<float>(), io[1].as<float>(), factor, kN); });
  }
  ASSERT_EQ(g.nodes().size(), 1u);
  factor = 4.0f;  // read when it runs
  g.replay();
  EXPECT_EQ(y[0], 4.0f);
  graph::Graph h;
  {
    graph::Capture cap(h);
    cpu::scale(y.data(), x.data(), 2.0f, kN);
    graph::graph_break("sampling");
    cpu::scale(y.data(), x.data(), 3.0f, kN);
  }
  EXPECT_FALSE(h.replayable());
  ASSERT_EQ(h.breaks().size(), 1u);
  EXPECT_EQ(h.breaks()[0].reason, "sampling");
  EXPECT_EQ(h.breaks()[0].at_node, 1u);
  graph::graph_break("outside a capture: nothing");
}

// An eager region splits the graph into segments and runs its own control flow at each replay
// (here a branch on data the first segment computed); the buffers it shares with the recorded
// nodes stay where they are (its code uses its own pointers), the others still move.
TEST(Graph, EagerRegionsSplitTheGraphIntoReplayedSegments) {
  Chain c;
  c.set_inputs(1.0f);
  std::vector<float> z(kN), w(kN);
  const auto step = [&] {
    c.run();  // t1, t2 temporaries: internal; y: read by the region
    graph::eager_region("data-dependent branch", {graph::reads(c.y.data(), kN), graph::writes(z.data(), kN)},
                        [&c, &z](const graph::Access*) {
                          const float s = c.y[1] > 10.0f ? -1.0f : 1.0f;  // a branch on data
                          cpu::scale(z.data(), c.y.data(), s, kN);
                        });
    cpu::scale(w.data(), z.data(), 0.5f, kN);
  };
  graph::Graph g;
  {
    graph::Capture cap(g);
    step();
  }
  ASSERT_TRUE(g.replayable());
  ASSERT_EQ(g.breaks().size(), 1u);
  EXPECT_TRUE(g.breaks()[0].resumed);
  EXPECT_EQ(g.breaks()[0].at_node, 3u);
  EXPECT_EQ(g.segments(), 2);
  g.keep(w.data(), kN * 4);
  const graph::Plan& p = g.plan(true);
  EXPECT_EQ(p.num_internal, 2) << "t1 and t2 move; y and z, shared with the region, stay";
  for (float s : {2.0f, 5.0f}) {  // y[1] = 3s + 2 - 2/s: 7 at s = 2, 16.6 at s = 5 (the branch flips)
    c.set_inputs(s);
    g.replay();
    for (int64_t i = 0; i < kN; i += 97) {
      const float y = c.expected(i), sign = c.expected(1) > 10.0f ? -1.0f : 1.0f;
      EXPECT_EQ(w[static_cast<size_t>(i)], 0.5f * (sign * y)) << "s " << s << " i " << i;
    }
  }
}

TEST(Graph, KeyNamesTheFailedGuard) {
  graph::GraphKey a, b;
  a.add("batch", 4).add("threads", 2);
  b.add("batch", 4).add("threads", 1);
  EXPECT_EQ(a.mismatch(a), "");
  EXPECT_EQ(a.mismatch(b), "threads 2 -> 1");
  EXPECT_FALSE(a == b);
}

}  // namespace
}  // namespace kiln
