// Exact checks of the block-quantized GEMM's packing and reference (the harness compares the
// fast paths with the reference): every code and scale survives packing, the reference equals
// an independently written dequantize-both-sides f32 product, per-block quantization on known
// values, and the op-boundary errors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/kernels/block_quant_gemm.h"
#include "tests/kernels/harness.h"
#include "tests/kernels/quant_test_util.h"

namespace kiln::testing {
namespace {

TEST(BlockQuantPack, KeepsEveryCodeAndRoundsScalesToHalves) {
  for (QuantFormat f : {QuantFormat::kInt8, QuantFormat::kInt4}) {
    Rng rng(3);
    const OwnedQuantWeight src = random_quant_weight(rng, f, 37, 96, 32, false);  // 3 tiles, the last 5 channels
    PackedBlockWeight packed;
    ASSERT_TRUE(pack_block_quant(src.w, &packed).ok());
    const BlockQuantWeight& w = packed.w;
    EXPECT_EQ(w.tiles(), 3);
    EXPECT_EQ(static_cast<int64_t>(packed.bytes.size()), w.bytes());
    for (int64_t j = 0; j < 37; ++j) {
      for (int64_t k = 0; k < 96; ++k) {
        const float s = src.scales[j * 3 + k / 32];
        const int q = static_cast<int>(std::lround(quant_weight_element(src.w, j, k) / s));
        ASSERT_EQ(block_quant_code(w, j, k), q) << quant_format_name(f) << " j=" << j << " k=" << k;
      }
      for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(block_quant_scale(w, j, b), f16_to_f32(f32_to_f16(src.scales[j * 3 + b])));
    }
    for (int64_t j = 37; j < 48; ++j)  // padding channels: zero scales
      EXPECT_EQ(block_quant_scale(w, j, 0), 0.0f);
  }
}

TEST(BlockQuantRef, EqualsDequantizedWeightsTimesDequantizedActivations) {
  for (QuantFormat f : {QuantFormat::kInt8, QuantFormat::kInt4}) {
    Rng rng(11);
    const int64_t n = 3, out = 19, in = 64, nb = 2;
    const OwnedQuantWeight src = random_quant_weight(rng, f, out, in, 32, false);
    PackedBlockWeight packed;
    ASSERT_TRUE(pack_block_quant(src.w, &packed).ok());
    const std::vector<float> x = random_vector(rng, static_cast<size_t>(n * in));
    std::vector<int8_t> q(static_cast<size_t>(n * in));
    std::vector<float> da(static_cast<size_t>(n * nb));
    std::vector<int32_t> sums(da.size());
    ref::quantize_blocks_int8(x.data(), n, in, in, q.data(), in, da.data(), sums.data());
    std::vector<float> y(static_cast<size_t>(n * out));
    BlockQuantGemmParams p;
    p.w = &packed.w;
    p.n = n;
    p.x = x.data();
    p.ldx = in;
    p.y = y.data();
    p.ldy = out;
    ref::block_quant_gemm(p);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) {
        double want = 0;
        for (int64_t k = 0; k < in; ++k) {
          const double wv = block_quant_scale(packed.w, j, k / 32) * block_quant_code(packed.w, j, k);
          want += wv * (static_cast<double>(da[i * nb + k / 32]) * q[i * in + k]);
        }
        EXPECT_NEAR(y[i * out + j], want, 1e-5 * (1 + std::fabs(want))) << i << "," << j;
      }
  }
}

TEST(BlockQuantRef, QuantizesEachBlockOnItsOwnScale) {
  std::vector<float> x(64, 0.0f);
  x[0] = 2.0f;     // block 0: amax 2 → da = 2/127, x · 63.5
  x[1] = -1.0f;    // -63.5 → -64 (half to even)
  x[2] = 0.5f;     // 31.75 → 32
  x[33] = -0.25f;  // block 1: amax 0.25 → -127
  x[34] = 0.125f;  // 63.5 → 64
  std::vector<int8_t> q(64);
  float da[2];
  int32_t sums[2];
  ref::quantize_blocks_int8(x.data(), 1, 64, 64, q.data(), 64, da, sums);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);
  EXPECT_EQ(q[2], 32);
  EXPECT_EQ(q[33], -127);
  EXPECT_EQ(q[34], 64);
  EXPECT_EQ(da[0], 2.0f / 127.0f);
  EXPECT_EQ(da[1], 0.25f / 127.0f);
  EXPECT_EQ(sums[0], 127 - 64 + 32);
  EXPECT_EQ(sums[1], -127 + 64);
  std::vector<float> zeros(32, 0.0f);
  ref::quantize_blocks_int8(zeros.data(), 1, 32, 32, q.data(), 32, da, sums);
  EXPECT_EQ(da[0], 0.0f);
  EXPECT_EQ(sums[0], 0);
}

TEST(BlockQuantPack, RefusesWeightsOutsideTheRecipeByName) {
  Rng rng(5);
  const OwnedQuantWeight g64 = random_quant_weight(rng, QuantFormat::kInt4, 4, 128, 64, false);
  const OwnedQuantWeight zp = random_quant_weight(rng, QuantFormat::kInt8, 4, 64, 32, true);
  const OwnedQuantWeight fp8 = random_quant_weight(rng, QuantFormat::kFp8E4M3, 4, 64, 32, false);
  const OwnedQuantWeight pt = random_quant_weight(rng, QuantFormat::kInt8, 4, 64, 32, false, true);
  PackedBlockWeight packed;
  const std::pair<const OwnedQuantWeight*, const char*> bad[] = {
      {&g64, "group=64"}, {&zp, "zeros=true"}, {&fp8, "fp8_e4m3"}, {&pt, "per_tensor=true"}};
  for (const auto& [w, what] : bad) {
    const Status s = pack_block_quant(w->w, &packed);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    EXPECT_FALSE(block_quant_packable(w->w));
  }
  BlockQuantWeight odd;
  odd.out = 4;
  odd.in = 40;
  const std::vector<uint8_t> bytes(4096, 0);
  odd.data = bytes.data();
  float x[40] = {}, y[4];
  BlockQuantGemmParams p{&odd, 1, x, 40, y, 4, nullptr, nullptr, 0};
  const Status s = check_block_quant_gemm(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("multiple of 32"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kiln::testing
