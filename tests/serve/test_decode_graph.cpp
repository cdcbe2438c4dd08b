// Captured decode graphs (serve/decode_graph.h) against eager decoding: the same tokens, greedy
// and sampled, for both families and changing batch sizes; a failed guard recaptures and says
// which; MoE routing is a graph break (listed, its steps eager, same tokens); a bad step is
// forward_paged's error, not a crash.
#include <gtest/gtest.h>

#include "kiln/core/thread_pool.h"
#include "kiln/serve/decode_graph.h"
#include "kiln/serve/engine.h"
#include "tests/serve/serve_test_util.h"

namespace kiln {
namespace {

using test::Collected;
using test::drain;
using test::tiny_config;
using test::tiny_model;

// Every request's tokens from an engine over `prompts` (max_tokens 10 + 3i, so the batch shrinks
// as they finish: several batch sizes), and its graph counters.
struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  GraphStats stats;
};
EngineRun run_engine(const ModelConfig& cfg, bool capture, const std::vector<std::vector<int32_t>>& prompts,
               float temperature = 0.0f) {
  EngineConfig ec;
  ec.graph_capture = capture;
  ec.kv_cache_mem_bytes = 64 * 16 * kv_bytes_per_token(cfg, DType::kF32);
  auto engine = std::move(Engine::create(tiny_model(cfg), ec)).value();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationParams p = test::greedy(10 + 3 * static_cast<int64_t>(i));
    p.sampling.temperature = temperature;
    p.seed = 11 + i;
    streams.push_back(engine->add_request(prompts[i], p).value());
  }
  engine->run_until_idle();
  EngineRun r;
  for (auto& s : streams) r.tokens.push_back(drain(*s).tokens[0]);
  if (const GraphStats* g = engine->graph_stats()) r.stats = *g;
  return r;
}

std::vector<std::vector<int32_t>> prompts_for(const ModelConfig& cfg) {
  Rng rng(9);
  std::vector<std::vector<int32_t>> p;
  for (int64_t len : {9, 30, 3, 17}) p.push_back(test::random_prompt(rng, len, cfg.vocab_size));
  return p;
}

class DecodeGraph : public ::testing::TestWithParam<ModelFamily> {};

TEST_P(DecodeGraph, CapturedDecodesTheTokensEagerDoes) {
  const ModelConfig cfg = tiny_config(GetParam());
  const auto prompts = prompts_for(cfg);
  for (float temperature : {0.0f, 0.8f}) {
    const EngineRun eager = run_engine(cfg, false, prompts, temperature);
    const EngineRun graph = run_engine(cfg, true, prompts, temperature);
    EXPECT_EQ(graph.tokens, eager.tokens) << "temperature " << temperature;
    const GraphStats& s = graph.stats;
    EXPECT_GE(s.captures, 2) << "the batch shrinks from 4 to 1: several batch sizes";
    EXPECT_GT(s.replays, 10);
    EXPECT_EQ(s.eager_steps, 0);
    EXPECT_TRUE(s.breaks.empty()) << s.breaks.front();
    EXPECT_GT(s.nodes, 10);
    EXPECT_GT(s.eager_bytes, 0);
    EXPECT_LT(s.arena_bytes, s.eager_bytes) << "lifetimes let activations share the arena";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DecodeGraph, ::testing::Values(ModelFamily::kLlama, ModelFamily::kGpt2),
                         [](const auto& info) { return std::string(family_name(info.param)); });

// A guard that fails recaptures, counted and named; the tokens stay eager's.
TEST(DecodeGraphGuards, ThreadCountChangeRecaptures) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  const int threads = num_threads();
  EngineConfig ec;
  ec.graph_capture = true;
  ec.kv_cache_mem_bytes = 64 * 16 * kv_bytes_per_token(cfg, DType::kF32);
  auto engine = std::move(Engine::create(tiny_model(cfg), ec)).value();
  auto ref_model = tiny_model(cfg);
  Rng rng(4);
  const std::vector<int32_t> prompt = test::random_prompt(rng, 12, cfg.vocab_size);
  const std::vector<int32_t> ref = test::reference_generate(*ref_model, prompt, 8);
  for (int t : {threads, threads == 1 ? 2 : 1}) {
    set_num_threads(t);
    auto s = engine->add_request(prompt, test::greedy(8)).value();
    engine->run_until_idle();
    EXPECT_EQ(drain(*s).tokens[0], ref) << t << " threads";
  }
  set_num_threads(threads);
  const GraphStats& g = *engine->graph_stats();
  EXPECT_EQ(g.captures, 1);
  EXPECT_EQ(g.recaptures, 1);
  EXPECT_NE(g.last_recapture.find("threads"), std::string::npos) << g.last_recapture;
  EXPECT_NE(describe(g).find("1 recaptured"), std::string::npos) << describe(g);
}

// MoE routing is data-dependent control flow: a graph break, listed; the routing runs eagerly
// between the replayed segments of each step (one per layer boundary), to the same tokens.
TEST(DecodeGraphBreaks, MoeRoutingSplitsTheGraphIntoSegments) {
  ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  cfg.num_experts = 4;
  cfg.num_experts_per_tok = 2;
  const auto prompts = prompts_for(cfg);
  const EngineRun eager = run_engine(cfg, false, prompts);
  const EngineRun graph = run_engine(cfg, true, prompts);
  EXPECT_EQ(graph.tokens, eager.tokens);
  EXPECT_GT(graph.stats.replays, 0);
  EXPECT_EQ(graph.stats.eager_steps, 0);
  EXPECT_EQ(graph.stats.segments, cfg.n_layers + 1) << "recorded nodes before, between and after the MoE blocks";
  ASSERT_FALSE(graph.stats.breaks.empty());
  EXPECT_NE(graph.stats.breaks[0].find("MoE"), std::string::npos) << graph.stats.breaks[0];
  EXPECT_NE(graph.stats.breaks[0].find("eager region"), std::string::npos) << graph.stats.breaks[0];
}

// A step a replay would run blindly is checked first: a bad block id is forward_paged's error.
TEST(DecodeGraphInputs, BadBlockIdIsAnError) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto model = tiny_model(cfg);
  PagedKvCache cache = model->make_paged_kv_cache(8, 16);
  DecodeGraphs graphs(*model, cache);
  const std::vector<int32_t> tok = {5}, cached = {3}, one = {1}, row = {0}, good = {2}, bad = {99};
  PagedBatch b;
  b.tokens = tok;
  b.num_cached = cached;
  b.num_new = one;
  b.max_blocks_per_seq = 1;
  b.logit_rows = row;
  b.block_table = good;
  ASSERT_TRUE(DecodeGraphs::eligible(b));
  ASSERT_TRUE(graphs.run(b).ok());  // captures
  ASSERT_TRUE(graphs.run(b).ok());  // replays
  b.block_table = bad;
  const auto r = graphs.run(b);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("block"), std::string::npos) << r.status().message();
  EXPECT_EQ(graphs.stats().replays, 1);
}

}  // namespace
}  // namespace kiln
