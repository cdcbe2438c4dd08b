// Naive attention, the ground truth: one full score row per query, accumulated in double.
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/kernels/attention.h"

namespace kiln::ref {
namespace {

// Keys [lo, hi] that query t may see.
void key_range(const AttentionParams& p, int64_t t, int64_t* lo, int64_t* hi) {
  const int64_t pos = t + p.q_offset();
  *lo = 0;
  *hi = p.kv_len - 1;
  if (p.causal) *hi = std::min(*hi, pos);
  if (p.window > 0) {
    *lo = std::max<int64_t>(0, pos - p.window + 1);
    if (!p.causal) *hi = std::min(*hi, pos + p.window - 1);
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionParams& p) {
  const int64_t T = p.q_len, S = p.kv_len, D = p.head_dim, rep = p.n_heads / p.n_kv_heads;
  const double scale = p.softmax_scale();
  std::vector<double> s(static_cast<size_t>(S)), acc(static_cast<size_t>(D));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.n_heads; ++h) {
      const int64_t g = h / rep;
      for (int64_t t = 0; t < T; ++t) {
        const float* qt = q + (b * T + t) * p.q_row_stride + h * D;
        int64_t lo, hi;
        key_range(p, t, &lo, &hi);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = lo; j <= hi; ++j) {
          const float* kj = k + (b * S + j) * p.k_row_stride + g * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qt[d]) * kj[d];
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int64_t j = lo; j <= hi; ++j) sum += std::exp(s[j] - m);
        const double l = m + std::log(sum);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = lo; j <= hi; ++j) {
          const double pj = std::exp(s[j] - l);
          const float* vj = v + (b * S + j) * p.v_row_stride + g * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += pj * vj[d];
        }
        float* ot = out + (b * T + t) * p.o_row_stride + h * D;
        for (int64_t d = 0; d < D; ++d) ot[d] = static_cast<float>(acc[d]);
        lse[(b * p.n_heads + h) * T + t] = static_cast<float>(l);
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionParams& p) {
  const int64_t T = p.q_len, S = p.kv_len, D = p.head_dim, rep = p.n_heads / p.n_kv_heads;
  const double scale = p.softmax_scale();
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t j = 0; j < S; ++j) {
      for (int64_t g = 0; g < p.n_kv_heads; ++g) {
        std::fill_n(dk + (b * S + j) * p.k_row_stride + g * D, D, 0.0f);
        std::fill_n(dv + (b * S + j) * p.v_row_stride + g * D, D, 0.0f);
      }
    }
  }
  std::vector<double> dqt(static_cast<size_t>(D));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.n_heads; ++h) {
      const int64_t g = h / rep;
      for (int64_t t = 0; t < T; ++t) {
        const float* qt = q + (b * T + t) * p.q_row_stride + h * D;
        const float* ot = out + (b * T + t) * p.o_row_stride + h * D;
        const float* dot_ = dout + (b * T + t) * p.o_row_stride + h * D;
        const double l = lse[(b * p.n_heads + h) * T + t];
        double Dt = 0;  // rowsum(dO ∘ O)
        for (int64_t d = 0; d < D; ++d) Dt += static_cast<double>(dot_[d]) * ot[d];
        std::fill(dqt.begin(), dqt.end(), 0.0);
        int64_t lo, hi;
        key_range(p, t, &lo, &hi);
        for (int64_t j = lo; j <= hi; ++j) {
          const float* kj = k + (b * S + j) * p.k_row_stride + g * D;
          const float* vj = v + (b * S + j) * p.v_row_stride + g * D;
          double sc = 0, dp = 0;
          for (int64_t d = 0; d < D; ++d) {
            sc += static_cast<double>(qt[d]) * kj[d];
            dp += static_cast<double>(dot_[d]) * vj[d];
          }
          const double pj = std::exp(sc * scale - l);
          const double ds = pj * (dp - Dt);
          float* dkj = dk + (b * S + j) * p.k_row_stride + g * D;
          float* dvj = dv + (b * S + j) * p.v_row_stride + g * D;
          for (int64_t d = 0; d < D; ++d) {
            dqt[d] += scale * ds * kj[d];
            dkj[d] += static_cast<float>(scale * ds * qt[d]);
            dvj[d] += static_cast<float>(pj * dot_[d]);
          }
        }
        float* dqp = dq + (b * T + t) * p.q_row_stride + h * D;
        for (int64_t d = 0; d < D; ++d) dqp[d] = static_cast<float>(dqt[d]);
      }
    }
  }
}

}  // namespace kiln::ref
