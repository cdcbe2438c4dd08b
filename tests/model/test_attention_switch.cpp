// The model trains to the same losses with either attention implementation (naive GEMM path or
// FlashAttention) within fp32 rounding, for both families (GPT-2's fused QKV strides, Llama's
// GQA after RoPE), and decodes through the KV cache (split-KV path) to the same logits.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/kernels/adamw.h"
#include "kiln/kernels/attention.h"
#include "kiln/model/transformer.h"

namespace kiln {
namespace {

ModelConfig small(ModelFamily f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 23;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = f == ModelFamily::kLlama ? 2 : 4;
  c.d_ff = 48;
  c.max_seq_len = 80;  // T = 70 below spans two 64-row query tiles
  c.tied_embeddings = f == ModelFamily::kGpt2;
  return c;
}

// Restores the process-wide setting when a test ends.
struct ImplGuard {
  AttentionImpl saved = attention_impl();
  ~ImplGuard() { set_attention_impl(saved); }
};

std::vector<float> train_losses(ModelFamily f, AttentionImpl impl) {
  set_attention_impl(impl);
  auto model = Transformer::create(small(f), 11).value();
  const int64_t B = 2, T = 70;
  Rng rng(3);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(23));
  for (size_t i = 0; i < tokens.size(); ++i) targets[i] = tokens[(i + 1) % tokens.size()];
  std::vector<float> m(model->params().size()), v(model->params().size()), losses;
  AdamWConfig opt;
  opt.lr = 1e-2;
  for (int step = 1; step <= 6; ++step) {
    model->zero_grad();
    losses.push_back(model->forward(tokens.data(), targets.data(), B, T).value());
    model->backward();
    cpu::adamw_step(model->params().data(), model->grads().data(), m.data(), v.data(), static_cast<int64_t>(m.size()),
                    opt, step);
  }
  return losses;
}

TEST(AttentionSwitch, TrainingLossesMatchWithEitherAttention) {
  ImplGuard guard;
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    const std::vector<float> naive = train_losses(f, AttentionImpl::kNaive);
    const std::vector<float> flash = train_losses(f, AttentionImpl::kFlash);
    ASSERT_EQ(naive.size(), flash.size());
    for (size_t i = 0; i < naive.size(); ++i)
      EXPECT_NEAR(naive[i], flash[i], 2e-5 * std::fabs(naive[i])) << family_name(f) << " step " << i + 1;
    EXPECT_LT(flash.back(), flash.front()) << family_name(f);  // it does train
  }
}

std::vector<float> decode_logits(ModelFamily f, AttentionImpl impl) {
  set_attention_impl(impl);
  auto model = Transformer::create(small(f), 5).value();
  KVCache cache = model->make_kv_cache(40);
  std::vector<int32_t> prompt = {1, 4, 9, 16, 2, 7, 3, 22, 0, 5, 6, 8};
  const int64_t V = model->config().vocab_size;
  auto first = model->forward_cached(prompt.data(), static_cast<int64_t>(prompt.size()), cache);
  std::vector<float> out(*first + (prompt.size() - 1) * V, *first + prompt.size() * V);
  for (int32_t tok : {3, 14, 15, 9}) {
    const float* step = model->forward_cached(&tok, 1, cache).value();
    out.insert(out.end(), step, step + V);
  }
  return out;
}

TEST(AttentionSwitch, CachedDecodingMatchesWithEitherAttention) {
  ImplGuard guard;
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    const std::vector<float> naive = decode_logits(f, AttentionImpl::kNaive);
    const std::vector<float> flash = decode_logits(f, AttentionImpl::kFlash);
    ASSERT_EQ(naive.size(), flash.size());
    for (size_t i = 0; i < naive.size(); ++i) EXPECT_NEAR(naive[i], flash[i], 1e-4) << family_name(f) << " " << i;
  }
}

}  // namespace
}  // namespace kiln
