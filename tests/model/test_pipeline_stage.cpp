// Pipeline stages of the transformer (PipelineStage): a model cut into block ranges, each stage
// run alone on the previous stage's output, gives bitwise the whole model's loss and gradients
// (the same layer code in the same order); activation slots hold several micro-batches at once;
// deferred weight gradients (zero-bubble's B then W) are bitwise the plain backward's.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/model/transformer.h"

namespace kiln {
namespace {

ModelConfig tiny(ModelFamily f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 40; c.d_model = 16; c.n_layers = 5; c.n_heads = 4;
  c.n_kv_heads = f == ModelFamily::kLlama ? 2 : 4;
  c.d_ff = 32; c.max_seq_len = 16;
  c.tied_embeddings = true;  // the last stage holds a copy of the embedding
  return c;
}

std::vector<int32_t> random_ids(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(rng.below(40));
  return ids;
}

// name -> gradient values, for the entries a model holds.
std::vector<float> grad_of(Transformer& m, const std::string& name) {
  for (const ParamEntry& e : m.param_entries())
    if (e.name == name) return {m.grad(name), m.grad(name) + e.shape.numel()};
  return {};
}

struct Cut {
  std::vector<std::unique_ptr<Transformer>> stages;
};
Cut cut(const ModelConfig& c, std::vector<int64_t> bounds) {
  Cut out;
  for (size_t i = 0; i + 1 < bounds.size(); ++i)
    out.stages.push_back(Transformer::create(c, 7, {}, PipelineStage::blocks(bounds[i], bounds[i + 1])).value());
  return out;
}

// Forward through the stages in order; returns the loss.
float forward(Cut& p, const std::vector<int32_t>& x, const std::vector<int32_t>& y, int64_t B, int64_t T) {
  const float* in = nullptr;
  float loss = 0;
  for (auto& s : p.stages) {
    loss = s->forward_stage(x.data(), y.data(), in, B, T).value();
    in = s->stage_output();
  }
  return loss;
}
void backward(Cut& p, bool defer = false) {
  const float* dout = nullptr;
  for (size_t i = p.stages.size(); i-- > 0;) {
    p.stages[i]->backward_stage(dout, 1.0f, defer);
    dout = p.stages[i]->input_grad();
  }
}

// Every parameter's gradient of the whole model equals the stage's that holds it (the tied
// embedding: the sum of the first stage's and the last stage's copy). Bitwise, except that sum:
// the whole model adds the embedding's rows onto the head's gradient, the stages add two partial
// sums, so it differs by fp32 rounding (a few ulps of the largest term).
void expect_same_grads(Transformer& whole, Cut& p) {
  for (const ParamEntry& e : whole.param_entries()) {
    std::vector<float> sum;
    int holders = 0;
    for (auto& s : p.stages) {
      const std::vector<float> g = grad_of(*s, e.name);
      if (g.empty()) continue;
      ++holders;
      if (sum.empty()) sum = g;
      else for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
    const bool bitwise = holders == 1;
    const std::vector<float> want = grad_of(whole, e.name);
    ASSERT_EQ(sum.size(), want.size()) << e.name;
    for (size_t i = 0; i < want.size(); ++i) {
      if (bitwise) ASSERT_EQ(sum[i], want[i]) << e.name << " [" << i << "]";
      else ASSERT_NEAR(sum[i], want[i], 1e-6f + 1e-5f * std::abs(want[i])) << e.name << " [" << i << "]";
    }
  }
}

TEST(PipelineStage, StagesHoldTheirBlocksAndTheWholeModelsValues) {
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGpt2}) {
    const ModelConfig c = tiny(f);
    auto whole = Transformer::create(c, 7).value();
    Cut p = cut(c, {0, 2, 4, 5});
    int64_t total = 0;
    for (auto& s : p.stages) {
      total += s->num_params();
      EXPECT_EQ(s->full_num_params(), whole->num_params());
      s->for_each_shard_run([&](int64_t local, int64_t full, int64_t n) {
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(s->params()[local + i], whole->params()[full + i]);
      });
    }
    const int64_t table = c.vocab_size * c.d_model;  // the last stage's copy of the tied embedding
    EXPECT_EQ(total, whole->num_params() + table);
    EXPECT_TRUE(p.stages[0]->has_embedding() && !p.stages[0]->has_head());
    EXPECT_TRUE(!p.stages[2]->has_embedding() && p.stages[2]->has_head());
    EXPECT_EQ(p.stages[1]->num_blocks(), 2);
    EXPECT_FALSE(Transformer::create(c, 7, {}, PipelineStage::blocks(3, 3)).ok());
    EXPECT_FALSE(Transformer::create(c, 7, {}, PipelineStage::blocks(4, 6)).ok());
    EXPECT_FALSE(Transformer::create(c, 7, {}, {{{2, 4}, {1, 2}}}).ok());  // chunks out of order
    // A middle stage needs its input.
    const std::vector<int32_t> x = random_ids(16, 1);
    EXPECT_FALSE(p.stages[1]->forward(x.data(), x.data(), 1, 16).ok());
  }
}

// The whole model's loss and gradients of one batch: the oracle.
struct Reference {
  std::unique_ptr<Transformer> model;
  float loss = 0;
};
Reference whole_step(const ModelConfig& c, const std::vector<int32_t>& x, const std::vector<int32_t>& y, int64_t B,
                     int64_t T) {
  Reference r{Transformer::create(c, 7).value()};
  r.loss = r.model->forward(x.data(), y.data(), B, T).value();
  r.model->backward();
  return r;
}

TEST(PipelineStage, ChainedStagesGiveTheWholeModelsLossAndGradientsBitwise) {
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGpt2}) {
    const ModelConfig c = tiny(f);
    const int64_t B = 2, T = 16;
    const std::vector<int32_t> x = random_ids(B * T, 3), y = random_ids(B * T, 4);
    const Reference ref = whole_step(c, x, y, B, T);
    Transformer* whole = ref.model.get();
    const float want = ref.loss;
    Cut p = cut(c, {0, 1, 3, 5});
    EXPECT_EQ(forward(p, x, y, B, T), want);
    backward(p);
    expect_same_grads(*whole, p);
  }
}

// Interleaved stages: a model of several chunks (rank A holds blocks [0, 1) and [3, 4), rank B
// [1, 3) and [4, 5)), run chunk by chunk in model order, is the whole model again.
TEST(PipelineStage, ChunksOfOneModelRunInModelOrder) {
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGpt2}) {
    const ModelConfig c = tiny(f);
    const int64_t B = 2, T = 16;
    const std::vector<int32_t> x = random_ids(B * T, 3), y = random_ids(B * T, 4);
    const Reference ref = whole_step(c, x, y, B, T);
    Transformer* whole = ref.model.get();
    const float want = ref.loss;
    Cut p;
    p.stages.push_back(Transformer::create(c, 7, {}, {{{0, 1}, {3, 4}}}).value());
    p.stages.push_back(Transformer::create(c, 7, {}, {{{1, 3}, {4, 5}}}).value());
    Transformer& a = *p.stages[0];
    Transformer& b = *p.stages[1];
    EXPECT_EQ(a.num_chunks(), 2);
    EXPECT_TRUE(a.has_embedding() && !a.has_head() && !b.has_embedding() && b.has_head());
    // Each chunk's forward in its own slot (its activations stay there for its backward).
    const int32_t* none = nullptr;
    a.use_activation_slot(0);
    ASSERT_TRUE(a.forward_stage(x.data(), y.data(), nullptr, B, T, 0).ok());
    b.use_activation_slot(0);
    ASSERT_TRUE(b.forward_stage(none, none, a.stage_output(0), B, T, 0).ok());
    a.use_activation_slot(1);
    ASSERT_TRUE(a.forward_stage(none, none, b.stage_output(0), B, T, 1).ok());
    b.use_activation_slot(1);
    EXPECT_EQ(b.forward_stage(none, y.data(), a.stage_output(1), B, T, 1).value(), want);
    b.backward_stage(nullptr, 1.0f, false, 1);
    a.use_activation_slot(1);
    a.backward_stage(b.input_grad(), 1.0f, false, 1);
    b.use_activation_slot(0);
    b.backward_stage(a.input_grad(), 1.0f, false, 0);
    a.use_activation_slot(0);
    a.backward_stage(b.input_grad(), 1.0f, false, 0);
    expect_same_grads(*whole, p);
    EXPECT_FALSE(a.forward_stage(x.data(), y.data(), nullptr, B, T, 2).ok());  // no chunk 2
  }
}

TEST(PipelineStage, SlotsHoldSeveralMicroBatchesAndDeferredWeightsMatch) {
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGpt2}) {
    const ModelConfig c = tiny(f);
    const int64_t B = 1, T = 16, M = 3;
    std::vector<std::vector<int32_t>> x, y;
    for (int i = 0; i < M; ++i) {
      x.push_back(random_ids(B * T, 10 + i));
      y.push_back(random_ids(B * T, 20 + i));
    }
    // Reference: one micro-batch at a time, forward then backward.
    auto whole = Transformer::create(c, 7).value();
    std::vector<float> want;
    for (int i = 0; i < M; ++i) {
      want.push_back(whole->forward(x[i].data(), y[i].data(), B, T).value());
      whole->backward();
    }
    // Activation checkpointing shares buffers between a slot's layers (each slot its own set);
    // its gradients are bitwise kNone's. Zero-bubble's deferred W runs without it.
    const struct { bool defer; CheckpointMode mode; } cases[] = {
        {false, CheckpointMode::kNone}, {false, CheckpointMode::kSelective}, {false, CheckpointMode::kFull},
        {true, CheckpointMode::kNone}};
    for (const auto [defer, mode] : cases) {
      // All forwards first (GPipe's order), each in its slot, then the backwards in order.
      Cut p = cut(c, {0, 2, 5});
      for (auto& s : p.stages) s->set_checkpointing(mode);
      for (int i = 0; i < M; ++i) {
        for (auto& s : p.stages) s->use_activation_slot(i);
        EXPECT_EQ(forward(p, x[i], y[i], B, T), want[static_cast<size_t>(i)]);
      }
      for (auto& s : p.stages) EXPECT_EQ(s->activation_slots(), M);
      for (int i = 0; i < M; ++i) {
        for (auto& s : p.stages) s->use_activation_slot(i);
        backward(p, defer);
        for (auto& s : p.stages) EXPECT_EQ(s->weights_pending(), defer);
      }
      if (defer) {
        EXPECT_GT(p.stages[1]->deferred_weight_bytes(), 0);
        for (int i = 0; i < M; ++i)
          for (auto& s : p.stages) {
            s->use_activation_slot(i);
            s->backward_weights();
            EXPECT_FALSE(s->weights_pending());
          }
        EXPECT_EQ(p.stages[1]->deferred_weight_bytes(), 0);
      }
      expect_same_grads(*whole, p);
    }
  }
}

}  // namespace
}  // namespace kiln
