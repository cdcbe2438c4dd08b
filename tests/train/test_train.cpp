// Token shards (round trip, corrupted files), the LR schedule, model save/load (round trip,
// HF layout, truncation), the sampler, and a short deterministic training run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kiln/core/thread_pool.h"
#include "kiln/model/weights.h"
#include "kiln/serve/sampler.h"
#include "kiln/train/data.h"
#include "kiln/train/trainer.h"
#include "tests/temp_dir.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

TEST(Shards, RoundTripAndCorruption) {
  const fs::path dir = tmp_dir("kiln_shards");
  std::vector<int32_t> tokens = {0, 5, 65535, 7, 1};
  ASSERT_TRUE(write_shard((dir / "a.bin").string(), tokens, 65536).ok());
  EXPECT_EQ(read_shard((dir / "a.bin").string())->tokens, tokens);
  std::vector<int32_t> wide = {0, 70000, 3};
  ASSERT_TRUE(write_shard((dir / "b.bin").string(), wide, 100000).ok());
  EXPECT_EQ(read_shard((dir / "b.bin").string())->tokens, wide);
  fs::resize_file(dir / "a.bin", fs::file_size(dir / "a.bin") - 1);
  auto truncated = read_shard((dir / "a.bin").string());
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
  { std::ofstream(dir / "c.bin") << "not a shard at all, really not a shard, long enough to have a header..."; }
  EXPECT_FALSE(read_shard((dir / "c.bin").string()).ok());
  ASSERT_TRUE(write_shard((dir / "d.bin").string(), {1, 9}, 5).ok());  // token 9 >= vocab 5
  EXPECT_FALSE(read_shard((dir / "d.bin").string()).ok());
  EXPECT_EQ(read_shard((dir / "missing.bin").string()).status().code(), StatusCode::kNotFound);
}

TEST(Schedule, WarmupThenCosine) {
  TrainOptions o;
  o.lr = 1.0;
  o.warmup_steps = 10;
  o.min_lr_fraction = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(o, 5, 110), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10, 110), 1.0);
  EXPECT_NEAR(learning_rate(o, 60, 110), 0.55, 1e-12);  // halfway: (1 + 0.1) / 2
  EXPECT_NEAR(learning_rate(o, 110, 110), 0.1, 1e-12);
}

ModelConfig tiny(ModelFamily f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 13; c.d_model = 8; c.n_layers = 2; c.n_heads = 2;
  c.n_kv_heads = f == ModelFamily::kLlama ? 1 : 2;
  c.d_ff = 16; c.max_seq_len = 8; c.tied_embeddings = f == ModelFamily::kGpt2;
  return c;
}

TEST(Weights, SaveLoadRoundTripBothFamilies) {
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    const fs::path dir = tmp_dir("kiln_weights");
    auto model = Transformer::create(tiny(f), 11).value();
    ASSERT_TRUE(save_model(dir.string(), *model).ok());
    auto loaded = load_model(dir.string()).value();
    EXPECT_EQ(loaded->config().describe(), model->config().describe());
    ASSERT_EQ(loaded->params().size(), model->params().size());
    EXPECT_TRUE(std::equal(loaded->params().begin(), loaded->params().end(), model->params().begin()));
    // Truncated weights: an error naming the file, never a crash.
    fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") / 2);
    auto bad = load_model(dir.string());
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("model.safetensors"), std::string::npos);
  }
  EXPECT_EQ(load_model("/nonexistent").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(config_from_hf_json(R"({"model_type": "bert"})").ok());
  EXPECT_FALSE(config_from_hf_json(R"({"model_type": "llama", "hidden_size": "x"})").ok());
}

TEST(Sampler, GreedyTopKTopP) {
  const float logits[5] = {0.0f, 3.0f, 1.0f, 2.9f, -1.0f};
  Rng rng(1);
  EXPECT_EQ(sample_token(logits, 5, {0.0f, 0, 1.0f}, rng), 1);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = sample_token(logits, 5, {1.0f, 2, 1.0f}, rng);
    EXPECT_TRUE(t == 1 || t == 3);
  }
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, 5, {1.0f, 0, 0.1f}, rng), 1);
}

TEST(Trainer, DeterministicAndLearns) {
  TokenShard data;
  data.vocab_size = 13;
  for (int i = 0; i < 400; ++i) data.tokens.push_back(i % 13);  // a cycle the model can learn
  TrainOptions o;
  o.batch = 2; o.seq_len = 8; o.max_steps = 40; o.lr = 1e-2; o.warmup_steps = 5; o.eval_every = 0;
  auto run = [&] {
    auto m = Transformer::create(tiny(ModelFamily::kLlama), 3).value();
    return train(*m, data, nullptr, o, nullptr);
  };
  const auto a = run(), b = run();
  ASSERT_EQ(a.size(), 40u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1;
  EXPECT_LT(a.back().loss, 0.6f * a.front().loss);  // ln 13 = 2.56 falls to about 1.2
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A run interrupted by a checkpoint and resumed in a fresh model gives bitwise the losses of
// the uninterrupted run (1 thread).
TEST(Trainer, ResumeGivesTheSameLosses) {
  set_num_threads(1);
  TokenShard data;
  data.vocab_size = 13;
  Rng rng(4);
  for (int i = 0; i < 600; ++i) data.tokens.push_back(static_cast<int32_t>(rng.below(13)));
  TrainOptions o;
  o.batch = 2; o.seq_len = 8; o.max_steps = 10; o.warmup_steps = 3; o.grad_accum = 2;
  auto straight_model = Transformer::create(tiny(ModelFamily::kGpt2), 8).value();
  const auto straight = train(*straight_model, data, nullptr, o, nullptr);
  const std::string path = (tmp_dir("kiln_resume") / "checkpoint.bin").string();
  {
    auto m = Transformer::create(tiny(ModelFamily::kGpt2), 8).value();
    Trainer t(*m, data, nullptr, o);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(t.step().loss, straight[i].loss);
    ASSERT_TRUE(t.save_checkpoint(path).ok());
  }
  auto m = Transformer::create(tiny(ModelFamily::kGpt2), 999).value();  // other init: overwritten
  Trainer t(*m, data, nullptr, o);
  ASSERT_TRUE(t.load_checkpoint(path).ok());
  EXPECT_EQ(t.steps_done(), 4);
  for (int i = 4; i < 10; ++i) EXPECT_EQ(t.step().loss, straight[i].loss) << "step " << i + 1;
  EXPECT_TRUE(t.done());
  // Different options or a different model are refused with a message, not silently wrong.
  TrainOptions other = o;
  other.lr = 1.0;
  Trainer t2(*m, data, nullptr, other);
  EXPECT_FALSE(t2.load_checkpoint(path).ok());
  auto llama = Transformer::create(tiny(ModelFamily::kLlama), 1).value();
  Trainer t3(*llama, data, nullptr, o);
  EXPECT_FALSE(t3.load_checkpoint(path).ok());
  fs::resize_file(path, fs::file_size(path) - 4);
  EXPECT_FALSE(t.load_checkpoint(path).ok());
  set_num_threads(2);
}

}  // namespace
}  // namespace kiln
