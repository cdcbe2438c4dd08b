// Speculative decoding: greedy output identical to the target alone (tiny random Llamas, several
// γ and drafts), the rejection rule's output distribution equals the target's (chi-square on a
// tiny vocabulary, and the same test rejecting two wrong rules), and tokens per target pass
// against (1 − α^(γ+1))/(1 − α); the same inside the serving engine (`kiln serve --draft-model`):
// greedy outputs equal the target alone under chunked prefill, prefix hits, preemption, n > 1
// and stop tokens, and sampled outputs follow the target's distribution (chi-square).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <tuple>

#include "kiln/core/rng.h"
#include "kiln/serve/sampler.h"
#include "kiln/serve/engine.h"
#include "kiln/serve/speculative.h"
#include "tests/serve/batch1_reference.h"
#include "tests/serve/serve_test_util.h"

namespace kiln {
namespace {

using test::autoregressive_generate;
using test::speculative_generate;

ModelConfig tiny_llama(int64_t layers, int64_t d) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = 64;
  c.d_model = d;
  c.n_layers = layers;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 2 * d;
  c.max_seq_len = 96;
  c.tied_embeddings = false;
  return c;
}

// A random model with weights large enough that its logits are far from uniform.
std::unique_ptr<Transformer> random_model(const ModelConfig& c, uint64_t seed, float scale = 0.3f) {
  auto m = Transformer::create(c, seed).value();
  Rng rng(seed + 100);
  for (float& w : m->params()) w += scale * rng.normal();
  return m;
}

// `base` with every weight nudged: a draft that agrees with it often but not always.
std::unique_ptr<Transformer> perturbed_copy(Transformer& base, const ModelConfig& c, float noise) {
  auto m = Transformer::create(c, 1).value();
  Rng rng(77);
  auto src = base.params();
  auto dst = m->params();
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = src[i] + noise * rng.normal();
  return m;
}

const std::vector<int32_t> kPrompt = {3, 17, 42, 5, 9};

TEST(Speculative, GreedyMatchesTargetAloneForEveryGammaAndDraft) {
  const ModelConfig tc = tiny_llama(2, 32);
  auto target = random_model(tc, 1);
  auto close_draft = perturbed_copy(*target, tc, 0.08f);   // accepts some, rejects some
  auto other_draft = random_model(tiny_llama(1, 16), 2);   // a different, smaller model
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const int64_t n = 60;
  auto ref = autoregressive_generate(*target, kPrompt, n, greedy, 1);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  ASSERT_EQ(static_cast<int64_t>(ref->tokens.size()), n);
  for (Transformer* draft : {close_draft.get(), other_draft.get()}) {
    for (int64_t gamma : {1, 3, 5}) {
      auto r = speculative_generate(*target, *draft, kPrompt, n, gamma, greedy, 1);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(r->tokens, ref->tokens) << "gamma " << gamma << " draft layers " << draft->config().n_layers;
      const SpeculativeStats& s = r->stats;
      EXPECT_EQ(s.num_generated, n);
      EXPECT_LE(s.num_accepted, s.num_proposed);
      // Every pass emits its accepted tokens plus one.
      EXPECT_EQ(s.num_generated, s.num_accepted + s.num_target_passes);
      if (draft == close_draft.get()) {  // both branches of the rule ran
        EXPECT_GT(s.num_accepted, 0) << "gamma " << gamma;
        EXPECT_GT(s.num_rejected, 0) << "gamma " << gamma;
      }
    }
  }
}

TEST(Speculative, DraftEqualToTargetAcceptsEverything) {
  const ModelConfig tc = tiny_llama(2, 32);
  auto target = random_model(tc, 1);
  auto twin = random_model(tc, 1);  // the same seed: the same weights
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams sp;
    sp.temperature = temperature;
    const int64_t gamma = 4, n = 41;  // 8 full passes of 5 tokens, then one of 1
    auto r = speculative_generate(*target, *twin, kPrompt, n, gamma, sp, 3);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(static_cast<int64_t>(r->tokens.size()), n);
    EXPECT_DOUBLE_EQ(r->stats.acceptance_rate(), 1.0) << "temperature " << temperature;
    EXPECT_EQ(r->stats.num_target_passes, 9);
    EXPECT_DOUBLE_EQ(expected_tokens_per_pass(1.0, gamma), 5.0);
  }
}

TEST(Speculative, StopsAtCallbackContextAndRejectsBadInput) {
  const ModelConfig tc = tiny_llama(2, 32);
  auto target = random_model(tc, 1);
  auto draft = perturbed_copy(*target, tc, 0.08f);
  SamplingParams sp;
  sp.temperature = 0.0f;
  int seen = 0;
  auto r = speculative_generate(*target, *draft, kPrompt, 50, 4, sp, 1, [&](int32_t) { return ++seen < 7; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens.size(), 7u);
  // The context (96) bounds the sequence: 5 prompt tokens + at most 91 new ones.
  auto full = speculative_generate(*target, *draft, kPrompt, 1000, 4, sp, 1);
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  EXPECT_EQ(full->tokens.size(), 91u);
  auto ref = autoregressive_generate(*target, kPrompt, 1000, sp, 1);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(full->tokens, ref->tokens);
  auto other_vocab = tiny_llama(1, 16);
  other_vocab.vocab_size = 65;
  auto bad = random_model(other_vocab, 4);
  EXPECT_FALSE(speculative_generate(*target, *bad, kPrompt, 10, 2, sp, 1).ok());
  EXPECT_FALSE(speculative_generate(*target, *draft, {}, 10, 2, sp, 1).ok());
  EXPECT_FALSE(speculative_generate(*target, *draft, kPrompt, 10, 0, sp, 1).ok());
  const std::vector<int32_t> bad_ids = {1, 64};
  EXPECT_FALSE(speculative_generate(*target, *draft, bad_ids, 10, 2, sp, 1).ok());
}

// ---- the rejection rule on fixed rows --------------------------------------------------------

// Regularized upper incomplete gamma Q(a, x) (series below a + 1, Lentz's continued fraction
// above): the p-value of a chi-square statistic x2 with k degrees of freedom is Q(k/2, x2/2).
double upper_gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 1000 && std::fabs(term) > 1e-15 * std::fabs(sum); ++n) sum += term *= x / (a + n);
    return 1.0 - sum * std::exp(log_prefix);
  }
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

double chi_square_p_value(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  const double n = static_cast<double>(std::accumulate(counts.begin(), counts.end(), int64_t{0}));
  double x2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = n * probs[i];
    x2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return upper_gamma_q(0.5 * static_cast<double>(counts.size() - 1), 0.5 * x2);
}

TEST(Speculative, ChiSquarePValueMatchesKnownQuantiles) {
  // Tabulated chi-square critical values: (dof, statistic, upper tail).
  EXPECT_NEAR(upper_gamma_q(2.5, 11.070 / 2), 0.05, 1e-4);    // dof 5
  EXPECT_NEAR(upper_gamma_q(2.5, 25.745 / 2), 1e-4, 2e-6);    // dof 5
  EXPECT_NEAR(upper_gamma_q(17.5, 49.802 / 2), 0.05, 1e-4);   // dof 35
  EXPECT_NEAR(upper_gamma_q(1.0, 3.0), std::exp(-3.0), 1e-12);  // dof 2 is an exponential
}

constexpr int64_t kV = 6;
const std::vector<float> kP = {0.30f, 0.25f, 0.20f, 0.12f, 0.08f, 0.05f};  // target
const std::vector<float> kQ = {0.05f, 0.10f, 0.15f, 0.20f, 0.20f, 0.30f};  // draft
constexpr double kPValue = 1e-4;  // reject "distributed as p" below this

// γ copies of a row, then one more for p: the rows of a context-free model.
std::vector<float> repeat_rows(const std::vector<float>& row, int64_t n) {
  std::vector<float> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), row.begin(), row.end());
  return out;
}

enum class Rule { kExact, kDraftUnconditional, kResampleFromP };

// One verification pass with draft tokens drawn from q; returns the emitted tokens. The two
// wrong rules show that the statistical test below can fail.
std::vector<int32_t> one_pass(int64_t gamma, Rule rule, Rng& rng) {
  std::vector<int32_t> draft;
  for (int64_t i = 0; i < gamma; ++i) draft.push_back(sample_from_probs(kQ.data(), kV, rng));
  if (rule == Rule::kDraftUnconditional) return draft;
  const std::vector<float> q = repeat_rows(kQ, gamma), p = repeat_rows(kP, gamma + 1);
  SpeculativeVerdict v;
  if (rule == Rule::kExact) {
    v = verify_draft(draft, q.data(), p.data(), kV, false, rng);
  } else {  // wrong: on rejection draw from p instead of norm(max(0, p − q))
    while (v.num_accepted < gamma) {
      const int32_t x = draft[static_cast<size_t>(v.num_accepted)];
      if (rng.uniform() >= std::min(1.0f, kP[x] / kQ[x])) break;
      ++v.num_accepted;
    }
    v.next_token = sample_from_probs(kP.data(), kV, rng);
  }
  std::vector<int32_t> out(draft.begin(), draft.begin() + v.num_accepted);
  out.push_back(v.next_token);
  return out;
}

// p-value of "the first emitted token is distributed as p" over `trials` passes.
double first_token_p_value(int64_t gamma, Rule rule, int64_t trials) {
  Rng rng(12345);
  std::vector<int64_t> counts(kV, 0);
  for (int64_t t = 0; t < trials; ++t) ++counts[one_pass(gamma, rule, rng)[0]];
  return chi_square_p_value(counts, std::vector<double>(kP.begin(), kP.end()));
}

TEST(Speculative, SampledFirstTokenIsDistributedAsTarget) {
  const int64_t trials = 20000;
  for (int64_t gamma : {1, 3}) {
    EXPECT_GT(first_token_p_value(gamma, Rule::kExact, trials), kPValue) << "gamma " << gamma;
    // The same test catches emitting draft tokens unconditionally, and the subtler bug of
    // resampling from p (not the residual) after a rejection.
    EXPECT_LT(first_token_p_value(gamma, Rule::kDraftUnconditional, trials), kPValue) << "gamma " << gamma;
    EXPECT_LT(first_token_p_value(gamma, Rule::kResampleFromP, trials), kPValue) << "gamma " << gamma;
  }
}

TEST(Speculative, SampledTokenPairsAreIndependentDrawsFromTarget) {
  // With the same rows at every position the target alone emits i.i.d. draws from p, so the
  // first two emitted tokens (one pass or two) must follow p ⊗ p: 36 cells, 35 dof.
  Rng rng(777);
  const int64_t trials = 40000, gamma = 2;
  std::vector<int64_t> counts(kV * kV, 0);
  for (int64_t t = 0; t < trials; ++t) {
    std::vector<int32_t> seq = one_pass(gamma, Rule::kExact, rng);
    if (seq.size() < 2) {
      const std::vector<int32_t> more = one_pass(gamma, Rule::kExact, rng);
      seq.insert(seq.end(), more.begin(), more.end());
    }
    ++counts[seq[0] * kV + seq[1]];
  }
  std::vector<double> pp;
  for (int64_t a = 0; a < kV; ++a)
    for (int64_t b = 0; b < kV; ++b) pp.push_back(static_cast<double>(kP[a]) * kP[b]);
  EXPECT_GT(chi_square_p_value(counts, pp), kPValue);
}

TEST(Speculative, GreedyRuleAndEdgeRows) {
  Rng rng(1);
  const std::vector<float> q = repeat_rows(kQ, 3), p = repeat_rows(kP, 4);
  // Greedy: argmax p is token 0 everywhere.
  SpeculativeVerdict v = verify_draft(std::vector<int32_t>{0, 0, 3}, q.data(), p.data(), kV, true, rng);
  EXPECT_EQ(v.num_accepted, 2);
  EXPECT_EQ(v.next_token, 0);
  v = verify_draft(std::vector<int32_t>{0, 0, 0}, q.data(), p.data(), kV, true, rng);
  EXPECT_EQ(v.num_accepted, 3);
  EXPECT_EQ(v.next_token, 0);
  // p == q: always accepted. Disjoint supports: always rejected, the correction drawn from p.
  const std::vector<float> same = repeat_rows(kP, 4);
  const std::vector<float> left = repeat_rows({0.5f, 0.5f, 0, 0, 0, 0}, 3), right = repeat_rows({0, 0, 0, 0.5f, 0.5f, 0}, 4);
  for (int trial = 0; trial < 200; ++trial) {
    v = verify_draft(std::vector<int32_t>{1, 2, 3}, same.data(), same.data(), kV, false, rng);
    EXPECT_EQ(v.num_accepted, 3);
    v = verify_draft(std::vector<int32_t>{static_cast<int32_t>(trial % 2), 0, 1}, left.data(), right.data(), kV, false, rng);
    EXPECT_EQ(v.num_accepted, 0);
    EXPECT_TRUE(v.next_token == 3 || v.next_token == 4) << v.next_token;
  }
}

TEST(Speculative, TokensPerPassFollowTheAlphaFormula) {
  // Context-free rows: every draft token is accepted independently with probability
  // β = Σ_t min(p_t, q_t), so tokens per pass should be (1 − β^(γ+1))/(1 − β), and the
  // measured α (accepted / tested) should estimate β.
  double beta = 0;
  for (int64_t t = 0; t < kV; ++t) beta += std::min(kP[t], kQ[t]);
  Rng rng(99);
  for (int64_t gamma : {1, 3, 5}) {
    const int64_t passes = 20000;
    SpeculativeStats s;
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < passes; ++i) {
      const std::vector<int32_t> out = one_pass(gamma, Rule::kExact, rng);
      const double k = static_cast<double>(out.size());
      sum += k;
      sum_sq += k * k;
      s.num_accepted += static_cast<int64_t>(out.size()) - 1;
      s.num_rejected += static_cast<int64_t>(out.size()) - 1 < gamma ? 1 : 0;
      s.num_proposed += gamma;
      s.num_generated += static_cast<int64_t>(out.size());
      ++s.num_target_passes;
    }
    const double mean = sum / passes, sd = std::sqrt(sum_sq / passes - mean * mean);
    const double tol = 5 * sd / std::sqrt(static_cast<double>(passes));  // 5 standard errors
    EXPECT_NEAR(s.tokens_per_pass(), mean, 1e-12);
    EXPECT_NEAR(mean, expected_tokens_per_pass(beta, gamma), tol) << "gamma " << gamma;
    EXPECT_NEAR(s.acceptance_rate(), beta, 0.02) << "gamma " << gamma;
    EXPECT_NEAR(expected_tokens_per_pass(s.acceptance_rate(), gamma), mean, 0.05 * mean) << "gamma " << gamma;
    if (gamma > 1) {
      EXPECT_LT(s.accepted_fraction(), s.acceptance_rate() - 0.05);  // not the formula's α
    }
  }
}

TEST(Sampler, DistributionMatchesSampleToken) {
  // sampling_distribution's row is what sample_token draws from: same support, frequencies.
  const std::vector<float> logits = {1.0f, 3.0f, 0.5f, 2.5f, -1.0f, 2.9f, 0.0f};
  const int64_t V = static_cast<int64_t>(logits.size());
  for (SamplingParams sp : {SamplingParams{0.7f, 0, 1.0f}, SamplingParams{1.0f, 3, 1.0f}, SamplingParams{1.3f, 0, 0.8f},
                            SamplingParams{0.0f, 0, 1.0f}}) {
    std::vector<float> probs(V);
    sampling_distribution(logits.data(), V, sp, probs.data());
    EXPECT_NEAR(std::accumulate(probs.begin(), probs.end(), 0.0), 1.0, 1e-6);
    Rng rng(5);
    std::vector<int64_t> counts(V, 0);
    const int64_t n = 20000;
    for (int64_t i = 0; i < n; ++i) ++counts[sample_token(logits.data(), V, sp, rng)];
    std::vector<int64_t> c;
    std::vector<double> pr;
    for (int64_t t = 0; t < V; ++t) {
      if (probs[t] == 0.0f) {
        EXPECT_EQ(counts[t], 0) << "token " << t << " temperature " << sp.temperature;
      } else {
        c.push_back(counts[t]);
        pr.push_back(probs[t]);
      }
    }
    if (c.size() > 1) {
      EXPECT_GT(chi_square_p_value(c, pr), kPValue) << "temperature " << sp.temperature;
    }
  }
}

// ---- speculative decoding inside the serving engine ----------------------------------------

// test::tiny_model's weights plus N(0, noise): a draft that agrees with it often, not always.
std::unique_ptr<Transformer> noisy_twin(const ModelConfig& c, float noise) {
  auto m = test::tiny_model(c);
  Rng rng(4242);
  for (float& w : m->params()) w += noise * rng.normal();
  return m;
}

// Two waves of concurrent greedy requests (the second shares 48-token prefixes with the
// first) under chunked prefill and a KV budget small enough to preempt, with n = 2 and a stop
// token among them: every output equals batch-1 generation by the target alone, for a close
// draft (accepts and rejects) and an identical one (accepts everything), γ = 1 and 3.
TEST(SpeculativeEngine, GreedyOutputsEqualTargetAlone) {
  const ModelConfig cfg = test::tiny_config(ModelFamily::kLlama);
  auto ref_model = test::tiny_model(cfg);
  Rng rng(21);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t len : {50, 7, 33, 1, 64}) prompts.push_back(test::random_prompt(rng, len, cfg.vocab_size));
  const int64_t max_tokens = 37;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(test::reference_generate(*ref_model, p, max_tokens));
  int64_t passes_always = 0;  // verifications with draft noise 0.05, γ = 3, no batch limit
  // (draft noise, γ, speculate while at most this many decode; 0: always)
  for (auto [noise, gamma, max_batch] : {std::tuple{0.05f, 1, 0}, std::tuple{0.05f, 3, 0}, std::tuple{0.0f, 1, 0},
                                         std::tuple{0.0f, 3, 0}, std::tuple{0.05f, 3, 2}}) {
    {
      EngineConfig ec;
      ec.num_speculative = gamma;
      ec.speculative_max_batch = max_batch;
      // 24 blocks of 16 for target + draft: five ~90-token requests must preempt.
      ec.kv_cache_mem_bytes = 24 * 16 * 2 * kv_bytes_per_token(cfg, DType::kF32);
      ec.scheduler.max_batched_tokens = 40;
      ec.scheduler.prefill_chunk = 16;
      auto engine = Engine::create(test::tiny_model(cfg), ec, noisy_twin(cfg, noise)).value();
      ASSERT_EQ(engine->num_kv_blocks(), 24);
      for (int wave = 0; wave < 2; ++wave) {
        std::vector<std::shared_ptr<RequestStream>> streams;
        std::vector<std::vector<int32_t>> sent;
        for (size_t i = 0; i < prompts.size(); ++i) {
          std::vector<int32_t> p = prompts[i];
          if (wave == 1 && p.size() > 48) p[p.size() - 1] = (p.back() + 1) % static_cast<int32_t>(cfg.vocab_size);
          sent.push_back(p);
          streams.push_back(engine->add_request(p, test::greedy(max_tokens, i == 2 ? 2 : 1)).value());
        }
        engine->run_until_idle();
        for (size_t i = 0; i < prompts.size(); ++i) {
          const auto expect = wave == 0 ? want[i] : test::reference_generate(*ref_model, sent[i], max_tokens);
          for (const auto& got : test::drain(*streams[i]).tokens)
            EXPECT_EQ(got, expect) << "noise " << noise << " gamma " << gamma << " wave " << wave << " request " << i;
        }
      }
      // A stop token inside an accepted run of draft tokens ends the output right there.
      GenerationParams stop = test::greedy(max_tokens);
      stop.stop_token_ids = {want[0][10]};
      auto s = engine->add_request(prompts[0], stop).value();
      engine->run_until_idle();
      const auto first = std::find(want[0].begin(), want[0].end(), want[0][10]);
      const test::Collected c = test::drain(*s);
      EXPECT_EQ(c.tokens[0], std::vector<int32_t>(want[0].begin(), first + 1));
      EXPECT_EQ(c.finish[0], FinishReason::kStop);

      const EngineMetrics m = engine->metrics();
      EXPECT_EQ(m.kv_blocks.num_used, 0);
      EXPECT_GT(m.num_preemptions, 0);
      EXPECT_GT(m.prefix_hit_tokens, 0);
      EXPECT_EQ(m.num_speculative, gamma);
      EXPECT_GT(m.spec.num_target_passes, 0);
      EXPECT_EQ(m.spec.num_generated, m.spec.num_accepted + m.spec.num_target_passes);
      if (noise > 0.0f && gamma == 3 && max_batch == 0) passes_always = m.spec.num_target_passes;
      if (noise == 0.0f) {
        EXPECT_EQ(m.spec.num_rejected, 0) << "gamma " << gamma;
        EXPECT_GT(m.spec.tokens_per_pass(), 1.0 + 0.8 * gamma) << "gamma " << gamma;
      } else if (max_batch > 0) {  // speculating only in the steps with at most 2 decodes
        EXPECT_GT(m.spec.num_target_passes, 0);
        EXPECT_LT(m.spec.num_target_passes, passes_always);
      } else {
        EXPECT_GT(m.spec.num_accepted, 0) << "gamma " << gamma;
        EXPECT_GT(m.spec.num_rejected, 0) << "gamma " << gamma;
      }
      const std::string text = engine->metrics_text();
      EXPECT_NE(text.find("kiln_spec_decode_acceptance_rate"), std::string::npos);
      EXPECT_NE(text.find("kiln_spec_decode_expected_tokens_per_pass"), std::string::npos);
    }
  }
}

// Sampling at temperature 1 through the engine with a draft unlike the target: the first
// speculative token (the second output) of 64 × 300 samples, paired with the first, follows
// the target's joint p(t1) p(t2 | t1) over a vocabulary of 8 (64 cells), and not the draft's.
TEST(SpeculativeEngine, SampledOutputsFollowTheTargetDistribution) {
  ModelConfig c = tiny_llama(1, 16);
  c.vocab_size = 8;
  auto target = random_model(c, 11, 0.6f);
  auto draft = random_model(c, 12, 0.6f);
  const int64_t V = c.vocab_size;
  const std::vector<int32_t> prompt = {1, 5, 2};
  SamplingParams sp;
  sp.temperature = 1.0f;
  // Exact joint distributions of the first two tokens under either model alone.
  auto joint = [&](Transformer& m) {
    std::vector<double> pr(static_cast<size_t>(V * V));
    std::vector<float> p1(static_cast<size_t>(V)), p2(static_cast<size_t>(V));
    KVCache cache = m.make_kv_cache(c.max_seq_len);
    const float* l = m.forward_cached(prompt.data(), 3, cache).value();
    sampling_distribution(l + 2 * V, V, sp, p1.data());
    for (int32_t a = 0; a < V; ++a) {
      KVCache ca = m.make_kv_cache(c.max_seq_len);
      std::vector<int32_t> pa = prompt;
      pa.push_back(a);
      const float* la = m.forward_cached(pa.data(), 4, ca).value();
      sampling_distribution(la + 3 * V, V, sp, p2.data());
      for (int32_t b = 0; b < V; ++b) pr[static_cast<size_t>(a * V + b)] = double(p1[a]) * p2[b];
    }
    return pr;
  };
  const std::vector<double> want = joint(*target), draft_joint = joint(*draft);
  EngineConfig ec;
  ec.num_speculative = 3;
  ec.scheduler.max_running = 512;
  ec.speculative_max_batch = 0;
  ec.kv_cache_mem_bytes = int64_t{64} << 20;
  auto engine = Engine::create(std::move(target), ec, std::move(draft)).value();
  std::vector<std::shared_ptr<RequestStream>> streams;
  GenerationParams p;
  p.n = 64;
  p.max_tokens = 5;  // the second step verifies 3 draft tokens
  p.sampling = sp;
  for (uint64_t r = 0; r < 300; ++r) {
    p.seed = 1000 * (r + 1);
    streams.push_back(engine->add_request(prompt, p).value());
  }
  engine->run_until_idle();
  std::vector<int64_t> counts(static_cast<size_t>(V * V), 0);
  for (auto& s : streams)
    for (const auto& t : test::drain(*s).tokens) {
      ASSERT_EQ(t.size(), 5u);
      ++counts[static_cast<size_t>(t[0] * V + t[1])];
    }
  EXPECT_GT(chi_square_p_value(counts, want), kPValue);
  EXPECT_LT(chi_square_p_value(counts, draft_joint), kPValue);  // the test can tell them apart
  const EngineMetrics m = engine->metrics();
  EXPECT_GT(m.spec.num_rejected, 0);
  EXPECT_GT(m.spec.num_accepted, 0);
  EXPECT_EQ(m.kv_blocks.num_used, 0);
}

// Bad combinations are errors naming what is wrong.
TEST(SpeculativeEngine, DraftWithAnotherVocabularyOrBadGammaIsAnError) {
  const ModelConfig cfg = test::tiny_config(ModelFamily::kLlama);
  auto other = test::tiny_config(ModelFamily::kLlama, 50);
  auto r = Engine::create(test::tiny_model(cfg), EngineConfig{}, test::tiny_model(other));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("vocabulary"), std::string::npos) << r.status().message();
  EngineConfig bad;
  bad.num_speculative = 0;
  r = Engine::create(test::tiny_model(cfg), bad, test::tiny_model(cfg));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--num-speculative"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kiln
