// Sampling: sort candidates by logit, cut by top-k and top-p, draw from the renormalized rest
// (plain temperature sampling skips the sort).
#include "kiln/serve/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace kiln {

void adjust_logits(const float* logits, int64_t vocab, const LogitAdjust& a, std::span<const int32_t> history,
                   float* out) {
  if (out != logits) std::copy(logits, logits + vocab, out);
  for (const auto& [id, bias] : a.logit_bias) out[id] += bias;
  if (a.frequency_penalty == 0.0f && a.presence_penalty == 0.0f) return;
  for (const int32_t t : history) out[t] -= a.frequency_penalty;  // c[j] times
  if (a.presence_penalty == 0.0f) return;
  thread_local std::vector<int32_t> seen;
  seen.assign(history.begin(), history.end());
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  for (const int32_t t : seen) out[t] -= a.presence_penalty;  // once per distinct token
}

float token_logprobs(const float* logits, int64_t vocab, int32_t token, int64_t num_top,
                     std::vector<TokenLogprob>* top) {
  double mx = logits[0];
  for (int64_t i = 1; i < vocab; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const double log_z = mx + std::log(sum);
  if (top) {
    top->clear();
    const int64_t k = std::min(num_top, vocab);
    if (k > 0) {
      thread_local std::vector<int32_t> idx;
      idx.resize(static_cast<size_t>(vocab));
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t x, int32_t y) {
        return logits[x] > logits[y] || (logits[x] == logits[y] && x < y);
      });
      for (int64_t i = 0; i < k; ++i)
        top->push_back({idx[static_cast<size_t>(i)], static_cast<float>(double(logits[idx[static_cast<size_t>(i)]]) - log_z)});
    }
  }
  return static_cast<float>(double(logits[token]) - log_z);
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, Rng& rng) {
  if (p.temperature <= 0.0f) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  if ((p.top_k <= 0 || p.top_k >= vocab) && p.top_p >= 1.0f) {
    // Plain temperature: every token is a candidate, so no sort — one pass of exp, one scan in
    // id order (the serving engine samples every running sequence every step).
    thread_local std::vector<double> w;
    w.resize(static_cast<size_t>(vocab));
    const double mx = *std::max_element(logits, logits + vocab);
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += w[i] = std::exp((logits[i] - mx) / p.temperature);
    double r = rng.uniform() * sum;
    int64_t last = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (w[i] <= 0) continue;
      last = i;
      r -= w[i];
      if (r <= 0) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(last);  // rounding left r > 0: the last token with weight
  }
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> probs(static_cast<size_t>(k));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += probs[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
  if (p.top_p < 1.0f) {  // keep the smallest prefix whose mass reaches top_p
    double mass = 0;
    int64_t keep = 0;
    while (keep < k && mass < p.top_p * sum) mass += probs[keep++];
    k = std::max<int64_t>(keep, 1);
    sum = mass;
  }
  double r = rng.uniform() * sum;
  for (int64_t i = 0; i < k; ++i) {
    r -= probs[i];
    if (r <= 0) return idx[i];
  }
  return idx[k - 1];
}

void sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& p, float* probs) {
  std::fill(probs, probs + vocab, 0.0f);
  if (p.temperature <= 0.0f) {
    probs[std::max_element(logits, logits + vocab) - logits] = 1.0f;
    return;
  }
  const double mx = *std::max_element(logits, logits + vocab);
  if ((p.top_k <= 0 || p.top_k >= vocab) && p.top_p >= 1.0f) {  // plain temperature: no sort
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += probs[i] = static_cast<float>(std::exp((logits[i] - mx) / p.temperature));
    for (int64_t i = 0; i < vocab; ++i) probs[i] = static_cast<float>(probs[i] / sum);
    return;
  }
  // The same candidate set as sample_token: sorted by logit, cut by top-k, then by top-p.
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> w(static_cast<size_t>(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += w[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
  if (p.top_p < 1.0f) {
    double mass = 0;
    int64_t keep = 0;
    while (keep < k && mass < p.top_p * sum) mass += w[keep++];
    k = std::max<int64_t>(keep, 1);
    sum = mass;
  }
  for (int64_t i = 0; i < k; ++i) probs[idx[i]] = static_cast<float>(w[i] / sum);
}

int32_t sample_from_probs(const float* probs, int64_t vocab, Rng& rng) {
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += probs[i];
  double r = rng.uniform() * sum;
  int32_t last = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (probs[i] <= 0.0f) continue;
    last = static_cast<int32_t>(i);
    r -= probs[i];
    if (r < 0) return last;
  }
  return last;  // rounding left r >= 0: the last index with weight
}

}  // namespace kiln
