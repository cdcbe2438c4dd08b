// cpu::attention_forward/backward (the implementation switch) and the naive attention on the
// fast GEMM: per (batch, KV head) task, the T×S scores of each query head in the group are
// formed with cpu::gemm, masked, soft-maxed (keeping the logsumexp) and multiplied by V. The
// backward recomputes P from the logsumexp. Memory: one (forward) or two (backward) T×S score
// blocks per worker thread, from the caching allocator. FlashAttention (attention_flash.cpp)
// is the default; this path stays for comparison (`--attention naive`).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/cpu/attention_io.h"
#include "kiln/kernels/cpu/attention_scratch.h"
#include "kiln/kernels/elementwise.h"
#include "kiln/kernels/gemm.h"

namespace kiln::cpu {
namespace {

// Scratch slices for a (batch × KV heads)-task region: one per thread index the pool may use
// (a single task runs on the caller, index 0).
int64_t naive_workers(const AttentionParams& p) {
  return p.batch * p.n_kv_heads > 1 ? num_threads() : 1;
}

// Scores (T, S) = scale · Q_h Kᵀ, masked to -inf outside the causal / window range.
void scores(float* sc, const float* q, const float* k, const AttentionParams& p, int64_t b, int64_t h, int64_t g) {
  const int64_t T = p.q_len, S = p.kv_len, D = p.head_dim;
  GemmParams gp;
  gp.m = T; gp.n = S; gp.k = D;
  gp.a = q + b * T * p.q_row_stride + h * D; gp.lda = p.q_row_stride;
  gp.b = k + b * S * p.k_row_stride + g * D; gp.ldb = p.k_row_stride; gp.trans_b = true;
  gp.c = sc; gp.ldc = S;
  gp.alpha = p.softmax_scale();
  gemm(gp);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = t + p.q_offset();
    int64_t lo = 0, hi = S - 1;
    if (p.causal) hi = std::min(hi, pos);
    if (p.window > 0) {
      lo = std::max<int64_t>(0, pos - p.window + 1);
      if (!p.causal) hi = std::min(hi, pos + p.window - 1);
    }
    float* row = sc + t * S;
    std::fill(row, row + std::max<int64_t>(lo, 0), ninf);
    if (hi + 1 < S) std::fill(row + hi + 1, row + S, ninf);
  }
}

AttentionImpl resolve(const AttentionParams& p) {
  return p.impl == AttentionImpl::kDefault ? attention_impl() : p.impl;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionParams& p) {
  KILN_GRAPH_NODE("attention_forward", [=](const graph::Access* io) {
    attention_forward(io[0].mut<float>(), io[1].mut<float>(), io[2].as<float>(), io[3].as<float>(), io[4].as<float>(), p);
  }, attention_out(out, p), graph::writes(lse, p.batch * p.n_heads * p.q_len), attention_q(q, p), attention_k(k, p),
     attention_v(v, p));
  if (resolve(p) == AttentionImpl::kNaive) {
    attention_forward_naive(out, lse, q, k, v, p);
  } else {
    attention_forward_flash(out, lse, q, k, v, p);
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionParams& p) {
  KILN_GRAPH_NODE("attention_backward", [=](const graph::Access* io) {
    attention_backward(io[0].mut<float>(), io[1].mut<float>(), io[2].mut<float>(), io[3].as<float>(), io[4].as<float>(),
                       io[5].as<float>(), io[6].as<float>(), io[7].as<float>(), io[8].as<float>(), p);
  }, attention_q(dq, p, true), attention_k(dk, p, true), attention_v(dv, p, true), attention_out(dout, p, false),
     attention_q(q, p), attention_k(k, p), attention_v(v, p), attention_out(out, p, false),
     graph::reads(lse, p.batch * p.n_heads * p.q_len));
  if (resolve(p) == AttentionImpl::kNaive) {
    attention_backward_naive(dq, dk, dv, dout, q, k, v, out, lse, p);
  } else {
    attention_backward_flash(dq, dk, dv, dout, q, k, v, out, lse, p);
  }
}

void attention_forward_naive(float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttentionParams& p) {
  trace::Scope kiln_trace_(trace::Category::kKernel, "attention_forward", [&](trace::Event& e) { describe_attention(e, p, attention_forward_cost(p), "naive"); });
  const int64_t T = p.q_len, S = p.kv_len, D = p.head_dim, rep = p.n_heads / p.n_kv_heads;
  const ScratchBuffer scratch(naive_workers(p), T * S);  // (workers, T, S)
  thread_pool().run(p.batch * p.n_kv_heads, [&](int64_t task, int thread) {
    const int64_t b = task / p.n_kv_heads, g = task % p.n_kv_heads;
    float* sc = scratch.slice(thread);
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
      scores(sc, q, k, p, b, h, g);
      for (int64_t t = 0; t < T; ++t) {
        float* row = sc + t * S;
        const float m = *std::max_element(row, row + S);
        for (int64_t j = 0; j < S; ++j) row[j] -= m;
        exp_array(row, row, S);
        double sum = 0;
        for (int64_t j = 0; j < S; ++j) sum += row[j];
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t j = 0; j < S; ++j) row[j] *= inv;
        lse[(b * p.n_heads + h) * T + t] = m + static_cast<float>(std::log(sum));
      }
      GemmParams gp;  // O_h (T, D) = P (T, S) V (S, D)
      gp.m = T; gp.n = D; gp.k = S;
      gp.a = sc; gp.lda = S;
      gp.b = v + b * S * p.v_row_stride + g * D; gp.ldb = p.v_row_stride;
      gp.c = out + b * T * p.o_row_stride + h * D; gp.ldc = p.o_row_stride;
      gemm(gp);
    }
  });
}

void attention_backward_naive(float* dq, float* dk, float* dv, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse,
                              const AttentionParams& p) {
  trace::Scope kiln_trace_(trace::Category::kKernel, "attention_backward", [&](trace::Event& e) { describe_attention(e, p, attention_backward_cost(p), "naive"); });
  const int64_t T = p.q_len, S = p.kv_len, D = p.head_dim, rep = p.n_heads / p.n_kv_heads;
  const float scale = p.softmax_scale();
  const ScratchBuffer scratch(naive_workers(p), 2 * T * S);  // (workers, 2, T, S): P and dP
  thread_pool().run(p.batch * p.n_kv_heads, [&](int64_t task, int thread) {
    const int64_t b = task / p.n_kv_heads, g = task % p.n_kv_heads;
    float* pm = scratch.slice(thread);
    float* dp = pm + T * S;
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
      scores(pm, q, k, p, b, h, g);
      for (int64_t t = 0; t < T; ++t) {  // P = exp(scores - lse)
        float* row = pm + t * S;
        const float l = lse[(b * p.n_heads + h) * T + t];
        for (int64_t j = 0; j < S; ++j) row[j] -= l;
        exp_array(row, row, S);
      }
      const float* dout_h = dout + b * T * p.o_row_stride + h * D;
      const float* out_h = out + b * T * p.o_row_stride + h * D;
      GemmParams gp;  // dP (T, S) = dO Vᵀ
      gp.m = T; gp.n = S; gp.k = D;
      gp.a = dout_h; gp.lda = p.o_row_stride;
      gp.b = v + b * S * p.v_row_stride + g * D; gp.ldb = p.v_row_stride; gp.trans_b = true;
      gp.c = dp; gp.ldc = S;
      gemm(gp);
      for (int64_t t = 0; t < T; ++t) {  // dS = P ∘ (dP − rowsum(dO ∘ O)), stored in dp
        double Dt = 0;
        for (int64_t d = 0; d < D; ++d) Dt += static_cast<double>(dout_h[t * p.o_row_stride + d]) * out_h[t * p.o_row_stride + d];
        const float Df = static_cast<float>(Dt);
        float* dsr = dp + t * S;
        const float* pr = pm + t * S;
        for (int64_t j = 0; j < S; ++j) dsr[j] = pr[j] * (dsr[j] - Df);
      }
      const float beta = h == g * rep ? 0.0f : 1.0f;  // KV grads sum over the group's heads
      GemmParams dqp;  // dQ (T, D) = scale · dS K
      dqp.m = T; dqp.n = D; dqp.k = S;
      dqp.a = dp; dqp.lda = S;
      dqp.b = k + b * S * p.k_row_stride + g * D; dqp.ldb = p.k_row_stride;
      dqp.c = dq + b * T * p.q_row_stride + h * D; dqp.ldc = p.q_row_stride;
      dqp.alpha = scale;
      gemm(dqp);
      GemmParams dkp;  // dK (S, D) (+)= scale · dSᵀ Q
      dkp.m = S; dkp.n = D; dkp.k = T;
      dkp.a = dp; dkp.lda = S; dkp.trans_a = true;
      dkp.b = q + b * T * p.q_row_stride + h * D; dkp.ldb = p.q_row_stride;
      dkp.c = dk + b * S * p.k_row_stride + g * D; dkp.ldc = p.k_row_stride;
      dkp.alpha = scale; dkp.beta = beta;
      gemm(dkp);
      GemmParams dvp;  // dV (S, D) (+)= Pᵀ dO
      dvp.m = S; dvp.n = D; dvp.k = T;
      dvp.a = pm; dvp.lda = S; dvp.trans_a = true;
      dvp.b = dout_h; dvp.ldb = p.o_row_stride;
      dvp.c = dv + b * S * p.v_row_stride + g * D; dvp.ldc = p.v_row_stride;
      dvp.beta = beta;
      gemm(dvp);
    }
  });
}

}  // namespace kiln::cpu
