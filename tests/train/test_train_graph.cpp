// Training with captured graphs (TrainOptions::graph_capture): each step (data loads, forwards,
// backwards, unscale, norm, clip, AdamW: the joint graph) replays the graph captured from the
// first one. At 1 thread the losses and the final weights are bitwise eager's (same kernels,
// same arguments, same order) for both families, with gradient accumulation and activation
// checkpointing, clipping on every step, a scaler that skips every step and one whose scale
// changes (a recapture); a MoE model's routing (which decides the expert GEMMs) breaks the
// graph into segments replayed around eager regions, to the same bits.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/train/data.h"
#include "kiln/train/trainer.h"

namespace kiln {
namespace {

ModelConfig small(ModelFamily f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 29; c.d_model = 16; c.n_layers = 2; c.n_heads = 2;
  c.n_kv_heads = f == ModelFamily::kLlama ? 1 : 2;
  c.d_ff = 32; c.max_seq_len = 16; c.tied_embeddings = f == ModelFamily::kGpt2;
  return c;
}

struct Trained {
  std::vector<float> losses, params;
  std::vector<bool> skipped;
  graph::GraphStats stats;
};

Trained train_steps(const ModelConfig& cfg, const TokenShard& data, TrainOptions o, bool capture) {
  o.graph_capture = capture;
  auto m = Transformer::create(cfg, 5).value();
  Trainer t(*m, data, nullptr, o);
  Trained r;
  while (!t.done()) {
    const StepStats st = t.step();
    r.losses.push_back(st.loss);
    r.skipped.push_back(st.skipped);
  }
  r.params.assign(m->params().begin(), m->params().end());
  if (capture) r.stats = *t.graph_stats();
  return r;
}

TokenShard random_tokens(int64_t vocab) {
  TokenShard data;
  data.vocab_size = vocab;
  Rng rng(6);
  for (int i = 0; i < 2000; ++i) data.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  return data;
}

TEST(TrainGraph, ReplayedStepsAreBitwiseEagerAtOneThread) {
  const int threads = num_threads();
  set_num_threads(1);
  TrainOptions o;
  o.batch = 2; o.seq_len = 16; o.max_steps = 6; o.warmup_steps = 2; o.eval_every = 0; o.grad_accum = 2;
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGpt2}) {
    for (CheckpointMode ck : {CheckpointMode::kNone, CheckpointMode::kFull}) {
      o.checkpoint = ck;
      const ModelConfig cfg = small(f);
      const TokenShard data = random_tokens(cfg.vocab_size);
      const Trained eager = train_steps(cfg, data, o, false), graph = train_steps(cfg, data, o, true);
      const std::string what = std::string(family_name(f)) + (ck == CheckpointMode::kFull ? " checkpointed" : "");
      EXPECT_EQ(graph.losses, eager.losses) << what;
      EXPECT_EQ(graph.params, eager.params) << what;
      EXPECT_EQ(graph.stats.captures, 1) << what;
      EXPECT_EQ(graph.stats.replays, 6 - 1) << what << ": every step after the first";
      EXPECT_TRUE(graph.stats.breaks.empty()) << what << ": " << graph.stats.breaks.front();
      EXPECT_LE(graph.stats.arena_bytes, graph.stats.eager_bytes + graph.stats.nodes * 128) << what;
    }
  }
  set_num_threads(threads);
}

// The update's data-dependent parts run inside the replayed nodes: the clip factor from this
// step's norm, the scaler's verdict (a skipped step leaves the weights alone), the learning rate
// of this step. A changed loss scale is a failed guard: recaptured, and named.
TEST(TrainGraph, TheOptimizerStepIsReplayedWithThisStepsValues) {
  const int threads = num_threads();
  set_num_threads(1);
  const ModelConfig cfg = small(ModelFamily::kLlama);
  const TokenShard data = random_tokens(cfg.vocab_size);
  TrainOptions o;
  o.batch = 2; o.seq_len = 16; o.max_steps = 6; o.warmup_steps = 2; o.eval_every = 0;
  o.clip_norm = 1e-3;  // every step clips
  o.weight_decay = 0.1;
  {
    const Trained eager = train_steps(cfg, data, o, false), graph = train_steps(cfg, data, o, true);
    EXPECT_EQ(graph.losses, eager.losses);
    EXPECT_EQ(graph.params, eager.params);
    EXPECT_EQ(graph.stats.replays, 5);
  }
  {
    TrainOptions skip = o;
    skip.loss_scale = INFINITY;  // static: every gradient is inf or NaN, every step is skipped
    const Trained eager = train_steps(cfg, data, skip, false), graph = train_steps(cfg, data, skip, true);
    const auto initial = Transformer::create(cfg, 5).value();
    EXPECT_EQ(graph.skipped, std::vector<bool>(6, true));
    EXPECT_EQ(graph.skipped, eager.skipped);
    EXPECT_EQ(graph.params, std::vector<float>(initial->params().begin(), initial->params().end()));
    EXPECT_EQ(graph.stats.replays, 5);
  }
  {
    TrainOptions dyn = o;
    dyn.dynamic_loss_scale = true;
    dyn.loss_scale = 1024;
    dyn.loss_scale_window = 2;  // S doubles after every two good steps
    const Trained eager = train_steps(cfg, data, dyn, false), graph = train_steps(cfg, data, dyn, true);
    EXPECT_EQ(graph.losses, eager.losses);
    EXPECT_EQ(graph.params, eager.params);
    EXPECT_EQ(graph.stats.recaptures, 2);
    EXPECT_EQ(graph.stats.last_recapture.rfind("loss scale bits", 0), 0u) << graph.stats.last_recapture;
  }
  set_num_threads(threads);
}

// MoE routing (forward and backward) runs eagerly between the replayed segments of the step:
// bitwise eager's at 1 thread, with and without full checkpointing.
TEST(TrainGraph, MoeRoutingSplitsTheStepIntoSegments) {
  const int threads = num_threads();
  set_num_threads(1);
  ModelConfig cfg = small(ModelFamily::kLlama);
  cfg.num_experts = 4;
  cfg.num_experts_per_tok = 2;
  const TokenShard data = random_tokens(cfg.vocab_size);
  TrainOptions o;
  o.batch = 2; o.seq_len = 16; o.max_steps = 3; o.warmup_steps = 1; o.eval_every = 0;
  for (CheckpointMode ck : {CheckpointMode::kNone, CheckpointMode::kFull}) {
    o.checkpoint = ck;
    const Trained eager = train_steps(cfg, data, o, false), graph = train_steps(cfg, data, o, true);
    EXPECT_EQ(graph.losses, eager.losses);
    EXPECT_EQ(graph.params, eager.params);
    EXPECT_EQ(graph.stats.replays, 2);
    EXPECT_EQ(graph.stats.eager_steps, 0);
    // forward: before, between, after the 2 MoE blocks; backward: 2 more (a MoE block keeps its
    // activations under checkpointing: the recomputed forward does not route again)
    EXPECT_EQ(graph.stats.segments, 5);
    ASSERT_FALSE(graph.stats.breaks.empty());
    EXPECT_NE(graph.stats.breaks[0].find("MoE"), std::string::npos) << graph.stats.breaks[0];
  }
  set_num_threads(threads);
}

}  // namespace
}  // namespace kiln
