// OpenAI's logit adjustments and logprobs against scalar references: adjust_logits against the
// penalty formula in double, token_logprobs against a double log-softmax over the whole
// vocabulary; through the engine, penalized greedy decoding against a batch-1 loop that applies
// the formula by hand (plain and speculative), sampled tokens' logprobs against the cached
// forward's logits, and echo's prompt logprobs against the model's own per-token loss
// (Transformer::forward, what `kiln eval` runs) under chunked prefill and a warm prefix cache.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "kiln/serve/engine.h"
#include "kiln/serve/sampler.h"
#include "tests/serve/serve_test_util.h"

namespace kiln {
namespace {

using test::tiny_config;
using test::tiny_model;

// The scalar references, in double.
std::vector<double> ref_adjust(const std::vector<float>& logits, const LogitAdjust& a, const std::vector<int32_t>& hist) {
  std::vector<double> out(logits.begin(), logits.end());
  std::map<int32_t, int64_t> count;
  for (int32_t t : hist) ++count[t];
  for (const auto& [id, b] : a.logit_bias) out[static_cast<size_t>(id)] += b;
  for (const auto& [t, c] : count)
    out[static_cast<size_t>(t)] -= double(c) * a.frequency_penalty + (c > 0 ? a.presence_penalty : 0.0);
  return out;
}
std::vector<double> ref_log_softmax(const float* logits, int64_t V) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(logits[i]));
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(double(logits[i]) - mx);
  std::vector<double> out(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) out[static_cast<size_t>(i)] = double(logits[i]) - mx - std::log(s);
  return out;
}

TEST(Sampler, AdjustLogitsMatchesThePenaltyFormula) {
  Rng rng(11);
  const int64_t V = 97;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(V);
    rng.fill_normal(logits, 0.0f, 3.0f);
    LogitAdjust a;
    a.frequency_penalty = float(rng.uniform() * 4 - 2);
    a.presence_penalty = float(rng.uniform() * 4 - 2);
    for (int i = 0; i < 5; ++i) a.logit_bias.emplace_back(static_cast<int32_t>(10 * i + trial % 7), float(rng.uniform() * 200 - 100));
    std::vector<int32_t> hist;
    for (int i = 0; i < trial * 3; ++i) hist.push_back(static_cast<int32_t>(rng.below(12)));  // repeats
    std::vector<float> out(V);
    adjust_logits(logits.data(), V, a, hist, out.data());
    const std::vector<double> ref = ref_adjust(logits, a, hist);
    for (int64_t i = 0; i < V; ++i) ASSERT_NEAR(out[i], ref[i], 1e-4 * (1 + std::abs(ref[i]))) << "trial " << trial << " id " << i;
    // In place gives the same.
    adjust_logits(logits.data(), V, a, hist, logits.data());
    EXPECT_EQ(logits, out);
  }
}

TEST(Sampler, TokenLogprobsAreTheFullVocabularyLogSoftmax) {
  Rng rng(5);
  for (const int64_t V : {1, 2, 7, 97, 5000}) {
    std::vector<float> logits(static_cast<size_t>(V));
    rng.fill_normal(logits, 0.0f, 8.0f);
    if (V > 3) logits[2] = logits[1];  // a tie: the lower id first
    const std::vector<double> ref = ref_log_softmax(logits.data(), V);
    std::vector<size_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return logits[x] > logits[y]; });
    for (int64_t t = 0; t < V; t += std::max<int64_t>(1, V / 13)) {
      std::vector<TokenLogprob> top;
      const float lp = token_logprobs(logits.data(), V, static_cast<int32_t>(t), 20, &top);
      EXPECT_NEAR(lp, ref[static_cast<size_t>(t)], 1e-5 * (1 + std::abs(ref[static_cast<size_t>(t)])));
      ASSERT_EQ(static_cast<int64_t>(top.size()), std::min<int64_t>(20, V));
      for (size_t i = 0; i < top.size(); ++i) {
        EXPECT_EQ(top[i].token, static_cast<int32_t>(order[i])) << "V " << V << " rank " << i;
        EXPECT_NEAR(top[i].logprob, ref[order[i]], 1e-5 * (1 + std::abs(ref[order[i]])));
      }
    }
    std::vector<TokenLogprob> none;
    token_logprobs(logits.data(), V, 0, 0, &none);
    EXPECT_TRUE(none.empty());
  }
}

// Greedy decoding of `prompt` through forward_cached with the adjustments applied by hand.
std::vector<int32_t> reference_adjusted_greedy(Transformer& m, const std::vector<int32_t>& prompt, int64_t max_tokens,
                                               const LogitAdjust& a) {
  const int64_t V = m.config().vocab_size;
  KVCache cache = m.make_kv_cache(m.config().max_seq_len);
  const float* l = m.forward_cached(prompt.data(), static_cast<int64_t>(prompt.size()), cache).value();
  std::vector<float> last(l + (prompt.size() - 1) * V, l + prompt.size() * V);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < max_tokens; ++i) {
    const std::vector<double> adj = ref_adjust(last, a, out);
    const auto t = static_cast<int32_t>(std::max_element(adj.begin(), adj.end()) - adj.begin());
    out.push_back(t);
    if (i + 1 == max_tokens) break;
    const float* n = m.forward_cached(&t, 1, cache).value();
    last.assign(n, n + V);
  }
  return out;
}

std::unique_ptr<Engine> make_engine(const ModelConfig& cfg, EngineConfig ec = {}, bool draft = false) {
  ec.kv_cache_mem_bytes = 64 * 16 * kv_bytes_per_token(cfg, DType::kF32) * (draft ? 2 : 1);
  ec.block_size = 8;
  ec.scheduler.max_batched_tokens = 64;
  ec.scheduler.prefill_chunk = 8;  // every prompt below prefills in several chunks
  // The draft is the target itself: it proposes the target's own (adjusted) greedy tokens, so
  // every draft token is accepted and each verification row's penalties count the ones before.
  auto e = Engine::create(tiny_model(cfg), ec, draft ? tiny_model(cfg) : nullptr);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

// All events of a finished request.
std::vector<TokenEvent> events_of(RequestStream& s) {
  std::vector<TokenEvent> ev;
  while (s.wait(ev, std::chrono::milliseconds(0))) {
  }
  return ev;
}

TEST(EngineAdjust, PenaltiesAndBiasMatchTheFormulaPlainAndSpeculative) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto ref = tiny_model(cfg);
  Rng rng(21);
  const std::vector<int32_t> prompt = test::random_prompt(rng, 13, cfg.vocab_size);
  std::vector<LogitAdjust> cases(4);
  cases[0].presence_penalty = 2.0f;
  cases[1].frequency_penalty = 1.5f;
  cases[2].frequency_penalty = -0.7f;
  cases[2].presence_penalty = 0.9f;
  cases[2].logit_bias = {{5, 3.0f}, {6, -100.0f}};
  cases[3].logit_bias = {{42, 100.0f}};  // forces token 42
  const std::vector<int32_t> plain = test::reference_generate(*ref, prompt, 24);
  for (const bool speculative : {false, true}) {
    auto engine = make_engine(cfg, EngineConfig{}, speculative);
    for (size_t c = 0; c < cases.size(); ++c) {
      GenerationParams p = test::greedy(24);
      p.adjust = cases[c];
      auto s = engine->add_request(prompt, p).value();
      engine->run_until_idle();
      const test::Collected got = test::drain(*s);
      const std::vector<int32_t> want = reference_adjusted_greedy(*ref, prompt, 24, cases[c]);
      EXPECT_EQ(got.tokens[0], want) << "case " << c << (speculative ? " speculative" : "");
      EXPECT_NE(want, plain) << "case " << c << " changes nothing: a weak test";
    }
    if (speculative) {
      EXPECT_GT(engine->metrics().spec.num_accepted, 50) << "few draft tokens verified: a weak test";
    }
    EXPECT_EQ(test::drain(*[&] {
                auto s = engine->add_request(prompt, test::greedy(24)).value();
                engine->run_until_idle();
                return s;
              }()).tokens[0],
              plain);
  }
  EXPECT_EQ(reference_adjusted_greedy(*ref, prompt, 24, cases[3]), std::vector<int32_t>(24, 42));
}

TEST(EngineLogprobs, SampledTokensReportTheRawLogSoftmax) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto ref = tiny_model(cfg);
  auto engine = make_engine(cfg);
  Rng rng(4);
  const std::vector<int32_t> prompt = test::random_prompt(rng, 19, cfg.vocab_size);
  const int64_t V = cfg.vocab_size;
  GenerationParams p = test::greedy(10);
  p.num_logprobs = 3;
  p.adjust.presence_penalty = 1.0f;  // sampling sees adjusted logits; the logprobs are the raw model's
  p.sampling.temperature = 0.7f;
  p.seed = 3;
  auto s = engine->add_request(prompt, p).value();
  engine->run_until_idle();
  std::vector<int32_t> toks;
  std::vector<TokenEvent> evs;
  for (TokenEvent& e : events_of(*s))
    if (e.token >= 0) evs.push_back(e);
  ASSERT_EQ(evs.size(), 10u);
  // Reference: the cached forward over prompt + the sampled tokens.
  std::vector<int32_t> all = prompt;
  for (const TokenEvent& e : evs) all.push_back(e.token);
  KVCache cache = ref->make_kv_cache(cfg.max_seq_len);
  const float* l = ref->forward_cached(all.data(), static_cast<int64_t>(all.size()), cache).value();
  for (size_t i = 0; i < evs.size(); ++i) {
    ASSERT_TRUE(evs[i].logprobs.has_value()) << i;
    const float* row = l + (prompt.size() - 1 + i) * V;
    const std::vector<double> want = ref_log_softmax(row, V);
    EXPECT_NEAR(evs[i].logprobs->logprob, want[static_cast<size_t>(evs[i].token)], 1e-3) << "token " << i;
    ASSERT_EQ(evs[i].logprobs->top.size(), 3u);
    const double best = *std::max_element(want.begin(), want.end());
    EXPECT_NEAR(evs[i].logprobs->top[0].logprob, best, 1e-3);
    EXPECT_GE(evs[i].logprobs->top[0].logprob, evs[i].logprobs->top[1].logprob);
    EXPECT_GE(evs[i].logprobs->top[1].logprob, evs[i].logprobs->top[2].logprob);
  }
  // Without the request: no logprobs.
  auto s2 = engine->add_request(prompt, test::greedy(3)).value();
  engine->run_until_idle();
  for (const TokenEvent& e : events_of(*s2)) EXPECT_FALSE(e.logprobs.has_value());
}

// Echo's prompt logprobs are the model's own per-token loss: log p(prompt[t] | prompt[<t]) from
// Transformer::forward (kiln eval's path), whose mean over the targets is the loss it returns.
TEST(EngineLogprobs, PromptLogprobsEqualThePerTokenLossDespiteChunksAndPrefixCache) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto ref = tiny_model(cfg);
  auto engine = make_engine(cfg);
  const int64_t V = cfg.vocab_size;
  Rng rng(8);
  const std::vector<int32_t> prompt = test::random_prompt(rng, 37, V);  // 5 chunks of 8
  const auto T = static_cast<int64_t>(prompt.size());
  std::vector<int32_t> targets(prompt.begin() + 1, prompt.end());
  targets.push_back(-1);
  const float loss = ref->forward(prompt.data(), targets.data(), 1, T).value();
  const float* logits = ref->logits();
  // Warm the prefix cache with the same prompt: the echo request must not take its blocks.
  auto warm = engine->add_request(prompt, test::greedy(2)).value();
  engine->run_until_idle();
  const int64_t hits_before = engine->metrics().prefix_hit_tokens;
  auto warm2 = engine->add_request(prompt, test::greedy(2)).value();
  engine->run_until_idle();
  ASSERT_GT(engine->metrics().prefix_hit_tokens, hits_before) << "the prefix cache is not warm: a weak test";
  GenerationParams p = test::greedy(3);
  p.num_logprobs = 2;
  p.prompt_logprobs = true;
  p.n = 2;
  auto s = engine->add_request(prompt, p).value();
  engine->run_until_idle();
  const int64_t hits_after_echo = engine->metrics().prefix_hit_tokens;
  const std::vector<LogprobEntry> lp = s->prompt_logprobs();
  ASSERT_EQ(static_cast<int64_t>(lp.size()), T);
  double sum = 0;
  for (int64_t t = 1; t < T; ++t) {
    const std::vector<double> want = ref_log_softmax(logits + (t - 1) * V, V);
    EXPECT_NEAR(lp[static_cast<size_t>(t)].logprob, want[static_cast<size_t>(prompt[static_cast<size_t>(t)])], 1e-3)
        << "position " << t;
    ASSERT_EQ(lp[static_cast<size_t>(t)].top.size(), 2u);
    sum += lp[static_cast<size_t>(t)].logprob;
  }
  EXPECT_NEAR(-sum / double(T - 1), loss, 1e-4);
  EXPECT_EQ(hits_after_echo, engine->metrics().prefix_hit_tokens);
  // Its samples are the greedy tokens of the same prompt without echo.
  const test::Collected got = test::drain(*s), plain = test::drain(*warm);
  ASSERT_EQ(got.tokens.size(), 2u);
  ASSERT_EQ(plain.tokens[0].size(), 2u);
  for (const auto& t : got.tokens) EXPECT_EQ(std::vector<int32_t>(t.begin(), t.begin() + 2), plain.tokens[0]);
}

TEST(EngineLogprobs, EdgeValuesAreErrorsAndTheEngineKeepsServing) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto engine = make_engine(cfg);
  const std::vector<int32_t> prompt = {1, 2, 3};
  for (const int64_t m : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 2,
                          std::numeric_limits<int64_t>::min(), int64_t{0}}) {
    GenerationParams p = test::greedy(m);
    EXPECT_FALSE(engine->add_request(prompt, p).ok()) << m;
  }
  GenerationParams p = test::greedy(2);
  p.num_logprobs = 21;
  EXPECT_FALSE(engine->add_request(prompt, p).ok());
  p.num_logprobs = -1;
  p.prompt_logprobs = true;
  EXPECT_FALSE(engine->add_request(prompt, p).ok());
  p = test::greedy(2);
  p.adjust.logit_bias = {{static_cast<int32_t>(cfg.vocab_size), 1.0f}};
  EXPECT_FALSE(engine->add_request(prompt, p).ok());
  p.adjust.logit_bias = {{0, std::numeric_limits<float>::quiet_NaN()}};
  EXPECT_FALSE(engine->add_request(prompt, p).ok());
  p.adjust.logit_bias.clear();
  p.adjust.frequency_penalty = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(engine->add_request(prompt, p).ok());
  // The engine still serves.
  auto s = engine->add_request(prompt, test::greedy(4)).value();
  engine->run_until_idle();
  EXPECT_EQ(test::drain(*s).tokens[0].size(), 4u);
}

}  // namespace
}  // namespace kiln
