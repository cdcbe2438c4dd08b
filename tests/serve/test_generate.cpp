// generate(): one request run to its end through the engine's steps (what `kiln generate`
// runs): greedy tokens equal batch-1 decoding, a callback that returns false ends its sample at
// once (kStop), a stop token ends it (emitted), the request's errors and an engine failure
// come back as errors, and a draft model's speculation is counted.
#include <gtest/gtest.h>

#include "kiln/core/dtype.h"
#include "kiln/serve/generate.h"
#include "kiln/serve/kv_cache_manager.h"
#include "tests/serve/serve_test_util.h"

namespace kiln {
namespace {

using test::greedy;
using test::reference_generate;
using test::tiny_config;
using test::tiny_model;

std::unique_ptr<Engine> engine_of(const ModelConfig& cfg, std::unique_ptr<Transformer> draft = nullptr) {
  EngineConfig ec;
  ec.kv_cache_mem_bytes = 32 * 16 * 2 * kv_bytes_per_token(cfg, DType::kF32);
  ec.speculative_max_batch = 0;
  auto e = Engine::create(tiny_model(cfg), ec, std::move(draft));
  KILN_CHECK_MSG(e.ok(), "{}", e.status().to_string());
  return std::move(e).value();
}

TEST(Generate, GreedyEqualsBatchOneAndTheCallbackStopsASample) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto engine = engine_of(cfg);
  auto ref = tiny_model(cfg);
  const std::vector<int32_t> prompt = {4, 8, 15, 16, 23, 42};
  std::vector<int32_t> seen;
  auto r = generate(*engine, prompt, greedy(10), [&](int64_t index, int32_t t) {
    EXPECT_EQ(index, 0);
    seen.push_back(t);
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->samples[0].tokens, reference_generate(*ref, prompt, 10));
  EXPECT_EQ(seen, r->samples[0].tokens);
  EXPECT_EQ(r->samples[0].finish, FinishReason::kLength);

  int calls = 0;
  auto cut = generate(*engine, prompt, greedy(10), [&](int64_t, int32_t) { return ++calls < 3; });
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->samples[0].tokens.size(), 3u);
  EXPECT_EQ(cut->samples[0].finish, FinishReason::kStop);

  GenerationParams stop = greedy(10);
  stop.stop_token_ids = {r->samples[0].tokens[4]};
  auto stopped = generate(*engine, prompt, stop);
  ASSERT_TRUE(stopped.ok());
  const std::vector<int32_t> want(r->samples[0].tokens.begin(), r->samples[0].tokens.begin() + 5);
  EXPECT_EQ(stopped->samples[0].tokens, want);
  EXPECT_EQ(engine->metrics().kv_blocks.num_used, 0);
}

TEST(Generate, ErrorsComeBackAsErrors) {
  const ModelConfig cfg = tiny_config(ModelFamily::kGpt2);
  auto engine = engine_of(cfg);
  EXPECT_EQ(generate(*engine, {}, greedy(4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(generate(*engine, {1, 2}, greedy(10000)).status().code(), StatusCode::kOutOfRange);
  engine->fail_next_step(internal_error("injected fault"));
  auto failed = generate(*engine, {1, 2, 3}, greedy(4));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("injected fault"), std::string::npos);
  EXPECT_TRUE(generate(*engine, {1, 2, 3}, greedy(4)).ok()) << "the engine goes on";
}

// The target as its own draft: every proposal is accepted, the tokens are the target's alone.
TEST(Generate, SpeculationThroughTheEngineIsCounted) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto engine = engine_of(cfg, tiny_model(cfg));
  auto ref = tiny_model(cfg);
  const std::vector<int32_t> prompt = {9, 9, 8, 7};
  auto r = generate(*engine, prompt, greedy(17));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->samples[0].tokens, reference_generate(*ref, prompt, 17));
  EXPECT_GT(r->spec.num_proposed, 0);
  EXPECT_EQ(r->spec.num_accepted, r->spec.num_proposed);
  EXPECT_GT(r->spec.tokens_per_pass(), 1.0);
}

}  // namespace
}  // namespace kiln
