// perf/peak.h: the ceiling measurements return plausible, cached values (no timing thresholds:
// only that a SIMD CPU reports a positive peak and that absent instructions report 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
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

// Both halves of the probe run, and the peak quoted is the larger (so a GEMM cannot be quoted
// above 100%); the self-check ratio is kernel / loop. No timing thresholds: only structure.
TEST(PerfPeak, LoopAndMicroKernelAreBothMeasured) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const FmaPeak p = measure_fma_peak(dt, 1, 0.004);
    if (p.loop_gflops == 0.0) {
      EXPECT_EQ(p.kernel_gflops, 0.0);
      continue;
    }
    EXPECT_GT(p.kernel_gflops, 0.0);
    EXPECT_LT(p.kernel_gflops, 1e5);
    EXPECT_EQ(p.gflops(), std::max(p.loop_gflops, p.kernel_gflops));
    EXPECT_DOUBLE_EQ(p.kernel_share(), p.kernel_gflops / p.loop_gflops);
  }
  // The micro-kernel's FLOP count: 2 MR NR k per run, so twice the runs is twice the FLOPs.
  const double one = cpu::run_micro_kernel_in_l1(cpu::GemmPath::kF32, 3);
  EXPECT_GT(one, 0.0);
  EXPECT_DOUBLE_EQ(cpu::run_micro_kernel_in_l1(cpu::GemmPath::kF32, 6), 2 * one);
}

TEST(PerfPeak, CachedPeakIsMeasuredOnce) {
  const double a = fma_peak_gflops(1);
  EXPECT_EQ(fma_peak_gflops(1), a);
  if (active_simd_target() != SimdTarget::kScalar) {
    EXPECT_GT(a, 0.0);
  }
}

TEST(PerfPeak, AStalledMultiThreadProbeIsMeasuredAgain) {
  // One thread reads 100: two cores below 150 are suspect and measured again, at most twice.
  int calls = 0;
  auto again = [&](std::vector<double> reads) {
    calls = 0;
    return [&calls, reads] { return reads[static_cast<size_t>(calls++)]; };
  };
  EXPECT_EQ(detail::peak_despite_stalls(190, 100, 2, again({0})), 190);  // healthy: no retry
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(detail::peak_despite_stalls(90, 100, 2, again({195, 0})), 195);  // stalled once
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(detail::peak_despite_stalls(90, 100, 2, again({110, 120})), 120);  // SMT-like: stays low
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(detail::peak_despite_stalls(90, 100, 1, again({0})), 90);  // one core: 75 is enough
  EXPECT_EQ(calls, 0);
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
