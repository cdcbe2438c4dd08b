// The flash kernels' scratch as counted for the memory model (attention_forward_scratch_bytes,
// attention_backward_scratch_bytes; perf/memory_model.cpp adds them to a step's peak) against
// what the calls request from the caching allocator: equal, with and without the per-thread K/V
// staging (attention_flash.cpp), on 1 and 2 threads.
#include <gtest/gtest.h>

#include <vector>

#include "kiln/core/allocator.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/attention.h"

namespace kiln {
namespace {

struct Shape {
  int64_t b, t, h, hkv, d, window;
  bool fused;  // q, k, v rows of one (B, T, (H + 2·Hkv)·D) buffer
};

// Peak bytes requested from the caching allocator during f, beyond what was live before it.
template <class F>
int64_t requested_during(F&& f) {
  CachingAllocator& a = default_allocator();
  a.reset_peak();
  const int64_t before = a.stats().bytes_requested;
  f();
  return a.stats().peak_bytes_requested - before;
}

TEST(AttentionScratch, CountedBytesAreWhatTheKernelsRequest) {
  const int saved_threads = num_threads();
  const Shape shapes[] = {
      {2, 256, 4, 2, 64, 0, true},    // fused rows, two or more query tiles: staged
      {1, 300, 6, 6, 32, 0, false},   // interleaved heads: staged
      {1, 48, 4, 4, 64, 0, false},    // one query tile: read in place
      {1, 256, 4, 1, 64, 40, false},  // sliding window: read in place
      {3, 200, 1, 1, 64, 0, false},   // one head, rows D apart already: nothing to stage
  };
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Shape& s : shapes) {
      AttentionParams p;
      p.batch = s.b;
      p.q_len = p.kv_len = s.t;
      p.n_heads = s.h;
      p.n_kv_heads = s.hkv;
      p.head_dim = s.d;
      p.window = s.window;
      p.impl = AttentionImpl::kFlash;
      const int64_t qw = s.h * s.d, kw = s.hkv * s.d, row = s.fused ? qw + 2 * kw : 0;
      if (s.fused) p.q_row_stride = p.k_row_stride = p.v_row_stride = row;
      p = check_attention(p).value();
      const int64_t rows = s.b * s.t;
      std::vector<float> qkv(static_cast<size_t>(rows * (qw + 2 * kw))), dqkv(qkv.size());
      Rng(7).fill_uniform(qkv);
      const float* q = qkv.data();
      const float* k = s.fused ? q + qw : q + rows * qw;
      const float* v = s.fused ? q + qw + kw : k + rows * kw;
      float* dq = dqkv.data();
      float* dk = s.fused ? dq + qw : dq + rows * qw;
      float* dv = s.fused ? dq + qw + kw : dk + rows * kw;
      std::vector<float> out(static_cast<size_t>(rows * qw)), dout(out.size()),
          lse(static_cast<size_t>(s.b * s.h * s.t));
      Rng(8).fill_uniform(dout);
      const std::string what =
          ::testing::PrintToString(std::vector<int64_t>{s.b, s.t, s.h, s.hkv, s.d, s.window}) +
          (s.fused ? " fused" : "") + " threads " + std::to_string(threads);
      EXPECT_EQ(
          requested_during([&] { cpu::attention_forward(out.data(), lse.data(), q, k, v, p); }),
          cpu::attention_forward_scratch_bytes(p, AttentionImpl::kFlash))
          << "forward " << what;
      EXPECT_EQ(requested_during([&] {
                  cpu::attention_backward(dq, dk, dv, dout.data(), q, k, v, out.data(), lse.data(),
                                          p);
                }),
                cpu::attention_backward_scratch_bytes(p, AttentionImpl::kFlash))
          << "backward " << what;
    }
  }
  set_num_threads(saved_threads);
}

}  // namespace
}  // namespace kiln
