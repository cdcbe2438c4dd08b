// Fast summation (summation.h): fixed 64K-element blocks summed by the SIMD block kernel on
// kiln's threads, then the block results combined in block order by the same method, so the
// result does not depend on the thread count. bf16 accumulators run the reference.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cpu/summation_targets.h"

namespace kiln::cpu {
namespace {

// 64K floats = 256 KiB per block: large enough that a block's work (~10-40 µs) dwarfs a pool
// wake-up on the 2-core Zen 5 dev machines, small enough to split 1e6+ sums over threads.
// A power of two, so pairwise over blocks continues pairwise inside them.
constexpr int64_t kBlock = int64_t{1} << 16;

float pairwise_combine(const double* v, int64_t n) {
  if (n == 1) return static_cast<float>(v[0]);
  const int64_t h = n / 2;
  return pairwise_combine(v, h) + pairwise_combine(v + h, n - h);
}

}  // namespace

float sum(const float* x, int64_t n, SumMethod method, DType accum) {
  if (accum != DType::kF32) return ref::sum(x, n, method, accum);
  if (n == 0) return 0.0f;
  const auto block_fn = KILN_SUM_DISPATCH.pick();
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  if (num_blocks == 1) return static_cast<float>(block_fn(x, n, method));
  std::vector<double> part(static_cast<size_t>(num_blocks));  // (num_blocks,)
  parallel_for(num_blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      part[b] = block_fn(x + b * kBlock, std::min(kBlock, n - b * kBlock), method);
  });
  switch (method) {
    case SumMethod::kNaive: {
      float s = 0.0f;
      for (double p : part) s += static_cast<float>(p);
      return s;
    }
    case SumMethod::kPairwise: return pairwise_combine(part.data(), num_blocks);
    default: {  // compensated: the blocks' double results, Neumaier in double
      double s = 0.0, c = 0.0;
      for (double p : part) {
        const double t = s + p;
        c += std::fabs(s) >= std::fabs(p) ? (s - t) + p : (p - t) + s;
        s = t;
      }
      return static_cast<float>(s + c);
    }
  }
}

}  // namespace kiln::cpu
