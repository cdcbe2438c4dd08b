// The MoE MLP (model/moe.h) alone and in the model: gradients against central finite
// differences (router, gates, experts, shared experts, the load-balancing and z losses), in
// dropless and capacity mode; the capacity's drops in token order; chunked dispatch equal to
// one chunk; parameter counts; config errors and the Mixtral config.json round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kiln/core/rng.h"
#include "kiln/model/hf_config.h"
#include "kiln/model/moe.h"

namespace kiln {
namespace {

// A block over its own weights: C 8, expert width 6, E 4, top-2, one shared expert.
struct BlockCase {
  static constexpr int64_t C = 8, F = 6, E = 4, K = 2, N = 12;
  std::vector<float> w, g;  // every weight, then every gradient, same layout
  MoeBlock block;
  std::vector<float> x, r;  // input (N, C) and the loss's projection: L = Σ y·r + the router losses

  explicit BlockCase(double capacity_factor, int64_t shared = 1, int chunks = 1) {
    const int64_t Fs = shared * F;
    const int64_t n = E * C + E * 3 * F * C + 3 * Fs * C;
    w.resize(static_cast<size_t>(n));
    g.assign(static_cast<size_t>(n), 0.0f);
    Rng rng(11);
    for (float& v : w) v = 0.5f * rng.normal();
    int64_t at = 0;
    auto lin = [&](int64_t out, int64_t in) {
      Linear l;
      l.out = out; l.in = in; l.w = w.data() + at; l.dw = g.data() + at;
      at += out * in;
      return l;
    };
    block.d_model = C; block.d_ff = F; block.num_experts = E; block.top_k = K; block.shared_ff = Fs;
    block.capacity_factor = capacity_factor;
    block.aux_coef = 0.3f;
    block.z_coef = 0.05f;
    block.ep.chunks = chunks;
    block.router = lin(E, C);
    for (int64_t e = 0; e < E; ++e) {
      block.w1.push_back(lin(F, C));
      block.w2.push_back(lin(C, F));
      block.w3.push_back(lin(F, C));
    }
    if (shared > 0) {
      block.shared_gate = lin(Fs, C);
      block.shared_up = lin(Fs, C);
      block.shared_down = lin(C, Fs);
    }
    x.resize(static_cast<size_t>(N * C));
    r.resize(x.size());
    for (float& v : x) v = rng.normal();
    for (float& v : r) v = rng.normal();
  }

  // The objective and the routing it took (choices and kept rows, to skip probes that flip it).
  double loss(MoeActivations& a, std::vector<int32_t>* route = nullptr) {
    std::vector<float> y(x.size()), res(x.size(), 0.0f);
    MoeStats st;
    block.forward(y.data(), x.data(), N, res.data(), a, &st);
    double l = block.aux_coef * st.aux + block.z_coef * st.z;
    for (size_t i = 0; i < y.size(); ++i) l += static_cast<double>(y[i]) * r[i];
    if (route) {
      route->assign(a.choice.begin(), a.choice.begin() + N * K);
      for (int64_t i = 0; i < N * K; ++i) route->push_back(a.row[i] >= 0);
    }
    return l;
  }
  std::vector<float> backward(MoeActivations& a) {
    std::fill(g.begin(), g.end(), 0.0f);
    loss(a);
    std::vector<float> dx(x.size());
    MoeStats st;
    block.backward(dx.data(), r.data(), x.data(), N, a, false, st);
    return dx;
  }
};

void check_block_gradients(BlockCase& c) {
  MoeActivations a;
  const std::vector<float> dx = c.backward(a);
  const std::vector<float> grads = c.g;
  std::vector<int32_t> route0;
  c.loss(a, &route0);
  Rng rng(3);
  int checked = 0, skipped = 0;
  auto probe = [&](float& v, float analytic, const char* what, int64_t i) {
    const float saved = v, h = 2e-3f;
    std::vector<int32_t> rp, rm;
    v = saved + h;
    const double lp = c.loss(a, &rp);
    v = saved - h;
    const double lm = c.loss(a, &rm);
    v = saved;
    if (rp != route0 || rm != route0) {  // the top-k or a drop flipped: not differentiable here
      ++skipped;
      return;
    }
    const double fd = (lp - lm) / (2.0 * h);
    EXPECT_NEAR(analytic, fd, 2e-3 + 2e-2 * std::fabs(fd)) << what << " element " << i;
    ++checked;
  };
  for (int64_t i = 0; i < static_cast<int64_t>(c.x.size()); ++i) probe(c.x[static_cast<size_t>(i)], dx[static_cast<size_t>(i)], "dx", i);
  for (int k = 0; k < 300; ++k) {
    const auto i = static_cast<int64_t>(rng.below(c.w.size()));
    probe(c.w[static_cast<size_t>(i)], grads[static_cast<size_t>(i)], "weight", i);
  }
  EXPECT_GT(checked, 300) << skipped << " probes skipped";
  EXPECT_LT(skipped, checked / 10);
}

TEST(Moe, DroplessBlockGradientsMatchFiniteDifferences) {
  BlockCase c(0.0);
  check_block_gradients(c);
}

TEST(Moe, CapacityBlockGradientsMatchFiniteDifferences) {
  BlockCase c(0.75, 0);  // C = ceil(0.75 · 2 · 12 / 4) = 5 of each expert's assignments kept
  MoeActivations a;
  c.loss(a);
  EXPECT_GT(std::count(a.row.begin(), a.row.begin() + BlockCase::N * BlockCase::K, -1), 0) << "nothing dropped";
  check_block_gradients(c);
}

// Each expert keeps its first C assignments in token order; the stats count the rest.
TEST(Moe, CapacityDropsTheLaterTokens) {
  BlockCase c(0.75);
  MoeActivations a;
  std::vector<float> y(c.x.size()), res(c.x.size(), 0.0f);
  MoeStats st;
  c.block.forward(y.data(), c.x.data(), BlockCase::N, res.data(), a, &st);
  const int64_t cap = 5;
  std::vector<int64_t> seen(BlockCase::E, 0);
  int64_t dropped = 0;
  for (int64_t i = 0; i < BlockCase::N * BlockCase::K; ++i) {
    const int32_t e = a.choice[static_cast<size_t>(i)];
    EXPECT_EQ(a.row[static_cast<size_t>(i)] >= 0, seen[static_cast<size_t>(e)] < cap) << "assignment " << i;
    dropped += seen[static_cast<size_t>(e)]++ >= cap;
  }
  EXPECT_EQ(st.dropped, dropped);
  EXPECT_EQ(st.assignments, BlockCase::N * BlockCase::K);
  EXPECT_GT(st.drop_rate(), 0.0);
}

// Dispatching in chunks (how expert parallelism overlaps its all-to-alls) changes the routing
// and drops in nothing, and the values only by fp32 summation order: a weight gradient sums its
// rows chunk by chunk, and the GEMMs block smaller row counts differently. The bound: a few
// ulps of each sum of up to N·k = 24 products, 1e-5 relative to the tensor's norm.
TEST(Moe, ChunkedDispatchEqualsOneChunk) {
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0, n = 0;
    for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]), n += b[i] * b[i];
    return std::sqrt(d / n);
  };
  for (double cf : {0.0, 0.75}) {
    BlockCase one(cf), three(cf, 1, 3);
    MoeActivations a1, a3;
    const std::vector<float> d1 = one.backward(a1), d3 = three.backward(a3);
    EXPECT_TRUE(std::equal(a1.row.begin(), a1.row.begin() + BlockCase::N * BlockCase::K, a3.row.begin(),
                           [](int32_t x, int32_t y) { return (x < 0) == (y < 0); })) << "capacity " << cf;
    EXPECT_LT(rel(d3, d1), 1e-5) << "capacity " << cf;
    EXPECT_LT(rel(three.g, one.g), 1e-5) << "capacity " << cf;
    EXPECT_EQ(a3.chunk_sent.size(), 4u);
  }
}

// The router losses' values from the saved probabilities: aux = E Σ f_i P_i, z = mean lse².
TEST(Moe, RouterLossValues) {
  BlockCase c(0.0);
  MoeActivations a;
  std::vector<float> y(c.x.size()), res(c.x.size(), 0.0f);
  MoeStats st;
  c.block.forward(y.data(), c.x.data(), BlockCase::N, res.data(), a, &st);
  const int64_t N = BlockCase::N, E = BlockCase::E, K = BlockCase::K;
  double aux = 0, z = 0;
  for (int64_t i = 0; i < E; ++i) {
    double f = 0, P = 0;
    for (int64_t t = 0; t < N; ++t) {
      P += a.probs[static_cast<size_t>(t * E + i)] / N;
      for (int64_t j = 0; j < K; ++j) f += a.choice[static_cast<size_t>(t * K + j)] == i ? 1.0 / (N * K) : 0.0;
    }
    aux += E * f * P;
  }
  for (int64_t t = 0; t < N; ++t) z += static_cast<double>(a.lse[static_cast<size_t>(t)]) * a.lse[static_cast<size_t>(t)] / N;
  EXPECT_NEAR(st.aux, aux, 1e-6);
  EXPECT_NEAR(st.z, z, 1e-5 * z);
  ASSERT_EQ(st.tokens_per_expert.size(), static_cast<size_t>(E));
  int64_t total = 0;
  for (int64_t n : st.tokens_per_expert) total += n;
  EXPECT_EQ(total, N * K);
}

ModelConfig tiny_moe() {
  ModelConfig c;
  c.vocab_size = 11; c.d_model = 8; c.n_layers = 2; c.n_heads = 2; c.n_kv_heads = 1; c.d_ff = 12;
  c.max_seq_len = 8; c.tied_embeddings = false;
  c.num_experts = 4; c.num_experts_per_tok = 2; c.moe_d_ff = 6; c.num_shared_experts = 1;
  c.moe_layer_freq = 2;  // block 0 dense, block 1 MoE
  c.router_aux_loss_coef = 0.2; c.router_z_loss_coef = 0.05;
  return c;
}

// The whole model with a dense and a MoE block: its objective (the cross-entropy forward returns
// plus the router losses) against finite differences of every tensor.
TEST(Moe, ModelGradientsMatchFiniteDifferences) {
  const ModelConfig cfg = tiny_moe();
  auto model = Transformer::create(cfg, 3).value();
  Rng rng(5);
  for (float& w : model->params()) w += 0.3f * rng.normal();
  const int64_t B = 2, T = 5;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(11));
  for (auto& t : targets) t = static_cast<int32_t>(rng.below(11));
  model->zero_grad();
  ASSERT_TRUE(model->forward(tokens.data(), targets.data(), B, T).ok());
  model->take_moe_stats();
  model->backward();
  const std::vector<float> grads(model->grads().begin(), model->grads().end());
  std::vector<int64_t> route0;
  auto objective = [&](std::vector<int64_t>* route) {
    const double ce = model->forward(tokens.data(), targets.data(), B, T).value();
    const MoeStats st = model->take_moe_stats();
    *route = st.tokens_per_expert;
    return ce + cfg.router_aux_loss_coef * st.aux_mean() + cfg.router_z_loss_coef * st.z_mean();
  };
  objective(&route0);
  int checked = 0, skipped = 0;
  for (const ParamEntry& e : model->param_entries()) {
    for (int probe = 0; probe < 3; ++probe) {
      const int64_t i = e.offset + static_cast<int64_t>(rng.below(static_cast<uint64_t>(e.shape.numel())));
      float& w = model->params()[static_cast<size_t>(i)];
      const float saved = w, h = 4e-3f;
      std::vector<int64_t> rp, rm;
      w = saved + h;
      const double lp = objective(&rp);
      w = saved - h;
      const double lm = objective(&rm);
      w = saved;
      if (rp != route0 || rm != route0) {
        ++skipped;
        continue;
      }
      const double fd = (lp - lm) / (2.0 * h);
      EXPECT_NEAR(grads[static_cast<size_t>(i)], fd, 2e-3 + 3e-2 * std::fabs(fd)) << e.name << " element " << i - e.offset;
      ++checked;
    }
  }
  EXPECT_GT(checked, 40) << skipped << " skipped";
}

// Activation checkpointing re-runs a MoE block's forward inside its backward: it routes and
// drops as the first forward did (capacity mode here) and records its routing once.
TEST(Moe, CheckpointingGivesBitwiseGradientsAndRoutingOnce) {
  ModelConfig cfg = tiny_moe();
  cfg.moe_layer_freq = 1;
  cfg.capacity_factor = 1.0;
  const int64_t B = 2, T = 8;
  Rng rng(4);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(11));
  for (auto& t : targets) t = static_cast<int32_t>(rng.below(11));
  std::vector<float> ref;
  MoeStats ref_stats;
  for (CheckpointMode mode : {CheckpointMode::kNone, CheckpointMode::kFull, CheckpointMode::kSelective}) {
    auto m = Transformer::create(cfg, 3).value();
    for (float& w : m->params()) w += 0.3f * static_cast<float>(std::sin(static_cast<double>(&w - m->params().data())));
    m->set_checkpointing(mode);
    m->zero_grad();
    ASSERT_TRUE(m->forward(tokens.data(), targets.data(), B, T).ok());
    m->backward();
    const MoeStats st = m->take_moe_stats();
    const std::vector<float> g(m->grads().begin(), m->grads().end());
    if (mode == CheckpointMode::kNone) {
      ref = g;
      ref_stats = st;
      EXPECT_GT(st.dropped, 0);
      continue;
    }
    EXPECT_EQ(g, ref) << checkpoint_mode_name(mode);
    EXPECT_EQ(st.blocks, ref_stats.blocks) << checkpoint_mode_name(mode);
    EXPECT_EQ(st.dropped, ref_stats.dropped) << checkpoint_mode_name(mode);
  }
}

TEST(Moe, ParameterCountsAndActiveParameters) {
  const ModelConfig cfg = tiny_moe();
  auto model = Transformer::create(cfg, 1).value();
  EXPECT_EQ(model->num_params(), cfg.num_params());
  // One MoE block: router 4·8, 4 experts and 1 shared of 3·8·6 each; 2 of the 4 routed are active.
  EXPECT_EQ(cfg.num_params() - cfg.num_active_params(), 2 * 3 * 8 * 6);
  ModelConfig dense = cfg;
  dense.num_experts = 0; dense.num_shared_experts = 0; dense.router_aux_loss_coef = 0; dense.router_z_loss_coef = 0;
  EXPECT_EQ(cfg.num_params() - dense.num_params(), 4 * 8 + 5 * 3 * 8 * 6 - 3 * 8 * 12);
  EXPECT_LT(cfg.train_flops_per_token(8), ModelConfig(cfg).num_params() * 6.0 + 12.0 * 2 * 8 * 8);
  const ModelConfig tiny = preset("llama-moe-tiny").value(), dense_tiny = preset("llama-tiny").value();
  // Experts of half the width, two per token: the dense model's MLP FLOPs plus the router's.
  EXPECT_EQ(tiny.num_active_params() - dense_tiny.num_params(), tiny.n_layers * tiny.num_experts * tiny.d_model);
  EXPECT_GT(preset("w1-moe").value().num_params(), tiny.num_params());
}

TEST(Moe, BadConfigsNameTheField) {
  auto err = [](auto edit) {
    ModelConfig c = tiny_moe();
    edit(c);
    return check_config(c).message();
  };
  EXPECT_NE(err([](ModelConfig& c) { c.num_experts_per_tok = 5; }).find("num_experts_per_tok"), std::string::npos);
  EXPECT_NE(err([](ModelConfig& c) { c.moe_layer_freq = 0; }).find("moe_layer_freq"), std::string::npos);
  EXPECT_NE(err([](ModelConfig& c) { c.capacity_factor = -1; }).find("capacity_factor"), std::string::npos);
  EXPECT_NE(err([](ModelConfig& c) { c.mlp_bias = true; }).find("mlp_bias"), std::string::npos);
  EXPECT_NE(err([](ModelConfig& c) { c.family = ModelFamily::kGpt2; c.n_kv_heads = 2; c.tied_embeddings = true; })
                .find("Llama"), std::string::npos);
  EXPECT_NE(err([](ModelConfig& c) { c.num_experts = 0; }).find("num_experts > 0"), std::string::npos);
  ModelConfig even = tiny_moe();
  even.vocab_size = 12;
  EXPECT_NE(check_tensor_split(even, 2).message().find("--ep"), std::string::npos);
  EXPECT_NE(check_expert_split(tiny_moe(), 3).message().find("num_experts"), std::string::npos);
}

TEST(Moe, MixtralConfigRoundTrips) {
  for (const ModelConfig& c : {tiny_moe(), preset("llama-moe-tiny").value()}) {
    const std::string text = config_to_hf_json(c);
    EXPECT_NE(text.find("MixtralForCausalLM"), std::string::npos);
    auto back = config_from_hf_json(text);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->num_params(), c.num_params());
    EXPECT_EQ(back->num_experts, c.num_experts);
    EXPECT_EQ(back->expert_d_ff(), c.expert_d_ff());
    EXPECT_EQ(back->num_shared_experts, c.num_shared_experts);
    EXPECT_EQ(back->moe_layer_freq, c.moe_layer_freq);
    EXPECT_DOUBLE_EQ(back->router_z_loss_coef, c.router_z_loss_coef);
  }
  auto jitter = config_from_hf_json(
      R"({"model_type": "mixtral", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
          "intermediate_size": 4, "router_jitter_noise": 0.1})");
  EXPECT_NE(jitter.status().message().find("router_jitter_noise"), std::string::npos);
}

}  // namespace
}  // namespace kiln
