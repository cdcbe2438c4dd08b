// Edges of the flash kernels' softmax exponent (attention_flash_impl.inc::exp2_scores), on every
// SIMD target this CPU has: the masked scores of causal tiles (-inf) make no subnormal on the
// way to 0 (each one is a microcode assist on Intel cores), and a NaN in a query row comes out
// as NaN in that row instead of a silently finite softmax.
#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <cmath>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/attention.h"

namespace kiln {
namespace {

struct Inputs {
  AttentionParams p;
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;
};

// Causal, 4 heads × 64 dims, T = 200 (several query and key tiles, partial ones on the diagonal),
// uniform inputs in [-1, 1]: every exponent of an unmasked score is far above the underflow.
Inputs make_inputs() {
  Inputs in;
  AttentionParams& p = in.p;
  p.batch = 2;
  p.q_len = p.kv_len = 200;
  p.n_heads = p.n_kv_heads = 4;
  p.head_dim = 64;
  p.impl = AttentionImpl::kFlash;
  p = check_attention(p).value();
  const size_t n = static_cast<size_t>(p.batch * p.q_len * p.n_heads * p.head_dim);
  for (auto* x : {&in.q, &in.k, &in.v, &in.dout, &in.out, &in.dq, &in.dk, &in.dv}) x->resize(n);
  in.lse.resize(static_cast<size_t>(p.batch * p.n_heads * p.q_len));
  Rng rng(3);
  for (auto* x : {&in.q, &in.k, &in.v, &in.dout}) rng.fill_uniform(*x);
  return in;
}

void forward(Inputs& in) {
  cpu::attention_forward(in.out.data(), in.lse.data(), in.q.data(), in.k.data(), in.v.data(), in.p);
}
void backward(Inputs& in) {
  cpu::attention_backward(in.dq.data(), in.dk.data(), in.dv.data(), in.dout.data(), in.q.data(),
                          in.k.data(), in.v.data(), in.out.data(), in.lse.data(), in.p);
}

// MXCSR's flags are per thread, and this one reads the calling thread's: on one thread every task
// of the forward and the backward runs here (with the pool, the check saw only the tasks this
// thread happened to take, which varied from run to run).
TEST(FlashEdges, MaskedScoresMakeNoSubnormal) {
  const SimdTarget saved = active_simd_target();
  const int saved_threads = num_threads();
  set_num_threads(1);
  for (const auto& info : kSimdTargets) {
    if (!set_simd_target(info.target)) continue;
    Inputs in = make_inputs();
    _mm_setcsr(_mm_getcsr() & ~0x3Fu);  // clear the exception flags
    forward(in);
    backward(in);
    EXPECT_EQ(_mm_getcsr() & 0x10u, 0u) << info.name << ": a step underflowed (a subnormal result)";
  }
  set_num_threads(saved_threads);
  set_simd_target(saved);
}

TEST(FlashEdges, NanInAQueryRowComesOutAsNan) {
  const SimdTarget saved = active_simd_target();
  for (const auto& info : kSimdTargets) {
    if (!set_simd_target(info.target)) continue;
    Inputs in = make_inputs();
    const int64_t H = in.p.n_heads, D = in.p.head_dim, row = 150;  // batch 0, query 150, head 1
    in.q[static_cast<size_t>(row * H * D + D + 5)] = NAN;
    forward(in);
    for (int64_t d = 0; d < D; ++d)
      EXPECT_TRUE(std::isnan(in.out[static_cast<size_t>(row * H * D + D + d)]))
          << info.name << " d=" << d;
    EXPECT_TRUE(std::isnan(in.lse[static_cast<size_t>(1 * in.p.q_len + row)])) << info.name;
    // The other rows of that head, and that row's other heads, stay finite.
    EXPECT_TRUE(std::isfinite(in.out[static_cast<size_t>((row - 1) * H * D + D)])) << info.name;
    EXPECT_TRUE(std::isfinite(in.out[static_cast<size_t>(row * H * D)])) << info.name;
  }
  set_simd_target(saved);
}

}  // namespace
}  // namespace kiln
