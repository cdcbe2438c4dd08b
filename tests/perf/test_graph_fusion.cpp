// The fusion pass over captured graphs (perf/graph_fusion.h): a run of elementwise kernels becomes
// one generated node whose replay matches the unfused graph's, the run's private temporaries are
// no longer written, values read later stay outputs, and without a compiler the graph is left as
// it was (one warning).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "kiln/core/graph.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/elementwise.h"
#include "kiln/perf/graph_fusion.h"

namespace kiln::perf {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/kiln_graph_fusion_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

constexpr int64_t kN = 1001;

// out = 0.5 · gelu(a + b) + a through temporaries t1 (a + b), t2 (gelu), t3 (scale).
struct Chain4 {
  std::vector<float> a = std::vector<float>(kN), b = std::vector<float>(kN), t1 = std::vector<float>(kN),
                     t2 = std::vector<float>(kN), t3 = std::vector<float>(kN), out = std::vector<float>(kN);
  void inputs(float s) {
    for (int64_t i = 0; i < kN; ++i) {
      a[static_cast<size_t>(i)] = s * static_cast<float>(i % 11 - 5) / 3.0f;
      b[static_cast<size_t>(i)] = 0.25f - static_cast<float>(i % 7) / (4.0f * s);
    }
  }
  // The chain on inputs(1) recorded, its output kept.
  graph::Graph captured() {
    inputs(1.0f);
    graph::Graph g;
    {
      graph::Capture cap(g);
      run();
    }
    g.keep(out.data(), kN * 4);
    return g;
  }
  void run() {
    cpu::add(t1.data(), a.data(), b.data(), kN);
    cpu::gelu_forward(t2.data(), t1.data(), kN);
    cpu::scale(t3.data(), t2.data(), 0.5f, kN);
    cpu::add(out.data(), t3.data(), a.data(), kN);
  }
};

double nmse(const std::vector<float>& x, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (double(x[i]) - ref[i]) * (double(x[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return num / den;
}

TEST(GraphFusion, ElementwiseRunBecomesOneGeneratedNode) {
  TempDir dir;
  fusion::KernelCache cache(dir.path.string());
  Chain4 c;
  graph::Graph g = c.captured();
  const FusionReport r = fuse_elementwise(g, cache);
  if (!r.fallback.empty()) GTEST_SKIP() << "no compiler: " << r.fallback;
  ASSERT_EQ(r.chains, 1);
  EXPECT_EQ(r.nodes_fused, 4);
  EXPECT_EQ(r.fused[0], "add > gelu_forward > scale > add");
  ASSERT_EQ(g.nodes().size(), 1u);
  g.plan(true);
  // Replay on new inputs against eager kiln::cpu: GELU's polynomial formulas agree to a few ulp
  // (fusion.h; its own tests compare them bitwise under one SIMD target), so nmse <= (16u)^2.
  c.inputs(2.0f);
  std::fill(c.t2.begin(), c.t2.end(), -3.0f);
  g.replay();
  const std::vector<float> fused = c.out;
  c.run();
  EXPECT_LE(nmse(fused, c.out), 256.0 * 0x1p-48);
  c.inputs(2.0f);
  std::fill(c.t2.begin(), c.t2.end(), -3.0f);
  g.replay();
  EXPECT_EQ(c.t2[5], -3.0f) << "a temporary only the run reads is never written";
}

// A temporary a later node reads stays an output of the fused node.
TEST(GraphFusion, ValuesReadLaterStayOutputs) {
  TempDir dir;
  fusion::KernelCache cache(dir.path.string());
  std::vector<float> a(kN, 1.0f), b(kN, 2.0f), t(kN), u(kN), later(kN);
  graph::Graph g;
  {
    graph::Capture cap(g);
    cpu::add(t.data(), a.data(), b.data(), kN);  // t = 3
    cpu::scale(u.data(), t.data(), 2.0f, kN);    // u = 6
    cpu::accumulate(u.data(), a.data(), kN);     // u = 7 (in place)
    cpu::swiglu_forward(later.data(), t.data(), u.data(), kN);  // silu(3) · 7
  }
  g.keep(later.data(), kN * 4);
  const FusionReport r = fuse_elementwise(g, cache);
  if (!r.fallback.empty()) GTEST_SKIP() << "no compiler: " << r.fallback;
  ASSERT_EQ(r.chains, 1);
  EXPECT_EQ(r.nodes_fused, 4);
  std::fill(later.begin(), later.end(), 0.0f);
  std::fill(t.begin(), t.end(), 0.0f);
  g.replay();
  const float silu3 = 3.0f / (1.0f + std::exp(-3.0f));
  EXPECT_NEAR(later[7], silu3 * 7.0f, 1e-5f);
  EXPECT_EQ(t[7], 0.0f) << "t is read only inside the run";
}

TEST(GraphFusion, MissingCompilerLeavesTheGraphAsItWas) {
  TempDir dir;
  fusion::CompilerConfig bad = fusion::default_compiler();
  bad.cxx = "/nonexistent/c++";
  fusion::KernelCache cache(dir.path.string(), bad);
  Chain4 c;
  graph::Graph g = c.captured();
  const FusionReport r = fuse_elementwise(g, cache);
  EXPECT_FALSE(r.fallback.empty());
  EXPECT_EQ(r.chains, 0);
  EXPECT_EQ(g.nodes().size(), 4u);
  const std::vector<float> eager = c.out;
  g.replay();
  EXPECT_EQ(c.out, eager);
}

}  // namespace
}  // namespace kiln::perf
