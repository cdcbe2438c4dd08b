// Shared by the engine and server tests: a tiny random model whose logits are far from ties
// (so greedy decoding is robust to summation order), and batch-1 reference generation through
// Transformer::forward_cached (what `kiln generate` runs).
#pragma once

#include <memory>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/model/transformer.h"
#include "kiln/serve/engine.h"
#include "kiln/serve/sampler.h"

namespace kiln::test {

inline ModelConfig tiny_config(ModelFamily family, int64_t vocab = 97, int64_t context = 160) {
  ModelConfig c;
  c.family = family;
  c.vocab_size = vocab;
  c.d_model = 48;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = family == ModelFamily::kLlama ? 2 : 4;
  c.d_ff = 96;
  c.max_seq_len = context;
  return c;
}

// Weights N(0, 0.3) (norms 1): logits spread over several units instead of the 0.02 init's
// near-uniform ones.
inline std::unique_ptr<Transformer> tiny_model(const ModelConfig& c, uint64_t seed = 7) {
  auto m = std::move(Transformer::create(c, seed)).value();
  Rng rng(seed + 1);
  for (const ParamEntry& e : m->param_entries()) {
    if (e.shape.rank() != 2) continue;
    std::span<float> w(m->params().data() + e.offset, static_cast<size_t>(e.shape.numel()));
    rng.fill_normal(w, 0.0f, 0.3f);
  }
  return m;
}

// Batch-1 generation: prefill the prompt, then one token per forward_cached step; stops after
// max_tokens or a stop token (included).
inline std::vector<int32_t> reference_generate(Transformer& m, const std::vector<int32_t>& prompt, int64_t max_tokens,
                                               const SamplingParams& sp = {0.0f, 0, 1.0f}, uint64_t seed = 0,
                                               const std::vector<int32_t>& stop = {}) {
  const int64_t V = m.config().vocab_size, n = static_cast<int64_t>(prompt.size());
  KVCache cache = m.make_kv_cache(m.config().max_seq_len);
  const float* logits = m.forward_cached(prompt.data(), n, cache).value();
  std::vector<float> last(logits + (n - 1) * V, logits + n * V);
  Rng rng(seed);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < max_tokens; ++i) {
    const int32_t t = sample_token(last.data(), V, sp, rng);
    out.push_back(t);
    if (i + 1 == max_tokens || std::find(stop.begin(), stop.end(), t) != stop.end()) break;
    const float* l = m.forward_cached(&t, 1, cache).value();
    last.assign(l, l + V);
  }
  return out;
}

inline std::vector<int32_t> random_prompt(Rng& rng, int64_t len, int64_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return p;
}

// Greedy decoding of max_tokens tokens, n samples.
inline GenerationParams greedy(int64_t max_tokens, int64_t n = 1) {
  GenerationParams p;
  p.max_tokens = max_tokens;
  p.n = n;
  p.sampling.temperature = 0.0f;
  return p;
}

// Every output of an engine request so far: per sample index, its tokens, and how it ended.
struct Collected {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<FinishReason> finish;
};

inline Collected drain(RequestStream& s) {
  Collected c;
  c.tokens.resize(static_cast<size_t>(s.n()));
  c.finish.assign(static_cast<size_t>(s.n()), FinishReason::kNone);
  std::vector<TokenEvent> ev;
  while (s.wait(ev, std::chrono::milliseconds(0))) {
  }
  for (const TokenEvent& e : ev) {
    if (e.token >= 0) c.tokens[static_cast<size_t>(e.index)].push_back(e.token);
    if (e.finish != FinishReason::kNone) c.finish[static_cast<size_t>(e.index)] = e.finish;
  }
  return c;
}

}  // namespace kiln::test
