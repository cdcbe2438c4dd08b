// One MoE MLP layer (model/moe.h's MoeBlock) standalone, with its own random weights and
// inputs, for `kiln bench moe`: forward + backward on W1-MoE's shapes (the torch section) and
// its router's tokens per expert (the gemm section's routing).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/model/moe.h"

namespace kiln::bench {

struct MoeLayerShape {
  int64_t tokens = 2048, d_model = 384, ffn = 1024, experts = 8, top_k = 2;  // W1-MoE: B 8 × T 256
};

// Dropless, no shared experts, no router losses (coefficients 0, as a Mixtral layer alone);
// weights uniform in ±1/sqrt(fan-in) (nn.Linear's init), x and dy standard normal.
class MoeLayerBench {
 public:
  MoeLayerBench(const MoeLayerShape& shape, uint64_t seed);
  MoeLayerBench(const MoeLayerBench&) = delete;
  MoeLayerBench& operator=(const MoeLayerBench&) = delete;

  void forward();
  // y = x + moe(x), then dx and the weight gradients (zeroed first) from dy.
  void forward_backward();
  // (E,) assignments per expert of the last forward.
  const std::vector<int64_t>& tokens_per_expert() const { return stats_.tokens_per_expert; }
  const MoeStats& stats() const { return stats_; }
  const MoeLayerShape& shape() const { return s_; }

 private:
  MoeLayerShape s_;
  std::vector<float> w_, dw_;          // router (E, C), then per expert w1 (F, C), w2 (C, F), w3 (F, C)
  std::vector<float> x_, y_, dy_, dx_;  // (N, C) each
  MoeBlock block_;
  MoeActivations acts_;
  MoeStats stats_;
};

}  // namespace kiln::bench
