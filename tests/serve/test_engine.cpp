// The serving engine on a real (tiny, random) model: forward_paged over ragged batches equals
// batch-1 cached decoding (Llama and GPT-2), and the engine's outputs for concurrent requests
// equal batch-1 generation of each prompt under chunked prefill, prefix-cache hits, preemption
// by a tiny KV budget, parallel sampling (n > 1, copy-on-write), static batching and aborts.
#include <gtest/gtest.h>

#include <numeric>

#include "kiln/serve/engine.h"
#include "tests/serve/serve_test_util.h"

namespace kiln {
namespace {

using test::Collected;
using test::drain;
using test::greedy;
using test::reference_generate;
using test::tiny_config;
using test::tiny_model;


class ForwardPaged : public ::testing::TestWithParam<ModelFamily> {};

// Three sequences over two ragged steps (prefill chunks of 20, 5 and 1 tokens; then a decode,
// a 12-token chunk and a 3-token chunk) in shuffled blocks of 8: every row's logits equal the
// batch-1 cached forward's at the same position.
TEST_P(ForwardPaged, RaggedStepsMatchBatchOneCachedLogits) {
  const ModelConfig cfg = tiny_config(GetParam());
  auto model = tiny_model(cfg);
  const int64_t V = cfg.vocab_size, bs = 8, maxb = 6;
  Rng rng(3);
  const std::vector<std::vector<int32_t>> prompts = {test::random_prompt(rng, 21, V), test::random_prompt(rng, 17, V),
                                                     test::random_prompt(rng, 4, V)};
  // Reference logits of every position.
  std::vector<std::vector<float>> ref;
  for (const auto& p : prompts) {
    KVCache cache = model->make_kv_cache(cfg.max_seq_len);
    const float* l = model->forward_cached(p.data(), static_cast<int64_t>(p.size()), cache).value();
    ref.emplace_back(l, l + p.size() * V);
  }
  PagedKvCache kv = model->make_paged_kv_cache(3 * maxb, bs);
  std::vector<int32_t> table(3 * maxb);
  std::iota(table.begin(), table.end(), 0);
  for (size_t i = table.size() - 1; i > 0; --i) std::swap(table[i], table[rng.below(i + 1)]);
  const std::vector<std::vector<int32_t>> steps_cached = {{0, 0, 0}, {20, 5, 1}};
  const std::vector<std::vector<int32_t>> steps_new = {{20, 5, 1}, {1, 12, 3}};
  for (size_t s = 0; s < 2; ++s) {
    std::vector<int32_t> tokens, rows;
    for (size_t i = 0; i < 3; ++i) {
      const auto& p = prompts[i];
      tokens.insert(tokens.end(), p.begin() + steps_cached[s][i], p.begin() + steps_cached[s][i] + steps_new[s][i]);
    }
    rows.resize(tokens.size());
    std::iota(rows.begin(), rows.end(), 0);
    PagedBatch b;
    b.tokens = tokens;
    b.num_cached = steps_cached[s];
    b.num_new = steps_new[s];
    b.block_table = table;
    b.max_blocks_per_seq = maxb;
    b.logit_rows = rows;
    const float* logits = model->forward_paged(b, kv).value();
    int64_t r = 0;
    for (size_t i = 0; i < 3; ++i) {
      for (int32_t t = 0; t < steps_new[s][i]; ++t, ++r) {
        const int64_t pos = steps_cached[s][i] + t;
        for (int64_t v = 0; v < V; ++v)
          ASSERT_NEAR(logits[r * V + v], ref[i][pos * V + v], 2e-4) << "step " << s << " seq " << i << " pos " << pos;
      }
    }
  }
  // Bad input is an error, not a crash.
  std::vector<int32_t> bad_table(maxb, 3 * maxb + 5), tok = {1}, zero = {0}, one = {1}, row = {0};
  PagedBatch b;
  b.tokens = tok;
  b.num_cached = zero;
  b.num_new = one;
  b.block_table = bad_table;
  b.max_blocks_per_seq = maxb;
  b.logit_rows = row;
  EXPECT_FALSE(model->forward_paged(b, kv).ok());
}

INSTANTIATE_TEST_SUITE_P(Families, ForwardPaged, ::testing::Values(ModelFamily::kLlama, ModelFamily::kGpt2),
                         [](const auto& info) { return std::string(family_name(info.param)); });

struct EngineCase {
  ModelFamily family = ModelFamily::kLlama;
  EngineConfig config;
};

std::unique_ptr<Engine> make_engine(const ModelConfig& cfg, EngineConfig ec) {
  auto e = Engine::create(tiny_model(cfg), ec);
  KILN_CHECK_MSG(e.ok(), "{}", e.status().to_string());
  return std::move(e).value();
}

// Concurrent greedy requests under small budgets: chunked prefill (chunk 16, 40 tokens a step),
// then a second wave sharing 48-token prefixes with the first (prefix-cache hits).
TEST(Engine, GreedyMatchesBatchOneWithChunkedPrefillAndPrefixHits) {
  for (ModelFamily fam : {ModelFamily::kLlama, ModelFamily::kGpt2}) {
    const ModelConfig cfg = tiny_config(fam);
    auto ref_model = tiny_model(cfg);
    EngineConfig ec;
    ec.kv_cache_mem_bytes = 64 * 16 * kv_bytes_per_token(cfg, DType::kF32);  // 64 blocks
    ec.scheduler.max_batched_tokens = 40;
    ec.scheduler.prefill_chunk = 16;
    auto engine = make_engine(cfg, ec);
    Rng rng(5);
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t len : {50, 7, 33, 1, 64}) prompts.push_back(test::random_prompt(rng, len, cfg.vocab_size));
    for (int wave = 0; wave < 2; ++wave) {
      std::vector<std::shared_ptr<RequestStream>> streams;
      std::vector<std::vector<int32_t>> sent;
      for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<int32_t> p = prompts[i];
        if (wave == 1) {  // same first 48 tokens as wave 0's prompt (where it has them), new tail
          p.resize(std::min<size_t>(p.size(), 48));
          auto tail = test::random_prompt(rng, 5, cfg.vocab_size);
          p.insert(p.end(), tail.begin(), tail.end());
        }
        sent.push_back(p);
        streams.push_back(engine->add_request(p, greedy(12 + static_cast<int64_t>(i))).value());
      }
      engine->run_until_idle();
      for (size_t i = 0; i < sent.size(); ++i) {
        const Collected c = drain(*streams[i]);
        EXPECT_EQ(c.tokens[0], reference_generate(*ref_model, sent[i], 12 + static_cast<int64_t>(i)))
            << family_name(fam) << " wave " << wave << " request " << i;
        EXPECT_EQ(c.finish[0], FinishReason::kLength);
      }
    }
    const EngineMetrics m = engine->metrics();
    // Wave 1 finds 48 + 32 + 48 tokens cached (the full blocks of the shared 48-, 33- and 48-token heads).
    EXPECT_EQ(m.prefix_hit_tokens, 128) << family_name(fam);
    EXPECT_EQ(m.kv_blocks.num_used, 0);
    EXPECT_EQ(m.requests_finished, 10);
    EXPECT_EQ(m.ttft.count, 10);
  }
}

// A KV budget of 12 blocks of 16 for 4 requests of ~70 tokens each: preemption by recompute,
// same outputs; static batching too.
TEST(Engine, PreemptionAndStaticBatchingKeepOutputs) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto ref_model = tiny_model(cfg);
  Rng rng(9);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t len : {30, 40, 25, 35}) prompts.push_back(test::random_prompt(rng, len, cfg.vocab_size));
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(reference_generate(*ref_model, p, 40));
  for (BatchingMode mode : {BatchingMode::kContinuous, BatchingMode::kStatic, BatchingMode::kClassic}) {
    EngineConfig ec;
    ec.kv_cache_mem_bytes = 12 * 16 * kv_bytes_per_token(cfg, DType::kF32);
    ec.scheduler.batching = mode;
    ec.scheduler.max_running = 3;
    auto engine = make_engine(cfg, ec);
    ASSERT_EQ(engine->num_kv_blocks(), 12);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& p : prompts) streams.push_back(engine->add_request(p, greedy(40)).value());
    engine->run_until_idle();
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(drain(*streams[i]).tokens[0], want[i]) << i;
    if (mode == BatchingMode::kContinuous) {
      EXPECT_GT(engine->metrics().num_preemptions, 0);
    }
    if (mode == BatchingMode::kClassic) {  // whole lengths reserved at admission
      EXPECT_EQ(engine->metrics().num_preemptions, 0);
    }
    EXPECT_EQ(engine->metrics().kv_blocks.num_used, 0);
  }
}

// Classic batching computes the padded rectangle (prompts padded to the longest, finished rows
// kept decoding) and none of it reaches an output: the same greedy tokens as batch-1 decoding,
// and exactly B × (longest prompt + longest output - 1) positions computed per batch.
TEST(Engine, ClassicBatchingPaddingLeavesOutputsAlone) {
  for (ModelFamily family : {ModelFamily::kLlama, ModelFamily::kGpt2}) {
    const ModelConfig cfg = tiny_config(family);
    auto ref_model = tiny_model(cfg);
    Rng rng(21);
    const std::vector<std::pair<int64_t, int64_t>> shape = {{9, 12}, {33, 3}, {17, 7}};
    std::vector<std::vector<int32_t>> prompts, want;
    int64_t own = 0, longest_prompt = 0, longest_output = 0;
    for (auto [len, out] : shape) {
      prompts.push_back(test::random_prompt(rng, len, cfg.vocab_size));
      want.push_back(reference_generate(*ref_model, prompts.back(), out));
      own += len + out - 1;
      longest_prompt = std::max(longest_prompt, len);
      longest_output = std::max(longest_output, out);
    }
    EngineConfig ec;
    ec.scheduler.batching = BatchingMode::kClassic;
    ec.scheduler.max_running = 3;
    auto engine = make_engine(cfg, ec);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = 0; i < prompts.size(); ++i)
      streams.push_back(engine->add_request(prompts[i], greedy(shape[i].second)).value());
    engine->run_until_idle();
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(drain(*streams[i]).tokens[0], want[i]) << i;
    const int64_t rectangle = 3 * (longest_prompt + longest_output - 1);
    EXPECT_EQ(engine->metrics().prompt_tokens, rectangle);
    EXPECT_EQ(engine->metrics().padding_tokens, rectangle - own);
    EXPECT_EQ(engine->metrics().kv_blocks.num_used, 0);
  }
}

// n = 3 samples share the prompt's blocks (the partial last block is copied on write); with
// a seed, sample j draws like batch-1 sampling seeded seed + j; greedy samples all agree.
TEST(Engine, ParallelSamplingSharesPromptAndFollowsSeeds) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto ref_model = tiny_model(cfg);
  auto engine = make_engine(cfg, EngineConfig{});
  Rng rng(13);
  const auto prompt = test::random_prompt(rng, 21, cfg.vocab_size);
  GenerationParams p = greedy(10, 3);
  p.sampling = {1.0f, 20, 0.9f};
  p.seed = 1234;
  auto sampled = engine->add_request(prompt, p).value();
  auto greedy3 = engine->add_request(prompt, greedy(10, 3)).value();
  engine->run_until_idle();
  const Collected c = drain(*sampled);
  for (uint64_t j = 0; j < 3; ++j)
    EXPECT_EQ(c.tokens[j], reference_generate(*ref_model, prompt, 10, p.sampling, 1234 + j)) << "sample " << j;
  const Collected g = drain(*greedy3);
  const auto want = reference_generate(*ref_model, prompt, 10);
  for (const auto& t : g.tokens) EXPECT_EQ(t, want);
  EXPECT_EQ(engine->metrics().kv_blocks.num_used, 0);
}

// Stop tokens end a sample (the token is emitted); finish_sample ends one sample early; abort
// frees a running request's blocks and ends its stream.
TEST(Engine, StopsFinishSampleAndAbort) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto ref_model = tiny_model(cfg);
  auto engine = make_engine(cfg, EngineConfig{});
  Rng rng(17);
  const auto prompt = test::random_prompt(rng, 12, cfg.vocab_size);
  const auto want = reference_generate(*ref_model, prompt, 20);
  GenerationParams stop = greedy(20);
  stop.stop_token_ids = {want[4]};
  auto s1 = engine->add_request(prompt, stop).value();
  auto s2 = engine->add_request(prompt, greedy(20, 2)).value();
  auto s3 = engine->add_request(test::random_prompt(rng, 40, cfg.vocab_size), greedy(100)).value();
  for (int i = 0; i < 3; ++i) engine->step();
  engine->finish_sample(s2->id(), 0);
  engine->abort(s3->id());
  engine->step();
  EXPECT_TRUE(s3->finished());
  engine->run_until_idle();
  const Collected c1 = drain(*s1);
  const auto first_stop = std::find(want.begin(), want.end(), want[4]) - want.begin();
  EXPECT_EQ(c1.tokens[0], std::vector<int32_t>(want.begin(), want.begin() + first_stop + 1));
  EXPECT_EQ(c1.finish[0], FinishReason::kStop);
  const Collected c2 = drain(*s2);
  EXPECT_EQ(c2.finish[0], FinishReason::kStop);
  EXPECT_LT(c2.tokens[0].size(), 20u);
  EXPECT_EQ(c2.tokens[1], want);
  EXPECT_EQ(drain(*s3).finish[0], FinishReason::kAborted);
  EXPECT_EQ(engine->metrics().kv_blocks.num_used, 0);
  EXPECT_EQ(engine->metrics().requests_aborted, 1);
}

// A sample of n > 1 ended early (a stop string) stops computing while its sibling goes on.
TEST(Engine, FinishedSampleStopsComputingBeforeItsSiblings) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto ref_model = tiny_model(cfg);
  auto engine = make_engine(cfg, EngineConfig{});
  Rng rng(19);
  const auto prompt = test::random_prompt(rng, 9, cfg.vocab_size);
  auto s = engine->add_request(prompt, greedy(30, 2)).value();
  for (int i = 0; i < 3; ++i) engine->step();
  EXPECT_EQ(engine->metrics().num_running, 2);
  engine->finish_sample(s->id(), 0);
  engine->step();
  EXPECT_EQ(engine->metrics().num_running, 1);
  engine->run_until_idle();
  const Collected c = drain(*s);
  EXPECT_EQ(c.finish[0], FinishReason::kStop);
  EXPECT_EQ(c.tokens[1], reference_generate(*ref_model, prompt, 30));
  EXPECT_EQ(engine->metrics().kv_blocks.num_used, 0);
}

TEST(Engine, BadRequestsAreErrors) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  EngineConfig ec;
  ec.kv_cache_mem_bytes = 4 * 16 * kv_bytes_per_token(cfg, DType::kF32);  // 64 tokens
  auto engine = make_engine(cfg, ec);
  EXPECT_FALSE(engine->add_request({}, greedy(4)).ok());
  EXPECT_FALSE(engine->add_request({1, 2, 500}, greedy(4)).ok());
  EXPECT_FALSE(engine->add_request({1, 2}, greedy(0)).ok());
  EXPECT_FALSE(engine->add_request({1, 2}, greedy(4, 0)).ok());
  EXPECT_EQ(engine->add_request(std::vector<int32_t>(161, 1), greedy(1)).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(engine->add_request({1, 2}, greedy(159)).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(engine->add_request({1, 2}, greedy(100)).status().code(), StatusCode::kResourceExhausted);
  EngineConfig none;
  none.kv_cache_mem_bytes = 10;
  EXPECT_FALSE(Engine::create(tiny_model(cfg), none).ok());
}

// The background loop serves requests from several threads.
TEST(Engine, BackgroundLoopServesConcurrentThreads) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto ref_model = tiny_model(cfg);
  auto engine = make_engine(cfg, EngineConfig{});
  engine->start();
  Rng rng(21);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(test::random_prompt(rng, 10 + 7 * i, cfg.vocab_size));
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      auto s = engine->add_request(prompts[i], greedy(15)).value();
      std::vector<TokenEvent> ev;
      while (s->wait(ev, std::chrono::milliseconds(100))) {
      }
      for (const auto& e : ev)
        if (e.token >= 0) got[i].push_back(e.token);
    });
  }
  for (auto& t : threads) t.join();
  engine->stop();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], reference_generate(*ref_model, prompts[i], 15)) << i;
  const std::string text = engine->metrics_text();
  EXPECT_NE(text.find("kiln_time_to_first_token_seconds_count 4"), std::string::npos) << text;
  EXPECT_NE(text.find("kiln_generation_tokens_total 60"), std::string::npos) << text;
}

}  // namespace
}  // namespace kiln
