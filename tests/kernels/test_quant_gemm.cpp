// Exact checks of the quantized-GEMM references (the harness compares the fast paths with
// them): the int4 nibble order, the references against an independently written
// dequantize-then-f32-GEMM, W8A8 against int64 sums, per-token quantization on known values,
// and the op-boundary errors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/fp8.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/quant_gemm.h"
#include "tests/kernels/quant_test_util.h"

namespace kiln::testing {
namespace {

TEST(QuantGemmRef, Int4NibbleOrderAndZeroPoint) {
  // Byte 0 = 0x8F: element 0 = low nibble 0xF = -1, element 1 = high nibble 0x8 = -8;
  // byte 1 = 0x71: element 2 = 1, element 3 = 7. w = 0.5·(q − 1).
  const uint8_t data[] = {0x8F, 0x71};
  const float scale = 0.5f, zero = 1.0f;
  QuantWeight w{QuantFormat::kInt4, 1, 4, 4, data, &scale, &zero, false};
  ASSERT_TRUE(check_quant_weight(w).ok());
  EXPECT_EQ(quant_weight_element(w, 0, 0), -1.0f);
  EXPECT_EQ(quant_weight_element(w, 0, 1), -4.5f);
  EXPECT_EQ(quant_weight_element(w, 0, 2), 0.0f);
  EXPECT_EQ(quant_weight_element(w, 0, 3), 3.0f);
  const float x[] = {1, 2, 3, 4};
  float y_ref = 0, y_fast = 0;
  QuantGemmParams p{&w, 1, x, 4, &y_ref, 1, nullptr, nullptr, 0};
  ref::quant_gemm(p);
  EXPECT_EQ(y_ref, -1.0f - 9.0f + 0.0f + 12.0f);
  p.y = &y_fast;
  cpu::quant_gemm(p);
  EXPECT_EQ(y_fast, y_ref);
}

// Dequantization written out independently of quant_weight_element.
std::vector<float> naive_dequantize(const QuantWeight& w) {
  std::vector<float> out(static_cast<size_t>(w.out * w.in));
  const int64_t ng = w.per_tensor_scale ? 1 : w.in / w.group;
  for (int64_t j = 0; j < w.out; ++j)
    for (int64_t k = 0; k < w.in; ++k) {
      const int64_t g = w.per_tensor_scale ? 0 : k / w.group;
      const float s = w.per_tensor_scale ? w.scales[0] : w.scales[j * ng + g];
      const float z = w.zeros ? w.zeros[j * ng + g] : 0.0f;
      float q = 0;
      switch (w.format) {
        case QuantFormat::kInt8: q = static_cast<float>(static_cast<int8_t>(w.data[j * w.in + k])); break;
        case QuantFormat::kInt4: {
          const unsigned byte = w.data[(j * w.in + k) / 2];
          const unsigned nib = (k & 1) ? byte >> 4 : byte & 15u;
          q = static_cast<float>(static_cast<int>(nib ^ 8u) - 8);
          break;
        }
        case QuantFormat::kFp8E4M3: q = f8e4m3_to_f32(w.data[j * w.in + k]); break;
        case QuantFormat::kFp8E5M2: q = f8e5m2_to_f32(w.data[j * w.in + k]); break;
        case QuantFormat::kF16: q = f16_to_f32(static_cast<uint16_t>(w.data[2 * (j * w.in + k)] | w.data[2 * (j * w.in + k) + 1] << 8)); break;
        default: ADD_FAILURE();
      }
      out[j * w.in + k] = s * (q - z);
    }
  return out;
}

TEST(QuantGemmRef, MatchesDequantizeThenF32Gemm) {
  Rng rng(7);
  for (QuantFormat f : {QuantFormat::kInt8, QuantFormat::kInt4, QuantFormat::kFp8E4M3, QuantFormat::kFp8E5M2,
                        QuantFormat::kF16}) {
    const bool is_int = f == QuantFormat::kInt8 || f == QuantFormat::kInt4;
    const int64_t n = 3, out = 5, in = 64;
    OwnedQuantWeight o = random_quant_weight(rng, f, out, in, 16, is_int);
    if (is_int) {  // exact arithmetic: power-of-two scales, integer zeros, small integer x
      for (float& s : o.scales) s = 0.25f;
      for (float& z : o.zeros) z = std::round(z);
    }
    std::vector<float> x(static_cast<size_t>(n * in));
    for (float& v : x) v = static_cast<float>(static_cast<int>(rng.below(7)) - 3);
    const std::vector<float> wd = naive_dequantize(o.w);
    std::vector<float> y_naive(static_cast<size_t>(n * out)), y_ref(y_naive.size());
    GemmParams g;
    g.m = n; g.n = out; g.k = in;
    g.a = x.data(); g.lda = in;
    g.b = wd.data(); g.ldb = in; g.trans_b = true;
    g.c = y_naive.data(); g.ldc = out;
    ref::gemm(g);
    QuantGemmParams p{&o.w, n, x.data(), in, y_ref.data(), out, nullptr, nullptr, 0};
    ref::quant_gemm(p);
    for (size_t i = 0; i < y_ref.size(); ++i) {
      if (is_int) {
        EXPECT_EQ(y_ref[i], y_naive[i]) << quant_format_name(f) << " " << i;
      } else {
        EXPECT_NEAR(y_ref[i], y_naive[i], 1e-4 * (1 + std::fabs(y_naive[i]))) << quant_format_name(f) << " " << i;
      }
    }
  }
}

TEST(QuantGemmRef, W8A8MatchesInt64Sums) {
  Rng rng(9);
  const int64_t n = 2, out = 3, in = 300;
  OwnedQuantWeight o = random_quant_weight(rng, QuantFormat::kInt8, out, in, in, false);
  std::vector<int32_t> sums(out);
  w8a8_row_sums(o.w, sums.data());
  std::vector<int8_t> a(static_cast<size_t>(n * in));
  for (int8_t& v : a) v = static_cast<int8_t>(static_cast<int>(rng.below(256)) - 128);
  const float sa[] = {0.5f, 0.125f};
  std::vector<float> y(static_cast<size_t>(n * out)), y_fast(y.size());
  W8A8Params p;
  p.w = &o.w; p.w_row_sums = sums.data(); p.n = n; p.a = a.data(); p.lda = in; p.a_scales = sa;
  p.y = y.data(); p.ldy = out;
  ASSERT_TRUE(check_w8a8(p).ok());
  ref::w8a8_gemm(p);
  p.y = y_fast.data();
  cpu::w8a8_gemm(p);
  for (int64_t j = 0; j < out; ++j) {
    int64_t wsum = 0;
    for (int64_t k = 0; k < in; ++k) wsum += static_cast<int8_t>(o.data[j * in + k]);
    EXPECT_EQ(sums[j], wsum);
    for (int64_t i = 0; i < n; ++i) {
      int64_t s = 0;
      for (int64_t k = 0; k < in; ++k) s += int64_t{a[i * in + k]} * static_cast<int8_t>(o.data[j * in + k]);
      EXPECT_EQ(y[i * out + j], (sa[i] * o.scales[j]) * static_cast<float>(s));
      EXPECT_EQ(y_fast[i * out + j], y[i * out + j]);
    }
  }
}

TEST(QuantGemmRef, QuantizeRowsKnownValues) {
  // amax 2: scale 2/127, x·63.5 = 63.5 -> 64 (ties to even), -127, 31.75 -> 32, 0, -0.25·63.5 -> -16.
  const float x[] = {1.0f, -2.0f, 0.5f, 0.0f, -0.25f, 0, 0, 0, 0, 0};
  int8_t q[10];
  float s[2];
  ref::quantize_rows_int8(x, 2, 5, 5, q, 5, s);
  EXPECT_EQ(s[0], 2.0f / 127.0f);
  const int8_t want[] = {64, -127, 32, 0, -16};
  for (int k = 0; k < 5; ++k) EXPECT_EQ(q[k], want[k]) << k;
  EXPECT_EQ(s[1], 0.0f);
  for (int k = 5; k < 10; ++k) EXPECT_EQ(q[k], 0);
}

TEST(QuantGemmErrors, NamesTheProblem) {
  const uint8_t data[64] = {};
  const float scales[8] = {1, 1, 1, 1, 1, 1, 1, 1}, zeros[8] = {};
  QuantWeight w{QuantFormat::kInt8, 2, 12, 5, data, scales, nullptr, false};
  Status st = check_quant_weight(w);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("group size 5 does not divide in = 12"), std::string::npos) << st.message();
  w = {QuantFormat::kInt4, 2, 6, 3, data, scales, nullptr, false};
  EXPECT_NE(check_quant_weight(w).message().find("must be even"), std::string::npos);
  w = {QuantFormat::kFp8E4M3, 2, 8, 4, data, scales, zeros, false};
  EXPECT_NE(check_quant_weight(w).message().find("symmetric"), std::string::npos);
  w = {QuantFormat::kInt8, 2, 8, 8, nullptr, scales, nullptr, false};
  EXPECT_FALSE(check_quant_weight(w).ok());
  // W8A8 needs per-channel symmetric int8 and the row sums.
  w = {QuantFormat::kInt8, 2, 8, 4, data, scales, nullptr, false};
  int8_t a[8] = {};
  float sa = 1, y[2];
  int32_t sums[2] = {};
  W8A8Params p;
  p.w = &w; p.w_row_sums = sums; p.n = 1; p.a = a; p.lda = 8; p.a_scales = &sa; p.y = y; p.ldy = 2;
  EXPECT_NE(check_w8a8(p).message().find("per-channel"), std::string::npos) << check_w8a8(p).message();
  w.group = 8;
  EXPECT_TRUE(check_w8a8(p).ok()) << check_w8a8(p).message();
  p.w_row_sums = nullptr;
  EXPECT_NE(check_w8a8(p).message().find("w_row_sums"), std::string::npos);
  QuantGemmParams g{&w, 1, nullptr, 8, y, 2, nullptr, nullptr, 0};
  EXPECT_NE(check_quant_gemm(g).message().find("[quant_gemm]"), std::string::npos);
  g.x = reinterpret_cast<const float*>(data);
  g.ldx = 4;
  EXPECT_NE(check_quant_gemm(g).message().find("leading"), std::string::npos);
}

}  // namespace
}  // namespace kiln::testing
