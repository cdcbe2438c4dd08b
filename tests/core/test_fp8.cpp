// fp8 E4M3 / E5M2 and TF32 conversions: every one of the 256 fp8 patterns decoded against the
// format's definition in double and round-tripped; f32 -> fp8 checked against a float64
// nearest-value search (ties to even) on random values and on every midpoint; saturation,
// NaN and infinity; TF32 rounding against the same kind of reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/rng.h"
#include "kiln/core/tensor.h"

namespace kiln {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The value of a pattern from the OCP fp8 definition, in double.
double e4m3_exact(uint8_t v) {
  const double sign = (v & 0x80) ? -1.0 : 1.0;
  const int exp = (v >> 3) & 0xf, mant = v & 0x7;
  if (exp == 0xf && mant == 0x7) return kNaN;  // S.1111.111: the only NaNs, no infinity
  if (exp == 0) return sign * std::ldexp(mant, -9);            // mant/8 · 2^(1-7)
  return sign * std::ldexp(8 + mant, exp - 7 - 3);             // (1 + mant/8) · 2^(exp-7)
}

double e5m2_exact(uint8_t v) {
  const double sign = (v & 0x80) ? -1.0 : 1.0;
  const int exp = (v >> 2) & 0x1f, mant = v & 0x3;
  if (exp == 0x1f) return mant ? kNaN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -16);           // mant/4 · 2^(1-15)
  return sign * std::ldexp(4 + mant, exp - 15 - 2);
}

struct Fp8Case {
  const char* name;
  double (*exact)(uint8_t);
  float (*decode)(uint8_t);
  uint8_t (*encode)(float, bool);
  uint8_t max_pattern;  // largest finite magnitude pattern
  double max_value;
  bool has_inf;
};

const Fp8Case kCases[] = {
    {"e4m3", e4m3_exact, f8e4m3_to_f32, f32_to_f8e4m3, 0x7e, 448.0, false},
    {"e5m2", e5m2_exact, f8e5m2_to_f32, f32_to_f8e5m2, 0x7b, 57344.0, true},
};

// The float64 reference: the nearest finite fp8 value to x by searching all patterns, ties to
// the even pattern (mantissa lsb 0). Past the largest finite value the format would continue
// with max + gap (pattern max_pattern + 1); rounding there is overflow: NaN (E4M3) or inf
// (E5M2), or ±max when saturating.
uint8_t reference_encode(const Fp8Case& c, double x, bool saturate) {
  if (std::isnan(x)) return 0;  // not used for NaN
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  const double gap = c.exact(c.max_pattern) - c.exact(c.max_pattern - 1);
  uint32_t best = c.max_pattern + 1u;  // at or past the virtual next value: overflow
  double best_err = a >= c.max_value + gap ? 0.0 : INFINITY;
  for (uint32_t p = 0; p <= static_cast<uint32_t>(c.max_pattern) + 1; ++p) {
    const double v = p <= c.max_pattern ? c.exact(static_cast<uint8_t>(p)) : c.max_value + gap;
    const double err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (p & 1u) == 0)) {
      best = p;
      best_err = err;
    }
  }
  if (std::isinf(a) || best > c.max_pattern) {
    if (saturate) return sign | c.max_pattern;
    return sign | (c.has_inf ? static_cast<uint8_t>(c.max_pattern + 1) : 0x7f);
  }
  return sign | static_cast<uint8_t>(best);
}

TEST(Fp8, DecodeExhaustiveMatchesDefinitionAndRoundTrips) {
  for (const Fp8Case& c : kCases) {
    int num_nan = 0, num_inf = 0;
    for (uint32_t p = 0; p < 256; ++p) {
      const uint8_t v = static_cast<uint8_t>(p);
      const float f = c.decode(v);
      const double exact = c.exact(v);
      if (std::isnan(exact)) {
        ++num_nan;
        ASSERT_TRUE(std::isnan(f)) << c.name << " " << p;
        ASSERT_TRUE(std::isnan(c.decode(c.encode(f, false)))) << c.name << " " << p;
        ASSERT_TRUE(std::isnan(c.decode(c.encode(f, true)))) << c.name << " " << p;
        continue;
      }
      if (std::isinf(exact)) ++num_inf;
      ASSERT_EQ(static_cast<double>(f), exact) << c.name << " pattern " << p;
      ASSERT_EQ(std::signbit(f), (p & 0x80) != 0) << c.name << " " << p;
      ASSERT_EQ(c.encode(f, false), v) << c.name << " round trip of pattern " << p;
      if (!std::isinf(exact)) {
        ASSERT_EQ(c.encode(f, true), v) << c.name << " saturating round trip " << p;
      }
    }
    EXPECT_EQ(num_nan, c.has_inf ? 6 : 2) << c.name;  // E5M2: 3 NaN mantissas per sign
    EXPECT_EQ(num_inf, c.has_inf ? 2 : 0) << c.name;
    EXPECT_EQ(c.decode(c.max_pattern), c.max_value) << c.name;
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(f8e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_EQ(f8e5m2_to_f32(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(f8e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(f8e5m2_to_f32(0x7c), INFINITY);
  EXPECT_EQ(f8e5m2_to_f32(0xfc), -INFINITY);
}

// Every midpoint between adjacent finite values (from 0 up to the overflow midpoint) rounds to
// the even pattern; the f32 values just below and above it round down and up.
TEST(Fp8, RoundsAllMidpointsToNearestEven) {
  for (const Fp8Case& c : kCases) {
    for (bool saturate : {false, true}) {
      for (uint8_t sign : {0x00, 0x80}) {
        for (uint32_t m = 0; m <= c.max_pattern; ++m) {
          const double a = c.exact(static_cast<uint8_t>(m));
          const double b = m < c.max_pattern ? c.exact(static_cast<uint8_t>(m + 1))
                                             : 2 * a - c.exact(static_cast<uint8_t>(m - 1));
          const double mid = (sign ? -0.5 : 0.5) * (a + b);
          const float midf = static_cast<float>(mid);
          ASSERT_EQ(static_cast<double>(midf), mid) << "midpoints are exact in f32";
          const uint8_t got = c.encode(midf, saturate);
          ASSERT_EQ(got, reference_encode(c, mid, saturate)) << c.name << " midpoint above " << m;
          const float below = std::nextafter(midf, 0.0f);
          const float above = std::nextafter(midf, sign ? -INFINITY : INFINITY);
          ASSERT_EQ(c.encode(below, saturate), sign | m) << c.name << " below midpoint " << m;
          ASSERT_EQ(c.encode(above, saturate), reference_encode(c, above, saturate)) << c.name << " " << m;
          if (m < c.max_pattern) {
            ASSERT_EQ(c.encode(above, saturate), sign | (m + 1)) << c.name << " " << m;
          }
        }
      }
    }
  }
  // The named edges: E4M3's overflow midpoint 464 is a tie that goes to the even 448; just
  // above it rounds toward 480, which does not exist: NaN (or 448 saturating). E5M2's 61440 is
  // a tie that goes to the even 2^16: infinity.
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(465.0f), 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(465.0f, true), 0x7e);
  EXPECT_EQ(f32_to_f8e5m2(61439.0f), 0x7b);
  EXPECT_EQ(f32_to_f8e5m2(61440.0f), 0x7c);
  EXPECT_EQ(f32_to_f8e5m2(61440.0f, true), 0x7b);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: even
  EXPECT_EQ(f32_to_f8e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(f32_to_f8e5m2(-std::ldexp(1.0f, -17)), 0x80);  // -0
}

TEST(Fp8, MatchesFloat64ReferenceOnRandomValues) {
  Rng rng(58);
  for (const Fp8Case& c : kCases) {
    for (int i = 0; i < 60000; ++i) {
      // Random sign and mantissa, exponent spread from below the smallest subnormal to above
      // the largest value, so every branch (zero, subnormal, normal, overflow) is exercised.
      const int lo = c.has_inf ? -19 : -12, hi = c.has_inf ? 17 : 10;
      const int e = lo + static_cast<int>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
      const uint32_t bits = static_cast<uint32_t>(rng.next_u64());
      const float f = f32_from_bits((bits & 0x807fffffu) | static_cast<uint32_t>(e + 127) << 23);
      for (bool saturate : {false, true}) {
        ASSERT_EQ(c.encode(f, saturate), reference_encode(c, f, saturate))
            << c.name << " x=" << f << " saturate=" << saturate;
      }
    }
    // And raw random f32 patterns (mostly far outside the range).
    for (int i = 0; i < 20000; ++i) {
      const float f = f32_from_bits(static_cast<uint32_t>(rng.next_u64()));
      if (std::isnan(f)) continue;
      ASSERT_EQ(c.encode(f, false), reference_encode(c, f, false)) << c.name << " x=" << f;
    }
  }
}

TEST(Fp8, SaturationNaNAndInfinity) {
  // Non-saturating: E4M3 has no infinity, so overflow and ±inf become NaN; E5M2 gives ±inf.
  EXPECT_EQ(f32_to_f8e4m3(1e6f), 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(-1e6f), 0xff);
  EXPECT_EQ(f32_to_f8e4m3(INFINITY), 0x7f);
  EXPECT_EQ(f32_to_f8e5m2(1e6f), 0x7c);
  EXPECT_EQ(f32_to_f8e5m2(-INFINITY), 0xfc);
  // Saturating: clamp to ±max, infinities included; NaN stays NaN.
  EXPECT_EQ(f32_to_f8e4m3(1e6f, true), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY, true), 0xfe);
  EXPECT_EQ(f32_to_f8e5m2(3e38f, true), 0x7b);
  EXPECT_EQ(f32_to_f8e5m2(INFINITY, true), 0x7b);
  for (bool saturate : {false, true}) {
    EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f32_to_f8e4m3(NAN, saturate))));
    EXPECT_TRUE(std::isnan(f8e5m2_to_f32(f32_to_f8e5m2(-NAN, saturate))));
  }
  // In range, both modes agree.
  for (float x : {0.0f, -0.0f, 1.0f, -3.3f, 447.9f, 1e-3f, 57000.0f})
    EXPECT_EQ(f32_to_f8e5m2(x, false), f32_to_f8e5m2(x, true)) << x;
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
}

TEST(Fp8, TensorStoresAndLoads) {
  auto t = Tensor::from_floats(Shape{4}, std::vector<float>{1.0f, 0.3f, 500.0f, -1e-5f}, DType::kF8E4M3);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->to_floats()[0], 1.0f);
  EXPECT_EQ(t->to_floats()[1], f8e4m3_to_f32(f32_to_f8e4m3(0.3f)));
  EXPECT_TRUE(std::isnan(t->to_floats()[2]));  // 500 overflows E4M3: NaN
  EXPECT_EQ(t->to_floats()[3], 0.0f);
  auto u = t->to(DType::kF8E5M2);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->to_floats()[0], 1.0f);
  EXPECT_EQ(u->to_floats()[1], f8e5m2_to_f32(f32_to_f8e5m2(f8e4m3_to_f32(f32_to_f8e4m3(0.3f)))));
}

// ---- TF32 -----------------------------------------------------------------------------------

// Reference: of the two TF32 neighbours of x (low 13 bits cleared, and one TF32 step further
// from zero), the nearer in double; ties to the even one (bit 13 clear).
float reference_tf32(float x) {
  if (std::isinf(x)) return x;
  const uint32_t u = f32_bits(x);
  const uint32_t lo = u & ~0x1fffu, hi = lo + 0x2000u;
  // Past the largest TF32 the next step is 2^128 (unbounded exponent), which rounds to inf.
  const double hi_value = (hi & 0x7fffffffu) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), x)
                                                            : static_cast<double>(f32_from_bits(hi));
  const double dl = std::fabs(static_cast<double>(f32_from_bits(lo)) - x);
  const double dh = std::fabs(hi_value - x);
  if (dl < dh || (dl == dh && (lo & 0x2000u) == 0)) return f32_from_bits(lo);
  return f32_from_bits(hi);
}

TEST(Tf32, RoundToNearestEvenMatchesReference) {
  Rng rng(32);
  for (int i = 0; i < 300000; ++i) {
    const float x = f32_from_bits(static_cast<uint32_t>(rng.next_u64()));
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(round_to_tf32(x)));
      continue;
    }
    const float r = round_to_tf32(x);
    ASSERT_EQ(f32_bits(r), f32_bits(reference_tf32(x))) << x;
    ASSERT_EQ(f32_bits(r) & 0x1fffu, 0u);
    ASSERT_EQ(round_to_tf32(r), r) << "idempotent";
  }
  // Ties: 1 + 2^-11 is halfway between 1 and 1 + 2^-10: to even (1); 1 + 3·2^-11 goes up.
  EXPECT_EQ(round_to_tf32(1.0f + std::ldexp(1.0f, -11)), 1.0f);
  EXPECT_EQ(round_to_tf32(1.0f + 3 * std::ldexp(1.0f, -11)), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(round_to_tf32(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(round_to_tf32(INFINITY), INFINITY);
  EXPECT_EQ(round_to_tf32(3.4028235e38f), INFINITY);                 // past the largest TF32
  EXPECT_EQ(round_to_tf32(f32_from_bits(0x7f7fe000u)), f32_from_bits(0x7f7fe000u));
  EXPECT_EQ(round_to_tf32(std::ldexp(1.0f, -136)), std::ldexp(1.0f, -136));  // smallest subnormal
  EXPECT_EQ(round_to_tf32(std::ldexp(1.0f, -137)), 0.0f);                     // its half: even
  EXPECT_EQ(round_to_tf32(std::ldexp(3.0f, -138)), std::ldexp(1.0f, -136));
  EXPECT_TRUE(std::isnan(round_to_tf32(NAN)));
}

// The GEMM input mode: a dot product of TF32-rounded inputs with f32 accumulation has a
// relative error of about 2^-11 per input (two inputs per product), independent of the sum.
TEST(Tf32, GemmInputModeErrorIsTf32UnitRoundoff) {
  Rng rng(7);
  const int64_t k = 4096;
  std::vector<float> a(k), b(k), at(k), bt(k);
  rng.fill_normal(a);
  rng.fill_normal(b);
  round_to_tf32_array(at.data(), a.data(), k);
  round_to_tf32_array(bt.data(), b.data(), k);
  double exact = 0, abs_sum = 0, tf32_exact = 0;
  for (int64_t i = 0; i < k; ++i) {
    exact += static_cast<double>(a[i]) * b[i];
    abs_sum += std::fabs(static_cast<double>(a[i]) * b[i]);
    tf32_exact += static_cast<double>(at[i]) * bt[i];
    ASSERT_LE(std::fabs(at[i] - a[i]), std::ldexp(std::fabs(a[i]), -11));  // |δ| <= u = 2^-11
  }
  // Bound: each product is off by at most (2u + u²)|ab|, u = 2^-11.
  const double u = std::ldexp(1.0, -11);
  EXPECT_LE(std::fabs(tf32_exact - exact), (2 * u + u * u) * abs_sum);
  // And the rounding is really there: the error is far above f32's own.
  EXPECT_GT(std::fabs(tf32_exact - exact), 1e-3 * u * abs_sum);
}

}  // namespace
}  // namespace kiln
