// Attention: the GEMM-based cpu path against the naive scalar reference (MHA, GQA, MQA,
// causal or not, sliding window, decode-style q_len < kv_len, fused-QKV row strides), and the
// reference backward against finite differences.
#include <tuple>

#include "kiln/kernels/attention.h"
#include "tests/kernels/harness.h"

namespace kiln::testing {
namespace {

struct AttnShape {
  int64_t b, t, s, h, hkv, d;
  bool causal;
  int64_t window;
  bool fused;  // q, k, v interleaved in one (B, T, (H + 2Hkv)·D) buffer
};

AttentionParams params_for(const AttnShape& a) {
  AttentionParams p;
  p.batch = a.b; p.q_len = a.t; p.kv_len = a.s; p.n_heads = a.h; p.n_kv_heads = a.hkv;
  p.head_dim = a.d; p.causal = a.causal; p.window = a.window;
  if (a.fused) {
    const int64_t row = (a.h + 2 * a.hkv) * a.d;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = row;
  }
  return check_attention(p).value();
}

}  // namespace

KILN_KERNEL_CASES(attention) {
  const AttnShape shapes[] = {
      {1, 1, 3, 1, 1, 8, true, 0, false},   {2, 17, 17, 4, 4, 16, true, 0, false},
      {1, 33, 33, 6, 2, 32, true, 0, false}, {1, 7, 40, 4, 1, 8, true, 0, false},
      {2, 9, 9, 2, 2, 8, false, 0, false},   {1, 64, 64, 4, 2, 16, true, 8, false},
      {2, 13, 13, 6, 2, 8, true, 0, true},   {1, 5, 21, 3, 3, 80, false, 4, false},
  };
  std::vector<KernelCase> cases;
  for (const AttnShape& a : shapes) {
    cases.push_back({fmt::format("b={} t={} s={} h={}/{} d={} causal={} window={} fused={}", a.b, a.t, a.s, a.h,
                                 a.hkv, a.d, a.causal, a.window, a.fused),
                     [a] {
                       const AttentionParams p = params_for(a);
                       Rng rng(static_cast<uint64_t>(a.t * 131 + a.s + a.h));
                       const size_t qn = static_cast<size_t>(a.b * a.t * p.q_row_stride);
                       const size_t kn = static_cast<size_t>(a.b * a.s * p.k_row_stride);
                       // In fused mode q, k, v are views at column offsets of one buffer.
                       std::vector<float> qb = random_vector(rng, std::max(qn, kn) + 3 * 80 * 8);
                       std::vector<float> kb = a.fused ? qb : random_vector(rng, kn);
                       std::vector<float> vb = a.fused ? qb : random_vector(rng, kn);
                       const float* q = qb.data();
                       const float* k = kb.data() + (a.fused ? a.h * a.d : 0);
                       const float* v = vb.data() + (a.fused ? (a.h + a.hkv) * a.d : 0);
                       const size_t on = static_cast<size_t>(a.b * a.t * p.o_row_stride);
                       const size_t ln = static_cast<size_t>(a.b * a.h * a.t);
                       std::vector<float> o_ref(on), o_cpu(on), l_ref(ln), l_cpu(ln);
                       ref::attention_forward(o_ref.data(), l_ref.data(), q, k, v, p);
                       cpu::attention_forward(o_cpu.data(), l_cpu.data(), q, k, v, p);
                       std::vector<float> dout = random_vector(rng, on);
                       std::vector<float> dq_r(qb.size()), dk_r(kb.size()), dv_r(vb.size());
                       std::vector<float> dq_c(qb.size()), dk_c(kb.size()), dv_c(vb.size());
                       const int64_t koff = a.fused ? a.h * a.d : 0, voff = a.fused ? (a.h + a.hkv) * a.d : 0;
                       // Separate grad buffers even when fused, so the three outputs do not overlap.
                       ref::attention_backward(dq_r.data(), dk_r.data() + koff, dv_r.data() + voff, dout.data(), q, k, v,
                                               o_ref.data(), l_ref.data(), p);
                       cpu::attention_backward(dq_c.data(), dk_c.data() + koff, dv_c.data() + voff, dout.data(), q, k, v,
                                               o_ref.data(), l_ref.data(), p);
                       // fp32 GEMM sums of length D or S against double sums: nmse ~ len·u².
                       return std::vector<Compare>{{"out", o_ref, o_cpu, 1e-10},
                                                   {"lse", l_ref, l_cpu, 1e-11},
                                                   {"dq", dq_r, dq_c, 1e-9},
                                                   {"dk", dk_r, dk_c, 1e-9},
                                                   {"dv", dv_r, dv_c, 1e-9}};
                     }});
  }
  return cases;
}

KILN_GRAD_CASES(attention) {
  std::vector<GradCase> cases;
  for (const AttnShape& a : {AttnShape{1, 5, 5, 4, 2, 4, true, 0, false}, AttnShape{2, 3, 6, 2, 1, 3, true, 3, false},
                             AttnShape{1, 4, 4, 2, 2, 4, false, 0, false}}) {
    const AttentionParams p = params_for(a);
    Rng rng(99);
    const size_t qn = static_cast<size_t>(a.b * a.t * a.h * a.d), kn = static_cast<size_t>(a.b * a.s * a.hkv * a.d);
    const size_t on = qn;
    std::vector<float> x = random_vector(rng, qn + 2 * kn);
    std::vector<float> dy = random_vector(rng, on);
    auto split = [qn, kn](const std::vector<float>& xs) {
      return std::tuple(xs.data(), xs.data() + qn, xs.data() + qn + kn);
    };
    cases.push_back({fmt::format("attention b={} t={} s={} h={}/{} window={} causal={}", a.b, a.t, a.s, a.h, a.hkv,
                                 a.window, a.causal),
                     x,
                     [=](const std::vector<float>& xs) {
                       auto [q, k, v] = split(xs);
                       std::vector<float> o(on), l(static_cast<size_t>(a.b * a.h * a.t));
                       ref::attention_forward(o.data(), l.data(), q, k, v, p);
                       return dot(o, dy);
                     },
                     [=](const std::vector<float>& xs) {
                       auto [q, k, v] = split(xs);
                       std::vector<float> o(on), l(static_cast<size_t>(a.b * a.h * a.t));
                       ref::attention_forward(o.data(), l.data(), q, k, v, p);
                       std::vector<float> g(xs.size());
                       ref::attention_backward(g.data(), g.data() + qn, g.data() + qn + kn, dy.data(), q, k, v,
                                               o.data(), l.data(), p);
                       return g;
                     }});
  }
  return cases;
}

}  // namespace kiln::testing
