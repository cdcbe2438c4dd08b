// The pre-packed inference backend (model/packed_linear.h): logits with and without it agree
// (prefill-sized rows on the packed path, decode-sized on the streaming path, both families),
// sync() follows a weight change, and Linears that already have a backend are left alone.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/model/packed_linear.h"
#include "kiln/model/transformer.h"

namespace kiln {
namespace {

ModelConfig small(ModelFamily f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 53;
  c.d_model = 40;  // odd multiples of the NR strips: partial strips in every Linear
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = f == ModelFamily::kLlama ? 2 : 4;
  c.d_ff = 70;
  c.max_seq_len = 16;
  c.tied_embeddings = f == ModelFamily::kGpt2;
  return c;
}

std::vector<float> logits_of(Transformer& m, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  EXPECT_TRUE(m.forward(tokens.data(), nullptr, B, T).ok());
  const int64_t V = m.config().vocab_size;
  return std::vector<float>(m.logits(), m.logits() + B * T * V);
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / std::max(den, 1e-30);
}

void check_family(ModelFamily family) {
  auto model = Transformer::create(small(family), 7).value();
  Rng rng(11);
  for (float& w : model->params()) w += 0.2f * rng.normal();
  for (auto [B, T] : {std::pair<int64_t, int64_t>{3, 7}, {1, 5}, {4, 16}}) {  // 21, 5 and 64 rows
    std::vector<int32_t> tokens(static_cast<size_t>(B * T));
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(53));
    for (auto& l : model->linears()) l->backend.reset();
    const std::vector<float> plain = logits_of(*model, tokens, B, T);
    EXPECT_GT(install_packed_weights(*model), 0);
    const std::vector<float> packed = logits_of(*model, tokens, B, T);
    EXPECT_LT(max_rel_diff(packed, plain), 1e-5) << "B=" << B << " T=" << T;
  }
  // A weight change reaches the packed copy through sync().
  std::vector<int32_t> tokens(24);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(53));
  for (float& w : model->params()) w *= 0.9f;
  for (Linear* l : model->linears()) l->backend->sync(*l);
  const std::vector<float> after = logits_of(*model, tokens, 2, 12);
  for (auto& l : model->linears()) l->backend.reset();
  EXPECT_LT(max_rel_diff(after, logits_of(*model, tokens, 2, 12)), 1e-5);
}

TEST(PackedLinear, LogitsMatchFp32Llama) { check_family(ModelFamily::kLlama); }
TEST(PackedLinear, LogitsMatchFp32Gpt2) { check_family(ModelFamily::kGpt2); }

TEST(PackedLinear, LogitsMatchWithThreads) {
  const int saved = num_threads();
  set_num_threads(2);
  check_family(ModelFamily::kLlama);
  set_num_threads(saved);
}

class MarkerBackend final : public LinearBackend {
 public:
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override {
    l.forward_f32(y, x, n, residual);
  }
};

TEST(PackedLinear, KeepsExistingBackends) {
  auto model = Transformer::create(small(ModelFamily::kLlama), 7).value();
  std::vector<Linear*> linears = model->linears();
  ASSERT_GE(linears.size(), 2u);
  auto marker = std::make_shared<MarkerBackend>();
  linears[0]->backend = marker;
  EXPECT_EQ(install_packed_weights(*model), static_cast<int>(linears.size()) - 1);
  EXPECT_EQ(model->linears()[0]->backend, marker);
  EXPECT_NE(dynamic_cast<PackedLinear*>(model->linears()[1]->backend.get()), nullptr);
  EXPECT_EQ(install_packed_weights(*model), 0);  // already installed everywhere
}

}  // namespace
}  // namespace kiln
