// AWQ/SmoothQuant folding stays exact on Llama blocks with biases (HF attention_bias and
// mlp_bias): a scale folded into v_proj or up_proj divides that Linear's bias too.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/rng.h"
#include "kiln/model/transformer.h"
#include "kiln/quant/smooth.h"

namespace kiln::quant {
namespace {

TEST(QuantSmooth, FoldingWithBiasesLeavesFp32OutputUnchanged) {
  ModelConfig c = preset("llama-tiny").value();
  c.vocab_size = 40; c.d_model = 32; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 48; c.max_seq_len = 16;
  c.attention_bias = true;
  c.mlp_bias = true;
  auto m = Transformer::create(c, 5).value();
  Rng rng(6);
  for (float& w : m->params()) w += 0.2f * rng.normal();
  const std::vector<int32_t> tokens = {1, 7, 3, 9, 2, 8, 4, 6, 5, 0, 11, 13};
  ASSERT_TRUE(m->forward(tokens.data(), nullptr, 1, 12).ok());
  const std::vector<float> before(m->logits(), m->logits() + 12 * c.vocab_size);
  auto groups = smooth_groups(*m);
  ASSERT_TRUE(groups.ok());
  for (const SmoothGroup& g : *groups) {
    int64_t in = 0;
    for (Linear* l : m->linears())
      if (l->name == g.consumers[0]) in = l->in;
    ASSERT_GT(in, 0) << g.consumers[0];
    std::vector<float> s(static_cast<size_t>(in));
    // Positive scales, equal within a GQA tie (as smoothquant_scales makes them).
    for (int64_t i = 0; i < in; ++i) {
      const int64_t tied = g.tie > 1 ? (i / (g.tie * g.head_dim)) * g.tie * g.head_dim + i % g.head_dim : i;
      s[static_cast<size_t>(i)] = 0.5f + 0.05f * static_cast<float>(tied % 17);
    }
    ASSERT_TRUE(apply_smoothing(*m, g, s).ok()) << g.consumers[0];
  }
  ASSERT_TRUE(m->forward(tokens.data(), nullptr, 1, 12).ok());
  double err = 0, ref = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    err += std::pow(static_cast<double>(m->logits()[i]) - before[i], 2);
    ref += static_cast<double>(before[i]) * before[i];
  }
  EXPECT_LT(err, 1e-9 * ref);
}

}  // namespace
}  // namespace kiln::quant
