// `kiln info --formats` numbers: the precision and range each format's implementation yields
// when probed (float_formats.cpp) must be the known ones — significant bits p, machine epsilon
// 2^(1-p), unit roundoff 2^-p, largest finite, smallest normal, smallest subnormal.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kiln/core/dtype.h"
#include "kiln/core/float_formats.h"

namespace kiln {
namespace {

struct Known {
  const char* name;
  int p;
  double largest, smallest_normal, smallest_subnormal;
  bool has_inf;
};

TEST(FloatFormats, MeasuredValuesMatchKnownOnes) {
  const Known known[] = {
      {"f32", 24, std::ldexp(2.0 - std::ldexp(1.0, -23), 127), std::ldexp(1.0, -126), std::ldexp(1.0, -149), true},
      {"tf32", 11, std::ldexp(2.0 - std::ldexp(1.0, -10), 127), std::ldexp(1.0, -126), std::ldexp(1.0, -136), true},
      {"bf16", 8, std::ldexp(2.0 - std::ldexp(1.0, -7), 127), std::ldexp(1.0, -126), std::ldexp(1.0, -133), true},
      {"f16", 11, 65504.0, std::ldexp(1.0, -14), std::ldexp(1.0, -24), true},
      {"f8e4m3", 4, 448.0, std::ldexp(1.0, -6), std::ldexp(1.0, -9), false},
      {"f8e5m2", 3, 57344.0, std::ldexp(1.0, -14), std::ldexp(1.0, -16), true},
  };
  const auto infos = float_format_infos();
  ASSERT_EQ(infos.size(), std::size(known));
  for (size_t i = 0; i < infos.size(); ++i) {
    const FloatFormatInfo& f = infos[i];
    const Known& k = known[i];
    SCOPED_TRACE(k.name);
    EXPECT_EQ(f.name, k.name);
    EXPECT_EQ(f.significant_bits, k.p);
    EXPECT_EQ(f.epsilon, std::ldexp(1.0, 1 - k.p));     // machine epsilon 2^(1-p)
    EXPECT_EQ(f.unit_roundoff, std::ldexp(1.0, -k.p));  // unit roundoff 2^-p
    EXPECT_EQ(f.largest_finite, k.largest);
    EXPECT_EQ(f.smallest_normal, k.smallest_normal);
    EXPECT_EQ(f.smallest_subnormal, k.smallest_subnormal);
    EXPECT_EQ(f.has_infinity, k.has_inf);
  }
}

// p agrees with the dtype table's layout (p = stored fraction bits + 1), and the unit roundoff
// is the largest relative rounding error: 1 + u is a tie that rounds to 1 (even), anything above
// it rounds to 1 + epsilon.
TEST(FloatFormats, UnitRoundoffIsTheRoundingErrorBound) {
  for (const FloatCodec& c : float_codecs()) {
    const FloatFormatInfo f = measure_float_format(c);
    SCOPED_TRACE(std::string(c.name));
    if (auto t = parse_dtype(c.name)) {
      EXPECT_EQ(f.significant_bits, dtype_traits(*t).mantissa_bits + 1);
    }
    const auto round = [&](float x) { return c.decode(c.encode(x)); };
    const float u = static_cast<float>(f.unit_roundoff), eps = static_cast<float>(f.epsilon);
    if (c.bits < 32) {  // f32 itself cannot hold 1 + u exactly; for it the hardware rounds
      EXPECT_EQ(round(1.0f + u), 1.0f);
      EXPECT_EQ(round(std::nextafter(1.0f + u, 2.0f)), 1.0f + eps);
    } else {
      EXPECT_EQ(1.0f + u, 1.0f);
    }
  }
}

}  // namespace
}  // namespace kiln
