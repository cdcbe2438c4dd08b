// perf/roofline.h against hand-computed placements: this VM's 1-thread ceilings (117 GFLOP/s f32,
// 30 GB/s) and an f32 decode GEMM, 2m FLOPs per 4-byte weight element.
#include <gtest/gtest.h>

#include "kiln/perf/roofline.h"

namespace kiln::perf {
namespace {

TEST(Roofline, RidgeAndBothRoofs) {
  const Roofline r{117.0, 30.0};
  EXPECT_DOUBLE_EQ(r.ridge(), 3.9);
  // m = 1 decode: 2 FLOPs per 4 bytes = 0.5 FLOP/B, memory-bound at 0.5 * 30 = 15 GFLOP/s.
  EXPECT_DOUBLE_EQ(r.attainable(0.5), 15.0);
  EXPECT_TRUE(r.memory_bound(0.5));
  EXPECT_EQ(r.bound_name(0.5), "memory");
  // m = 8: 4 FLOP/B, just past the ridge: the compute roof.
  EXPECT_DOUBLE_EQ(r.attainable(4.0), 117.0);
  EXPECT_FALSE(r.memory_bound(4.0));
  EXPECT_EQ(r.bound_name(4.0), "compute");
  // At the ridge both roofs give the same bound.
  EXPECT_DOUBLE_EQ(r.attainable(r.ridge()), 117.0);
}

TEST(Roofline, UnknownCeilingsGiveNoBound) {
  EXPECT_EQ((Roofline{117.0, 0.0}).attainable(1.0), 0.0);
  EXPECT_EQ((Roofline{117.0, 0.0}).ridge(), 0.0);
  EXPECT_EQ((Roofline{0.0, 30.0}).attainable(1.0), 0.0);
  EXPECT_EQ((Roofline{117.0, 30.0}).attainable(0.0), 0.0);
}

}  // namespace
}  // namespace kiln::perf
