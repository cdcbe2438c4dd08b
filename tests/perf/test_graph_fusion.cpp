// The fusion pass over captured graphs (perf/graph_fusion.h): a run of elementwise kernels becomes
// one generated node whose replay matches the unfused graph's, the run's private temporaries are
// no longer written, values read later stay outputs, and without a compiler the graph is left as
// it was (one warning); a GPT-2 step with split epilogues is fused back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "kiln/core/graph.h"
#include "kiln/core/rng.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/elementwise.h"
#include "kiln/perf/graph_fusion.h"
#include "kiln/train/trainer.h"

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

// A GPT-2 training step with split epilogues (each GEMM's bias and residual as kernels of their
// own, PyTorch eager's shape): the pass fuses them back, three chains per block (the QKV and MLP
// biases' runs end at a GEMM, so: attention-projection bias > residual, MLP up bias > GELU, MLP
// down bias > residual), and trains to the losses of the hand-fused eager step within the
// polynomial GELU's few ulp (the pass's Math::kPolynomial vs the eager kernels), compounded over
// 4 AdamW steps: relative 1e-4.
TEST(GraphFusion, SplitEpiloguesOfAGpt2StepFuseBack) {
  if (!fusion::resolve_compiler(fusion::default_compiler().cxx).ok()) GTEST_SKIP() << "no C++ compiler";
  TempDir dir;
  fusion::KernelCache cache(dir.path.string());
  ModelConfig cfg;
  cfg.family = ModelFamily::kGpt2;
  cfg.vocab_size = 29; cfg.d_model = 16; cfg.n_layers = 2; cfg.n_heads = 2; cfg.n_kv_heads = 2;
  cfg.d_ff = 64; cfg.max_seq_len = 16; cfg.tied_embeddings = true;
  TokenShard data;
  data.vocab_size = cfg.vocab_size;
  Rng rng(3);
  for (int i = 0; i < 2000; ++i) data.tokens.push_back(static_cast<int32_t>(rng.below(29)));
  TrainOptions o;
  o.batch = 2; o.seq_len = 16; o.max_steps = 4; o.warmup_steps = 1; o.eval_every = 0;
  FusionReport report;
  auto train = [&](bool split, bool fused) {
    auto m = Transformer::create(cfg, 5).value();
    TrainOptions t = o;
    t.split_epilogues = split;  // the trainer sets the model's (Transformer::set_split_epilogues)
    t.graph_capture = fused;
    if (fused) t.graph_pass = [&](graph::Graph& g) -> int64_t {
      report = fuse_elementwise(g, cache);
      return report.nodes_fused - report.chains;
    };
    Trainer trainer(*m, data, nullptr, t);
    std::vector<float> losses;
    while (!trainer.done()) losses.push_back(trainer.step().loss);
    if (fused) {
      EXPECT_EQ(trainer.graph_stats()->replays, 3);
    }
    return losses;
  };
  const std::vector<float> hand = train(false, false), split = train(true, false), fused = train(true, true);
  EXPECT_EQ(report.chains, 3 * cfg.n_layers) << report.fallback;
  for (const std::string& chain : report.fused)
    EXPECT_TRUE(chain == "add_bias > add" || chain == "add_bias > gelu_forward") << chain;
  ASSERT_EQ(fused.size(), hand.size());
  for (size_t i = 0; i < hand.size(); ++i) {
    EXPECT_NEAR(split[i], hand[i], 1e-5 * std::fabs(hand[i])) << "step " << i + 1;
    EXPECT_NEAR(fused[i], hand[i], 1e-4 * std::fabs(hand[i])) << "step " << i + 1;
  }
}

}  // namespace
}  // namespace kiln::perf
