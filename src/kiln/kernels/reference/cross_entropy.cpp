// Reference fused softmax + cross-entropy (cross_entropy.h): max, sum and log in double.
#include "kiln/kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>

namespace kiln::ref {
namespace {

// max and sum(exp(x - max)) of one row, in double.
void row_stats(const float* x, int64_t vocab, double* m, double* s) {
  *m = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v) *m = std::max(*m, static_cast<double>(x[v]));
  *s = 0;
  for (int64_t v = 0; v < vocab; ++v) *s += std::exp(x[v] - *m);
}

}  // namespace

void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t rows,
                           int64_t vocab) {
  check_targets({targets, static_cast<size_t>(rows)}, vocab).check_ok(__FILE__, __LINE__);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == kIgnoreTarget) {
      losses[r] = 0.0f;
      continue;
    }
    const float* x = logits + r * vocab;
    double m, s;
    row_stats(x, vocab, &m, &s);
    losses[r] = static_cast<float>(m + std::log(s) - x[targets[r]]);
  }
}

void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            const float* dlosses, int64_t rows, int64_t vocab) {
  check_targets({targets, static_cast<size_t>(rows)}, vocab).check_ok(__FILE__, __LINE__);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vocab;
    float* dx = dlogits + r * vocab;  // may alias x: each element read before written
    if (targets[r] == kIgnoreTarget) {
      for (int64_t v = 0; v < vocab; ++v) dx[v] = 0.0f;
      continue;
    }
    double m, s;
    row_stats(x, vocab, &m, &s);
    const double dl = dlosses[r];
    for (int64_t v = 0; v < vocab; ++v) {
      const double p = std::exp(x[v] - m) / s;
      dx[v] = static_cast<float>((p - (v == targets[r] ? 1.0 : 0.0)) * dl);
    }
  }
}

}  // namespace kiln::ref
