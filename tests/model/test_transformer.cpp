// The whole model's backward against central finite differences of its loss, for both
// families (GQA included), plus presets, errors and a few AdamW steps that must lower the loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/adamw.h"
#include "kiln/model/transformer.h"

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

void check_gradients(ModelFamily family) {
  auto model = Transformer::create(tiny(family), 3).value();
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
      EXPECT_NEAR(grads[i], fd, 2e-3 + 3e-2 * std::fabs(fd)) << e.name << " element " << i - e.offset;
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(Transformer, Gpt2GradientsMatchFiniteDifferences) { check_gradients(ModelFamily::kGpt2); }
TEST(Transformer, LlamaGradientsMatchFiniteDifferences) { check_gradients(ModelFamily::kLlama); }

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
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    ModelConfig c = tiny(f);
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
      for (int64_t i = 0; i < V; ++i) ASSERT_NEAR(cached_last[i], fl[i], 1e-4f) << family_name(f) << " step " << step;
      const int32_t next = static_cast<int32_t>(std::max_element(fl, fl + V) - fl);
      EXPECT_EQ(next, static_cast<int32_t>(std::max_element(cached_last.begin(), cached_last.end()) - cached_last.begin()));
      full.push_back(next);
      const float* nl = model->forward_cached(&next, 1, cache).value();
      cached_last.assign(nl, nl + V);
    }
    EXPECT_EQ(cache.len, 17);
    EXPECT_EQ(cache.bytes_per_token(), 2 * c.n_layers * c.n_kv_heads * c.head_dim() * 4);
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
