// Multi-head latent attention (mla.h): the expanded form for training, the absorbed form over
// the compressed cache for decoding.
#include "kiln/model/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kiln/core/thread_pool.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/norm.h"

namespace kiln {

namespace {
template <class T>
void grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}
template <class T>
int64_t vec_bytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.capacity() * sizeof(T));
}

// The rope dims of one vector in RoPE order: de-interleaved (even indices, then odd) or as is.
void to_rope_order(float* out, const float* in, int64_t d, bool interleave) {
  if (!interleave) return (void)std::memcpy(out, in, static_cast<size_t>(d) * sizeof(float));
  for (int64_t i = 0; i < d / 2; ++i) {
    out[i] = in[2 * i];
    out[d / 2 + i] = in[2 * i + 1];
  }
}
// The transpose: a gradient in RoPE order back to the projection's order (+= when accumulate).
void from_rope_order(float* out, const float* in, int64_t d, bool interleave, bool accumulate) {
  for (int64_t i = 0; i < d; ++i) {
    const int64_t j = !interleave ? i : i < d / 2 ? 2 * i : 2 * (i - d / 2) + 1;
    out[j] = accumulate ? out[j] + in[i] : in[i];
  }
}
}  // namespace

int64_t MlaActivations::bytes() const {
  return vec_bytes(qa) + vec_bytes(qan) + vec_bytes(rstd_qa) + vec_bytes(c) + vec_bytes(cn) + vec_bytes(rstd_c) +
         vec_bytes(q) + vec_bytes(k) + vec_bytes(v) + vec_bytes(o) + vec_bytes(lse);
}

float MlaAttention::scale() const { return 1.0f / std::sqrt(static_cast<float>(qk_dim())); }

void MlaAttention::forward(float* att, const float* n1, int64_t B, int64_t T, MlaActivations& a) const {
  const int64_t N = B * T, H = heads, Dn = nope, Dr = rope_dim, Dv = v_dim, Dqk = qk_dim(), Dp = padded_dim();
  const int64_t r = kv_rank, W = latent_width();
  a.batch = B;
  a.seq_len = T;
  std::vector<float> qraw(static_cast<size_t>(N * H * Dqk)), ckv(static_cast<size_t>(N * W));
  if (q_rank > 0) {
    grow(a.qa, N * q_rank); grow(a.qan, N * q_rank); grow(a.rstd_qa, N);
    q_a.forward(a.qa.data(), n1, N);
    cpu::rmsnorm_forward(a.qan.data(), a.rstd_qa.data(), a.qa.data(), q_a_norm_w, N, q_rank, eps);
    q_b.forward(qraw.data(), a.qan.data(), N);
  } else {
    q.forward(qraw.data(), n1, N);
  }
  kv_a.forward(ckv.data(), n1, N);
  grow(a.c, N * r); grow(a.cn, N * r); grow(a.rstd_c, N);
  std::vector<float> qpe(static_cast<size_t>(N * H * Dr)), kpe(static_cast<size_t>(N * Dr));
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      std::memcpy(a.c.data() + t * r, ckv.data() + t * W, static_cast<size_t>(r) * sizeof(float));
      to_rope_order(kpe.data() + t * Dr, ckv.data() + t * W + r, Dr, interleave);
      for (int64_t h = 0; h < H; ++h)
        to_rope_order(qpe.data() + (t * H + h) * Dr, qraw.data() + (t * H + h) * Dqk + Dn, Dr, interleave);
    }
  });
  cpu::rmsnorm_forward(a.cn.data(), a.rstd_c.data(), a.c.data(), kv_a_norm_w, N, r, eps);
  std::vector<float> kvb(static_cast<size_t>(N * H * (Dn + Dv)));
  kv_b.forward(kvb.data(), a.cn.data(), N);
  cpu::rope_forward(qpe.data(), qpe.data(), *rope, B, T, H, Dr, 0);
  cpu::rope_forward(kpe.data(), kpe.data(), *rope, B, T, 1, Dr, 0);
  // Every head's Q, K, V padded to Dp: [q_nope, q_pe, 0], [k_nope, k_pe, 0], [v, 0].
  a.q.assign(static_cast<size_t>(N * H * Dp), 0.0f);
  a.k.assign(a.q.size(), 0.0f);
  a.v.assign(a.q.size(), 0.0f);
  grow(a.o, N * H * Dp); grow(a.lse, B * H * T);
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t row = (t * H + h) * Dp;
        const float* kv = kvb.data() + (t * H + h) * (Dn + Dv);
        std::memcpy(a.q.data() + row, qraw.data() + (t * H + h) * Dqk, static_cast<size_t>(Dn) * sizeof(float));
        std::memcpy(a.q.data() + row + Dn, qpe.data() + (t * H + h) * Dr, static_cast<size_t>(Dr) * sizeof(float));
        std::memcpy(a.k.data() + row, kv, static_cast<size_t>(Dn) * sizeof(float));
        std::memcpy(a.k.data() + row + Dn, kpe.data() + t * Dr, static_cast<size_t>(Dr) * sizeof(float));
        std::memcpy(a.v.data() + row, kv + Dn, static_cast<size_t>(Dv) * sizeof(float));
      }
    }
  });
  AttentionParams p;
  p.batch = B; p.q_len = T; p.kv_len = T; p.n_heads = H; p.n_kv_heads = H; p.head_dim = Dp;
  p.causal = true; p.scale = scale();
  p = check_attention(p).value();
  cpu::attention_forward(a.o.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(), p);
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(att + (t * H + h) * Dv, a.o.data() + (t * H + h) * Dp, static_cast<size_t>(Dv) * sizeof(float));
  });
}

void MlaAttention::backward(float* dn1, const float* datt, const float* n1, MlaActivations& a) const {
  const int64_t B = a.batch, T = a.seq_len, N = B * T, H = heads, Dn = nope, Dr = rope_dim, Dv = v_dim;
  const int64_t Dqk = qk_dim(), Dp = padded_dim(), r = kv_rank, W = latent_width();
  std::vector<float> dout(static_cast<size_t>(N * H * Dp), 0.0f);
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(dout.data() + (t * H + h) * Dp, datt + (t * H + h) * Dv, static_cast<size_t>(Dv) * sizeof(float));
  });
  AttentionParams p;
  p.batch = B; p.q_len = T; p.kv_len = T; p.n_heads = H; p.n_kv_heads = H; p.head_dim = Dp;
  p.causal = true; p.scale = scale();
  p = check_attention(p).value();
  std::vector<float> dq(dout.size()), dk(dout.size()), dv(dout.size());
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), a.q.data(), a.k.data(), a.v.data(),
                          a.o.data(), a.lse.data(), p);
  // The rope parts back through RoPE (k_pe summed over the heads that share it).
  std::vector<float> dqpe(static_cast<size_t>(N * H * Dr)), dkpe(static_cast<size_t>(N * Dr), 0.0f);
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float* g = dk.data() + (t * H + h) * Dp + Dn;
        std::memcpy(dqpe.data() + (t * H + h) * Dr, dq.data() + (t * H + h) * Dp + Dn, static_cast<size_t>(Dr) * sizeof(float));
        for (int64_t i = 0; i < Dr; ++i) dkpe[static_cast<size_t>(t * Dr + i)] += g[i];
      }
  });
  cpu::rope_backward(dqpe.data(), dqpe.data(), *rope, B, T, H, Dr, 0);
  cpu::rope_backward(dkpe.data(), dkpe.data(), *rope, B, T, 1, Dr, 0);
  std::vector<float> dqraw(static_cast<size_t>(N * H * Dqk)), dkvb(static_cast<size_t>(N * H * (Dn + Dv)));
  std::vector<float> dckv(static_cast<size_t>(N * W));
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t row = (t * H + h) * Dp;
        float* dqr = dqraw.data() + (t * H + h) * Dqk;
        std::memcpy(dqr, dq.data() + row, static_cast<size_t>(Dn) * sizeof(float));
        from_rope_order(dqr + Dn, dqpe.data() + (t * H + h) * Dr, Dr, interleave, false);
        float* dkv = dkvb.data() + (t * H + h) * (Dn + Dv);
        std::memcpy(dkv, dk.data() + row, static_cast<size_t>(Dn) * sizeof(float));
        std::memcpy(dkv + Dn, dv.data() + row, static_cast<size_t>(Dv) * sizeof(float));
      }
      from_rope_order(dckv.data() + t * W + r, dkpe.data() + t * Dr, Dr, interleave, false);
    }
  });
  std::vector<float> dcn(static_cast<size_t>(N * r)), dc(dcn.size());
  kv_b.backward(dcn.data(), dkvb.data(), a.cn.data(), N, false);
  cpu::rmsnorm_backward(dc.data(), dkv_a_norm_w, dcn.data(), a.c.data(), kv_a_norm_w, a.rstd_c.data(), N, r);
  for (int64_t t = 0; t < N; ++t)
    std::memcpy(dckv.data() + t * W, dc.data() + t * r, static_cast<size_t>(r) * sizeof(float));
  kv_a.backward(dn1, dckv.data(), n1, N, false);
  if (q_rank > 0) {
    std::vector<float> dqan(static_cast<size_t>(N * q_rank)), dqa(dqan.size());
    q_b.backward(dqan.data(), dqraw.data(), a.qan.data(), N, false);
    cpu::rmsnorm_backward(dqa.data(), dq_a_norm_w, dqan.data(), a.qa.data(), q_a_norm_w, a.rstd_qa.data(), N, q_rank);
    q_a.backward(dn1, dqa.data(), n1, N, true);
  } else {
    q.backward(dn1, dqraw.data(), n1, N, true);
  }
}

void MlaAttention::latent(float* rows, float* qabs, const float* n1, int64_t n, int64_t pos) const {
  const int64_t H = heads, Dn = nope, Dr = rope_dim, Dqk = qk_dim(), r = kv_rank, W = latent_width();
  std::vector<float> qraw(static_cast<size_t>(n * H * Dqk)), ckv(static_cast<size_t>(n * W));
  if (q_rank > 0) {
    std::vector<float> qa(static_cast<size_t>(n * q_rank)), qan(qa.size());
    q_a.forward(qa.data(), n1, n);
    cpu::rmsnorm_forward(qan.data(), nullptr, qa.data(), q_a_norm_w, n, q_rank, eps);
    q_b.forward(qraw.data(), qan.data(), n);
  } else {
    q.forward(qraw.data(), n1, n);
  }
  kv_a.forward(ckv.data(), n1, n);
  std::vector<float> c(static_cast<size_t>(n * r)), qpe(static_cast<size_t>(n * H * Dr)), kpe(static_cast<size_t>(n * Dr));
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(c.data() + t * r, ckv.data() + t * W, static_cast<size_t>(r) * sizeof(float));
    to_rope_order(kpe.data() + t * Dr, ckv.data() + t * W + r, Dr, interleave);
    for (int64_t h = 0; h < H; ++h)
      to_rope_order(qpe.data() + (t * H + h) * Dr, qraw.data() + (t * H + h) * Dqk + Dn, Dr, interleave);
  }
  cpu::rope_forward(qpe.data(), qpe.data(), *rope, 1, n, H, Dr, pos);
  cpu::rope_forward(kpe.data(), kpe.data(), *rope, 1, n, 1, Dr, pos);
  // rows = [norm(c), k_pe]: the normalized latent straight into the cache rows.
  std::vector<float> cn(c.size());
  cpu::rmsnorm_forward(cn.data(), nullptr, c.data(), kv_a_norm_w, n, r, eps);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(rows + t * W, cn.data() + t * r, static_cast<size_t>(r) * sizeof(float));
    std::memcpy(rows + t * W + r, kpe.data() + t * Dr, static_cast<size_t>(Dr) * sizeof(float));
  }
  // q̃_h = [W_uk_hᵀ q_nope_h, q_pe_h]: W_uk_h is kv_b's rows [h(Dn + Dv), h(Dn + Dv) + Dn) of r.
  for (int64_t h = 0; h < H; ++h) {
    GemmParams g;
    g.m = n; g.n = r; g.k = Dn;
    g.a = qraw.data() + h * Dqk; g.lda = H * Dqk;
    g.b = kv_b.w + h * (Dn + v_dim) * r; g.ldb = r;
    g.c = qabs + h * W; g.ldc = H * W;
    cpu::gemm(g);
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(qabs + (t * H + h) * W + r, qpe.data() + (t * H + h) * Dr, static_cast<size_t>(Dr) * sizeof(float));
  }
}

AttentionParams MlaAttention::absorbed_params(int64_t n, int64_t kv_len) const {
  AttentionParams p;
  p.batch = 1; p.q_len = n; p.kv_len = kv_len;
  p.n_heads = heads; p.n_kv_heads = 1; p.head_dim = latent_width();
  p.causal = true; p.scale = scale();
  return check_attention(p).value();
}

void MlaAttention::absorbed_output(float* att, const float* out, int64_t n) const {
  const int64_t H = heads, W = latent_width(), r = kv_rank, Dn = nope, Dv = v_dim;
  for (int64_t h = 0; h < H; ++h) {  // att_h (n, Dv) = out_h[:, :r] (n, r) · W_uv_hᵀ, W_uv_h (Dv, r)
    GemmParams g;
    g.m = n; g.n = Dv; g.k = r;
    g.a = out + h * W; g.lda = H * W;
    g.b = kv_b.w + (h * (Dn + Dv) + Dn) * r; g.ldb = r; g.trans_b = true;
    g.c = att + h * Dv; g.ldc = H * Dv;
    cpu::gemm(g);
  }
}

}  // namespace kiln
