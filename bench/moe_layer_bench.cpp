// A standalone MoE layer with random weights (moe_layer_bench.h).
#include "bench/moe_layer_bench.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kiln/core/rng.h"

namespace kiln::bench {

MoeLayerBench::MoeLayerBench(const MoeLayerShape& s, uint64_t seed) : s_(s) {
  const int64_t C = s.d_model, F = s.ffn, E = s.experts, N = s.tokens;
  const int64_t expert = 3 * F * C;
  w_.resize(static_cast<size_t>(E * C + E * expert));
  dw_.assign(w_.size(), 0.0f);
  Rng rng(seed);
  block_.d_model = C;
  block_.d_ff = F;
  block_.num_experts = E;
  block_.top_k = s.top_k;
  int64_t at = 0;
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    Linear l;
    l.name = name;
    l.in = in;
    l.out = out;
    l.w = w_.data() + at;
    l.dw = dw_.data() + at;
    const float bound = 1.0f / std::sqrt(static_cast<float>(in));
    for (int64_t i = 0; i < out * in; ++i) w_[static_cast<size_t>(at + i)] = rng.uniform(-bound, bound);
    at += out * in;
    return l;
  };
  block_.router = linear("gate", E, C);
  for (int64_t e = 0; e < E; ++e) {
    block_.w1.push_back(linear("w1", F, C));
    block_.w2.push_back(linear("w2", C, F));
    block_.w3.push_back(linear("w3", F, C));
  }
  for (auto* v : {&x_, &dy_}) {
    v->resize(static_cast<size_t>(N * C));
    rng.fill_normal(*v);
  }
  y_.resize(static_cast<size_t>(N * C));
  dx_.resize(static_cast<size_t>(N * C));
}

void MoeLayerBench::forward() {
  stats_ = MoeStats{};
  block_.forward(y_.data(), x_.data(), s_.tokens, x_.data(), acts_, &stats_);
}

void MoeLayerBench::forward_backward() {
  std::fill(dw_.begin(), dw_.end(), 0.0f);
  forward();
  block_.backward(dx_.data(), dy_.data(), x_.data(), s_.tokens, acts_, false, stats_);
}

}  // namespace kiln::bench
