// perf/peak.h: the ceiling measurements return plausible, cached values (no timing thresholds:
// only that a SIMD CPU reports a positive peak and that absent instructions report 0).
#include <gtest/gtest.h>

#include "kiln/core/cpu_features.h"
#include "kiln/perf/peak.h"

namespace kiln::perf {
namespace {

TEST(PerfPeak, FmaPeakIsPositiveWhereSimdExists) {
  const double gf = measure_fma_peak_gflops(DType::kF32, 1, 0.002);
  if (active_simd_target() == SimdTarget::kScalar) {
    EXPECT_EQ(gf, 0.0);
  } else {
    EXPECT_GT(gf, 0.0);
    EXPECT_LT(gf, 1e5);  // one core cannot do 100 TFLOP/s: a broken FLOP count would
  }
  const double bf = measure_fma_peak_gflops(DType::kBF16, 1, 0.002);
  if (bf16_dot_available()) {
    EXPECT_GT(bf, 0.0);
  } else {
    EXPECT_EQ(bf, 0.0);
  }
  EXPECT_EQ(measure_fma_peak_gflops(DType::kI8, 1, 0.002), 0.0);  // no loop for int8 yet
}

TEST(PerfPeak, CachedPeakIsMeasuredOnce) {
  const double a = fma_peak_gflops(1);
  EXPECT_EQ(fma_peak_gflops(1), a);
  if (active_simd_target() != SimdTarget::kScalar) {
    EXPECT_GT(a, 0.0);
  }
}

TEST(PerfPeak, DramReadBandwidthIsPositive) {
  const double gbs = measure_dram_read_gbps(1, int64_t{8} << 20);  // small: a smoke test only
  if (active_simd_target() == SimdTarget::kScalar) {
    EXPECT_EQ(gbs, 0.0);
  } else {
    EXPECT_GT(gbs, 0.0);
  }
}

}  // namespace
}  // namespace kiln::perf
