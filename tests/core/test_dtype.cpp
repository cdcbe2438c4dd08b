// dtype conversions: exhaustive over all 65,536 bf16 and f16 bit patterns, plus rounding
// (ties to even) of f32 values checked against an exact reference computed in double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kiln/core/dtype.h"
#include "kiln/core/rng.h"

namespace kiln {
namespace {

// Exact value of an f16 pattern from its definition, in double.
double f16_exact(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

double bf16_exact(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 7) & 0xff;
  const int mant = h & 0x7f;
  if (exp == 0xff) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -133);
  return sign * std::ldexp(128 + mant, exp - 134);
}

TEST(DType, TableMatchesEnum) {
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_EQ(dtype_nbytes(DType::kI4, 3), 2);
  EXPECT_EQ(dtype_nbytes(DType::kF16, 3), 6);
  EXPECT_EQ(parse_dtype("fp16"), DType::kF16);
  EXPECT_FALSE(parse_dtype("f33").has_value());
}

TEST(DType, F16ToF32ExhaustiveAndRoundTrip) {
  for (uint32_t p = 0; p < 65536; ++p) {
    const uint16_t h = static_cast<uint16_t>(p);
    const float f = f16_to_f32(h);
    const double exact = f16_exact(h);
    if (std::isnan(exact)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << p;
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << std::hex << p;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), exact) << std::hex << p;
    ASSERT_EQ(std::signbit(f), (p >> 15) != 0) << std::hex << p;
    ASSERT_EQ(f32_to_f16(f), h) << "round trip of pattern " << std::hex << p;
  }
}

TEST(DType, Bf16ToF32ExhaustiveAndRoundTrip) {
  for (uint32_t p = 0; p < 65536; ++p) {
    const uint16_t h = static_cast<uint16_t>(p);
    const float f = bf16_to_f32(h);
    const double exact = bf16_exact(h);
    if (std::isnan(exact)) {
      ASSERT_TRUE(std::isnan(f));
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), exact) << std::hex << p;
    ASSERT_EQ(f32_to_bf16(f), h) << std::hex << p;
  }
}

// For every pair of adjacent finite patterns (same sign), the f32 midpoint must round to the
// even one, and values just inside either side must round to that side.
template <class ToF32, class FromF32>
void check_midpoints(ToF32 to_f32, FromF32 from_f32, uint16_t max_finite_mag) {
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t m = 0; m < max_finite_mag; ++m) {
      const uint16_t lo = static_cast<uint16_t>(sign | m), hi = static_cast<uint16_t>(sign | (m + 1));
      const double a = to_f32(lo), b = to_f32(hi);
      const double mid = 0.5 * (a + b);
      const float midf = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(midf), mid) << "midpoint must be exact in f32";
      const uint16_t even = (m & 1) ? hi : lo;
      ASSERT_EQ(from_f32(midf), even) << std::hex << m;
      const float below = std::nextafter(midf, static_cast<float>(a));
      const float above = std::nextafter(midf, static_cast<float>(b));
      ASSERT_EQ(from_f32(below), lo) << std::hex << m;
      ASSERT_EQ(from_f32(above), hi) << std::hex << m;
    }
  }
}

TEST(DType, F16RoundsToNearestEven) {
  check_midpoints([](uint16_t h) { return f16_exact(h); }, [](float f) { return f32_to_f16(f); }, 0x7bff);
  // Overflow: the midpoint between the largest finite (65504) and 65536 rounds to infinity.
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);      // half of smallest subnormal: even
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
}

TEST(DType, Bf16RoundsToNearestEven) {
  check_midpoints([](uint16_t h) { return bf16_exact(h); }, [](float f) { return f32_to_bf16(f); }, 0x7f7f);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(3.4028235e38f), 0x7f80);  // rounds up past the largest bf16
}

TEST(DType, F16MatchesHardwareConversionOnRandomValues) {
  // The compiler's _Float16 conversion is IEEE round-to-nearest-even: an independent reference.
#ifndef __FLT16_MAX__  // clang < 15 has no _Float16 on baseline x86-64 (the sanitizer build); gcc does
  GTEST_SKIP() << "this compiler has no _Float16 on this target";
#else
  Rng rng(1);
  for (int i = 0; i < 200000; ++i) {
    const float f = f32_from_bits(static_cast<uint32_t>(rng.next_u64()));
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    ASSERT_EQ(f32_to_f16(f), bits) << f;
  }
#endif
}

}  // namespace
}  // namespace kiln
