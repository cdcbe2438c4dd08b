// The whole model's backward against central finite differences of its loss, for both
// families (GQA included), plus presets, errors and a few AdamW steps that must lower the loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/adamw.h"
#include "kiln/model/transformer.h"
#include "kiln/serve/kv_cache_manager.h"

namespace kiln {
namespace {

ModelConfig tiny(ModelFamily f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = f == ModelFamily::kLlama ? 1 : 2;
  c.d_ff = 12;
  c.max_seq_len = 8;
  c.tied_embeddings = f == ModelFamily::kGpt2;
  return c;
}

void check_gradients(const ModelConfig& config) {
  auto model = Transformer::create(config, 3).value();
  // Larger weights than the 0.02 init so every path carries signal.
  Rng rng(5);
  for (float& w : model->params()) w += 0.3f * rng.normal();
  const int64_t B = 2, T = 5;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(11));
  for (auto& t : targets) t = static_cast<int32_t>(rng.below(11));
  targets[3] = -1;  // an ignored position
  model->zero_grad();
  ASSERT_TRUE(model->forward(tokens.data(), targets.data(), B, T).ok());
  model->backward();
  std::vector<float> grads(model->grads().begin(), model->grads().end());
  auto loss = [&] { return static_cast<double>(model->forward(tokens.data(), targets.data(), B, T).value()); };
  int checked = 0;
  for (const ParamEntry& e : model->param_entries()) {
    for (int probe = 0; probe < 3; ++probe) {
      const int64_t i = e.offset + static_cast<int64_t>(rng.below(static_cast<uint64_t>(e.shape.numel())));
      float& w = model->params()[static_cast<size_t>(i)];
      const float saved = w;
      const float h = 4e-3f;
      w = saved + h;
      const double lp = loss();
      w = saved - h;
      const double lm = loss();
      w = saved;
      const double fd = (lp - lm) / (2.0 * h);
      EXPECT_NEAR(grads[i], fd, 2e-3 + 3e-2 * std::fabs(fd)) << config.describe() << ": " << e.name << " element "
                                                             << i - e.offset;
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

// A Llama with a dense block and a MoE block (4 experts, top-2, a shared expert; dropless).
ModelConfig tiny_moe() {
  ModelConfig c = tiny(ModelFamily::kLlama);
  c.num_experts = 4;
  c.moe_d_ff = 6;
  c.num_shared_experts = 1;
  c.moe_layer_freq = 2;
  return c;
}

// A Llama with multi-head latent attention: a query latent, v_head_dim != the qk head dim,
// RoPE on de-interleaved rope dims (and the variant without query latent or interleave).
ModelConfig tiny_mla(bool q_latent) {
  ModelConfig c = tiny(ModelFamily::kLlama);
  c.n_kv_heads = c.n_heads;
  c.kv_lora_rank = 4;
  c.q_lora_rank = q_latent ? 3 : 0;
  c.qk_nope_head_dim = 2;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 3;
  c.rope_interleave = q_latent;
  return c;
}

TEST(Transformer, LatentAttentionGradientsMatchFiniteDifferences) {
  check_gradients(tiny_mla(true));
  check_gradients(tiny_mla(false));
}

TEST(Transformer, Gpt2GradientsMatchFiniteDifferences) { check_gradients(tiny(ModelFamily::kGpt2)); }

// GPT-2's MLP runs GELU in the up projection's GEMM epilogue, keeping its input for the backward
// (Linear::forward_act, GemmParams::save_pre). The epilogue evaluates GELU with the elementwise
// kernel's instructions, and the weight-gradient GEMMs sum dY's rows into the bias gradients in
// the separate pass's order (GemmParams::bias_grad), so the loss and every gradient are bitwise
// those of the unfused path (split_epilogue: the GEMMs, then the bias, residual, GELU and bias
// gradient kernels), at 1 and 2 threads.
TEST(Transformer, FusedGeluEpiloguesMatchTheSplitPathBitwise) {
  ModelConfig c = tiny(ModelFamily::kGpt2);
  c.d_model = 16;
  c.d_ff = 40;
  const int saved_threads = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<std::vector<float>> grads;
    std::vector<float> losses;
    for (bool split : {false, true}) {
      auto model = Transformer::create(c, 3).value();
      Rng rng(5);
      for (float& w : model->params()) w += 0.3f * rng.normal();
      model->set_split_epilogues(split);
      const int64_t B = 2, T = 7;
      std::vector<int32_t> tokens(B * T), targets(B * T);
      for (auto& t : tokens) t = static_cast<int32_t>(rng.below(11));
      for (auto& t : targets) t = static_cast<int32_t>(rng.below(11));
      model->zero_grad();
      losses.push_back(model->forward(tokens.data(), targets.data(), B, T).value());
      model->backward();
      grads.emplace_back(model->grads().begin(), model->grads().end());
    }
    EXPECT_EQ(losses[0], losses[1]) << threads << " threads";
    ASSERT_EQ(grads[0].size(), grads[1].size());
    int64_t differ = 0;
    for (size_t i = 0; i < grads[0].size(); ++i) differ += grads[0][i] != grads[1][i];
    EXPECT_EQ(differ, 0) << threads << " threads: gradients that differ from the split path's";
  }
  set_num_threads(saved_threads);
}
TEST(Transformer, LlamaGradientsMatchFiniteDifferences) { check_gradients(tiny(ModelFamily::kLlama)); }

// The HF config options (hf_config.h) in forward and backward: Llama's biases and each RoPE
// scaling (yarn's attention factor scales cos and sin), GPT-2's attention scales.
std::vector<ModelConfig> option_configs() {
  std::vector<ModelConfig> out;
  ModelConfig l = tiny(ModelFamily::kLlama);
  l.attention_bias = true;
  l.mlp_bias = true;
  l.rope_scaling = RopeScaling{RopeType::kYarn, 4.0};
  l.rope_scaling.original_max_positions = 4;
  l.rope_scaling.beta_fast = 2.0;  // the ramp inside the 2 pairs of head_dim 4
  out.push_back(l);
  l.attention_bias = false;
  l.rope_scaling = RopeScaling{RopeType::kLlama3, 8.0, 1.0, 4.0, 4};
  out.push_back(l);
  l.mlp_bias = false;
  l.attention_bias = true;
  l.rope_scaling = RopeScaling{RopeType::kLinear, 2.0};
  out.push_back(l);
  ModelConfig g = tiny(ModelFamily::kGpt2);
  g.scale_attn_weights = false;
  out.push_back(g);
  g.scale_attn_weights = true;
  g.scale_attn_by_inverse_layer_idx = true;
  out.push_back(g);
  g.scale_attn_weights = false;
  out.push_back(g);
  return out;
}

TEST(Transformer, ConfigOptionGradientsMatchFiniteDifferences) {
  for (const ModelConfig& c : option_configs()) check_gradients(c);
}

TEST(Transformer, BiasesHaveHfNamesAndCount) {
  ModelConfig c = tiny(ModelFamily::kLlama);
  c.attention_bias = true;
  c.mlp_bias = true;
  auto model = Transformer::create(c, 1).value();
  for (const char* name : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                           "self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"})
    for (int layer = 0; layer < 2; ++layer)
      EXPECT_NE(model->param(fmt::format("model.layers.{}.{}", layer, name)), nullptr) << name;
  int64_t total = 0;
  for (const auto& e : model->param_entries()) total += e.shape.numel();
  EXPECT_EQ(total, c.num_params());
  EXPECT_EQ(model->param("model.layers.0.self_attn.k_proj.bias") + c.n_kv_heads * c.head_dim(),
            model->param("model.layers.0.self_attn.v_proj.weight"));  // (Hkv·D,) before the next weight
  auto plain = Transformer::create(tiny(ModelFamily::kLlama), 1).value();
  EXPECT_EQ(plain->param("model.layers.0.self_attn.q_proj.bias"), nullptr);
}

TEST(Transformer, PresetsAndParameterCounts) {
  const ModelConfig g = preset("gpt2-124m").value();
  EXPECT_EQ(g.num_params(), 124439808);  // GPT-2 small, tied embeddings
  const ModelConfig l = preset("llama-tiny").value();
  EXPECT_GT(l.num_params(), 8'000'000);
  EXPECT_LT(l.num_params(), 14'000'000);
  for (const auto& name : preset_names()) EXPECT_TRUE(preset(name).ok()) << name;
  auto bad = preset("gpt5");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("llama-tiny"), std::string::npos);
  auto model = Transformer::create(tiny(ModelFamily::kLlama), 1).value();
  int64_t total = 0;
  for (const auto& e : model->param_entries()) total += e.shape.numel();
  EXPECT_EQ(total, tiny(ModelFamily::kLlama).num_params());
  EXPECT_EQ(static_cast<int64_t>(model->params().size()), total);
}

TEST(Transformer, BadInputIsAnError) {
  ModelConfig c = tiny(ModelFamily::kLlama);
  c.n_kv_heads = 3;
  EXPECT_FALSE(Transformer::create(c, 1).ok());
  auto model = Transformer::create(tiny(ModelFamily::kGpt2), 1).value();
  std::vector<int32_t> tokens = {1, 2, 99};
  auto r = model->forward(tokens.data(), nullptr, 1, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("99"), std::string::npos);
  EXPECT_FALSE(model->forward(tokens.data(), nullptr, 1, 100).ok());  // longer than the context
}

TEST(Transformer, AdamWStepsLowerTheLoss) {
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    auto model = Transformer::create(tiny(f), 7).value();
    std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8}, targets = {2, 3, 4, 5, 6, 7, 8, 9};
    std::vector<float> m(model->params().size()), v(model->params().size());
    AdamWConfig opt;
    opt.lr = 1e-2;
    opt.weight_decay = 0.0;
    const float first = model->forward(tokens.data(), targets.data(), 1, 8).value();
    float last = first;
    for (int step = 1; step <= 30; ++step) {
      model->zero_grad();
      last = model->forward(tokens.data(), targets.data(), 1, 8).value();
      model->backward();
      cpu::adamw_step(model->params().data(), model->grads().data(), m.data(), v.data(),
                      static_cast<int64_t>(m.size()), opt, step);
    }
    EXPECT_LT(last, 0.5f * first) << family_name(f);
    EXPECT_NEAR(first, std::log(11.0f), 0.3f);  // random init predicts about uniformly
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Greedy decoding through the KV cache gives the same tokens (and nearly the same logits) as
// recomputing the whole sequence every step.
TEST(Transformer, KvCacheMatchesFullRecompute) {
  std::vector<ModelConfig> configs = {tiny(ModelFamily::kGpt2), tiny(ModelFamily::kLlama), tiny_moe(), tiny_mla(true),
                                      tiny_mla(false)};
  for (const ModelConfig& c : option_configs()) configs.push_back(c);  // the decode path has the options too
  for (ModelConfig c : configs) {
    c.max_seq_len = 24;
    auto model = Transformer::create(c, 9).value();
    Rng rng(2);
    for (float& w : model->params()) w += 0.2f * rng.normal();
    const int64_t V = c.vocab_size;
    std::vector<int32_t> full = {3, 1, 4, 1, 5};
    KVCache cache = model->make_kv_cache(24);
    const float* cl = model->forward_cached(full.data(), 5, cache).value();
    std::vector<float> cached_last(cl + 4 * V, cl + 5 * V);
    for (int step = 0; step < 12; ++step) {
      ASSERT_TRUE(model->forward(full.data(), nullptr, 1, static_cast<int64_t>(full.size())).ok());
      const float* fl = model->logits() + (static_cast<int64_t>(full.size()) - 1) * V;
      for (int64_t i = 0; i < V; ++i) ASSERT_NEAR(cached_last[i], fl[i], 1e-4f) << c.describe() << " step " << step;
      const int32_t next = static_cast<int32_t>(std::max_element(fl, fl + V) - fl);
      EXPECT_EQ(next, static_cast<int32_t>(std::max_element(cached_last.begin(), cached_last.end()) - cached_last.begin()));
      full.push_back(next);
      const float* nl = model->forward_cached(&next, 1, cache).value();
      cached_last.assign(nl, nl + V);
    }
    EXPECT_EQ(cache.len, 17);
    // The compressed cache of latent attention holds [c, k_pe] per token, for all heads.
    EXPECT_EQ(cache.bytes_per_token(), c.is_mla() ? c.n_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * 4
                                                  : 2 * c.n_layers * c.n_kv_heads * c.head_dim() * 4);
    EXPECT_EQ(kv_bytes_per_token(c, DType::kF32), cache.bytes_per_token());  // what serving sizes its pool by
    // Past the cache: an error, not a crash.
    KVCache small = model->make_kv_cache(4);
    EXPECT_FALSE(model->forward_cached(full.data(), 5, small).ok());
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A backend that runs the fp32 path on a weight scaled by 2 and counts its calls: installing
// it must change the logits of exactly the Linears it is on, and backward must route through it.
class DoublingBackend : public LinearBackend {
 public:
  explicit DoublingBackend(const Linear& l) : w2_(l.w, l.w + l.in * l.out) {
    for (float& w : w2_) w *= 2.0f;
  }
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override {
    Linear copy = l;
    copy.w = w2_.data();
    copy.backend = nullptr;
    copy.forward_f32(y, x, n, residual);
    ++forward_calls;
  }
  mutable int forward_calls = 0;

 private:
  std::vector<float> w2_;
};

TEST(Transformer, LinearBackendReplacesTheFp32Path) {
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    auto model = Transformer::create(tiny(f), 3).value();
    const std::vector<Linear*> linears = model->linears();
    ASSERT_FALSE(linears.empty());
    EXPECT_EQ(linears.back()->out, tiny(f).vocab_size);  // the LM head comes last
    std::vector<int32_t> tokens = {1, 2, 3, 4};
    ASSERT_TRUE(model->forward(tokens.data(), nullptr, 1, 4).ok());
    std::vector<float> before(model->logits(), model->logits() + 4 * tiny(f).vocab_size);
    // Doubling the head's weight doubles the logits exactly.
    auto backend = std::make_shared<DoublingBackend>(*linears.back());
    linears.back()->backend = backend;
    ASSERT_TRUE(model->forward(tokens.data(), nullptr, 1, 4).ok());
    EXPECT_EQ(backend->forward_calls, 1);
    for (size_t i = 0; i < before.size(); ++i) EXPECT_FLOAT_EQ(model->logits()[i], 2.0f * before[i]) << i;
    linears.back()->backend = nullptr;
    ASSERT_TRUE(model->forward(tokens.data(), nullptr, 1, 4).ok());
    for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(model->logits()[i], before[i]) << i;
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The serving path (forward_paged: paged KV cache, split-KV decode, gathered prefill chunks)
// gives the logits of the full forward, with every config option: one model code path.
TEST(Transformer, PagedForwardMatchesFullForwardWithOptions) {
  std::vector<ModelConfig> configs = {tiny(ModelFamily::kGpt2), tiny(ModelFamily::kLlama), tiny_moe(), tiny_mla(true),
                                      tiny_mla(false)};
  for (const ModelConfig& c : option_configs()) configs.push_back(c);
  for (ModelConfig c : configs) {
    c.max_seq_len = 24;
    auto model = Transformer::create(c, 4).value();
    Rng rng(6);
    for (float& w : model->params()) w += 0.2f * rng.normal();
    const int64_t V = c.vocab_size, kBlock = 4, kMaxBlocks = 6;
    // Two sequences: a prefill of 10 (longer than kSplitKvMaxQueries: the gathered flash path)
    // and of 3, then each decodes 4 tokens, both in one batch per step.
    std::vector<std::vector<int32_t>> seqs = {{1, 5, 2, 7, 3, 9, 4, 8, 6, 0}, {10, 3, 7}};
    std::vector<std::vector<float>> full(2);
    std::vector<int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // (2, kMaxBlocks)
    PagedKvCache cache = model->make_paged_kv_cache(12, kBlock);
    std::vector<int32_t> cached = {0, 0};
    std::vector<int32_t> feed = {static_cast<int32_t>(seqs[0].size()), static_cast<int32_t>(seqs[1].size())};
    for (int step = 0; step < 5; ++step) {
      std::vector<int32_t> tokens;
      for (int s = 0; s < 2; ++s)
        tokens.insert(tokens.end(), seqs[s].end() - feed[s], seqs[s].end());
      const std::vector<int32_t> rows = {feed[0] - 1, feed[0] + feed[1] - 1};  // each sequence's last token
      PagedBatch b{tokens, cached, feed, table, kMaxBlocks, rows};
      const float* logits = model->forward_paged(b, cache).value();
      std::vector<float> paged(logits, logits + 2 * V);
      for (int s = 0; s < 2; ++s) {
        const int64_t T = static_cast<int64_t>(seqs[s].size());
        ASSERT_TRUE(model->forward(seqs[s].data(), nullptr, 1, T).ok());
        const float* last = model->logits() + (T - 1) * V;
        for (int64_t i = 0; i < V; ++i)
          ASSERT_NEAR(paged[s * V + i], last[i], 1e-4f) << c.describe() << " step " << step << " seq " << s;
        cached[s] += feed[s];
        feed[s] = 1;
        seqs[s].push_back(static_cast<int32_t>(std::max_element(last, last + V) - last));
      }
    }
  }
}

}  // namespace
}  // namespace kiln
