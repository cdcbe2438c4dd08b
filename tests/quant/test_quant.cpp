// Quantization: schemes, packing, calibration ranges, GPTQ, AWQ/SmoothQuant folding, QAT's
// straight-through mask, the quantized backends against their dequantized weights, and the
// quantized model format (save, load, identical logits; bad files give errors).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "kiln/core/rng.h"
#include "kiln/kernels/gemm.h"
#include "kiln/model/weights.h"
#include "kiln/quant/calibrate.h"
#include "kiln/quant/gptq.h"
#include "kiln/quant/qat.h"
#include "kiln/quant/qlinear.h"
#include "kiln/quant/qmodel.h"
#include "kiln/quant/scheme.h"
#include "kiln/quant/smooth.h"

namespace kiln::quant {
namespace {

std::vector<float> randn(int64_t n, uint64_t seed, float std = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng rng(seed);
  rng.fill_normal(v, 0.0f, std);
  return v;
}

// y (n, out) = x (n, in) wᵀ.
std::vector<float> matmul_t(const std::vector<float>& x, const std::vector<float>& w, int64_t n, int64_t in,
                            int64_t out) {
  std::vector<float> y(static_cast<size_t>(n * out));
  GemmParams p;
  p.m = n; p.n = out; p.k = in;
  p.a = x.data(); p.lda = in;
  p.b = w.data(); p.ldb = in; p.trans_b = true;
  p.c = y.data(); p.ldc = out;
  ref::gemm(p);
  return y;
}

double sq_err(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return e;
}

QuantScheme scheme(int bits, int64_t group, bool sym) {
  QuantScheme s;
  s.bits = bits;
  s.group = group;
  s.symmetric = sym;
  return s;
}

TEST(QuantScheme, RoundTripWithinHalfStep) {
  const int64_t rows = 7, cols = 256;
  const auto w = randn(rows * cols, 1);
  for (int bits : {2, 3, 4, 8})
    for (int64_t group : {int64_t{64}, QuantScheme::kPerChannel, QuantScheme::kPerTensor})
      for (bool sym : {false, true}) {
        const QuantScheme s = scheme(bits, group, sym);
        const QTensor q = quantize_rtn(w.data(), rows, cols, s);
        const auto back = q.dequantize();
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t pi = q.param_index(r, c);
            ASSERT_LE(q.codes[r * cols + c], s.qmax());
            // Min-max ranges cover every value: the error is at most half a step.
            EXPECT_LE(std::fabs(w[r * cols + c] - back[r * cols + c]), 0.5f * q.scales[pi] * 1.0001f)
                << s.describe() << " r " << r << " c " << c;
          }
      }
}

TEST(QuantScheme, SymmetricZeroIsExactAndGridIsShared) {
  const QuantScheme s = scheme(4, 32, true);
  std::vector<float> w = randn(64, 2);
  w[5] = 0.0f;
  const QTensor q = quantize_rtn(w.data(), 1, 64, s);
  EXPECT_EQ(q.value(0, 5), 0.0f);
  for (float z : q.zeros) EXPECT_EQ(z, 8.0f);
}

TEST(QuantScheme, PackingRoundTrips) {
  for (int bits : {2, 3, 4, 8}) {
    const int64_t rows = 3, cols = 37;  // odd: rows end mid-byte
    std::vector<uint8_t> codes(rows * cols);
    Rng rng(bits);
    for (auto& c : codes) c = static_cast<uint8_t>(rng.below(1u << bits));
    const auto packed = pack_codes(codes.data(), rows, cols, bits);
    EXPECT_EQ(static_cast<int64_t>(packed.size()), rows * ((cols * bits + 7) / 8));
    EXPECT_EQ(unpack_codes(packed.data(), rows, cols, bits), codes) << bits;
  }
  // 4-bit: the even column in the low nibble.
  const uint8_t two[2] = {0x3, 0xA};
  EXPECT_EQ(pack_codes(two, 1, 2, 4)[0], 0xA3);
}

TEST(QuantCalibration, RangesOnKnownDistributions) {
  // Uniform on [-1, 1]: min-max is right and the MSE range barely clips.
  std::vector<float> u(20000);
  Rng rng(3);
  rng.fill_uniform(u, -1.0f, 1.0f);
  QuantScheme s = scheme(8, QuantScheme::kPerTensor, true);
  float lo, hi;
  choose_range(s, u, lo, hi);
  EXPECT_NEAR(hi, 1.0f, 1e-3);
  s.range = RangeMethod::kMse;
  choose_range(s, u, lo, hi);
  EXPECT_GT(hi, 0.95f);
  // Gaussian with a few huge outliers: the percentile and MSE ranges clip them, and trade a
  // little clipping error for much less rounding error, lowering the total at 4 bits.
  std::vector<float> g = randn(20000, 4);
  for (int i = 0; i < 5; ++i) g[static_cast<size_t>(i) * 997] = 60.0f;
  s = scheme(4, QuantScheme::kPerTensor, true);
  float mlo, mhi;
  choose_range(s, g, mlo, mhi);
  EXPECT_NEAR(mhi, 60.0f, 1e-3);
  const ErrorSplit em = split_error(s, g, mlo, mhi);
  EXPECT_EQ(em.clipped, 0);
  EXPECT_EQ(em.clip_mse, 0.0);
  s.range = RangeMethod::kPercentile;
  s.percentile = 99.9;
  choose_range(s, g, lo, hi);
  EXPECT_NEAR(hi, 3.29f, 0.3f);  // the 99.9th percentile of |N(0,1)|
  s.range = RangeMethod::kMse;
  choose_range(s, g, lo, hi);
  EXPECT_LT(hi, 0.6f * mhi);
  const ErrorSplit e = split_error(s, g, lo, hi);
  EXPECT_GT(e.clipped, 0);
  EXPECT_GT(e.clip_mse, 0.0);
  EXPECT_LT(e.clip_mse + e.round_mse, em.round_mse);
}

TEST(QuantGptq, CholeskyInverseFactor) {
  const int64_t n = 9;
  const auto a = randn(n * 2 * n, 5);
  std::vector<double> h(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < 2 * n; ++k) h[i * n + j] += static_cast<double>(a[k * n + i]) * a[k * n + j];
  std::vector<double> u;
  ASSERT_TRUE(inverse_upper_cholesky(h, n, u));
  // (Uᵀ U) H = I
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t k = 0; k < n; ++k) {
        double hinv_ik = 0;
        for (int64_t m = 0; m < n; ++m) hinv_ik += u[m * n + i] * u[m * n + k];
        s += hinv_ik * h[k * n + j];
      }
      EXPECT_NEAR(s, i == j ? 1.0 : 0.0, 1e-9);
    }
  for (int64_t i = 1; i < n; ++i) EXPECT_EQ(u[i * n + 0], 0.0);  // upper triangular
  std::vector<double> bad(n * n, 0.0);
  EXPECT_FALSE(inverse_upper_cholesky(bad, n, u));
}

// Correlated inputs x = z A (a random mixing), the setting where GPTQ's error feedback pays.
struct Toy {
  int64_t n = 512, in = 128, out = 48;
  std::vector<float> x, w, h;
  Toy() {
    const auto z = randn(n * in, 6);
    const auto a = randn(in * in, 7, 0.15f);
    x.assign(n * in, 0.0f);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t k = 0; k < in; ++k) {
        float s = z[r * in + k];
        for (int64_t j = 0; j < in; ++j) s += z[r * in + j] * a[j * in + k];
        x[r * in + k] = s;
      }
    w = randn(out * in, 8, 0.05f);
    h.assign(in * in, 0.0f);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t j = 0; j < in; ++j) h[i * in + j] += 2.0f / n * x[r * in + i] * x[r * in + j];
  }
};

TEST(QuantGptq, BeatsRtnOnCorrelatedInputs) {
  Toy t;
  const auto y = matmul_t(t.x, t.w, t.n, t.in, t.out);
  for (int bits : {3, 4})
    for (bool act_order : {false, true}) {
      const QuantScheme s = scheme(bits, 32, false);
      const auto rtn = quantize_rtn(t.w.data(), t.out, t.in, s).dequantize();
      GptqOptions o;
      o.block = 16;  // several blocks: the lazy batch update is exercised
      o.act_order = act_order;
      auto g = gptq_quantize(t.w.data(), t.out, t.in, t.h.data(), s, o);
      ASSERT_TRUE(g.ok()) << g.status().message();
      const double e_rtn = sq_err(matmul_t(t.x, rtn, t.n, t.in, t.out), y);
      const double e_gptq = sq_err(matmul_t(t.x, g->q.dequantize(), t.n, t.in, t.out), y);
      EXPECT_LT(e_gptq, 0.8 * e_rtn) << bits << " bits, act_order " << act_order;
    }
}

TEST(QuantGptq, EqualsRtnWhenHessianIsDiagonal) {
  // Diagonal H: U is diagonal, no error is pushed anywhere, and each group's parameters come
  // from unchanged columns — exactly RTN (with or without act order).
  const int64_t out = 16, in = 64;
  const auto w = randn(out * in, 9);
  std::vector<float> h(in * in, 0.0f);
  Rng rng(10);
  for (int64_t i = 0; i < in; ++i) h[i * in + i] = 0.5f + rng.uniform();
  for (int64_t group : {int64_t{16}, QuantScheme::kPerChannel})
    for (bool act_order : {false, true}) {
      const QuantScheme s = scheme(4, group, false);
      GptqOptions o;
      o.block = 8;
      o.act_order = act_order;
      auto g = gptq_quantize(w.data(), out, in, h.data(), s, o);
      ASSERT_TRUE(g.ok());
      const QTensor r = quantize_rtn(w.data(), out, in, s);
      EXPECT_EQ(g->q.codes, r.codes);
      EXPECT_EQ(g->q.scales, r.scales);
    }
}

TEST(QuantBackend, MatchesDequantizedWeights) {
  for (auto [in, out, n] : {std::tuple<int64_t, int64_t, int64_t>{256, 40, 1}, {256, 40, 3}, {256, 40, 20},
                            {384, 128, 64}}) {
  const auto w = randn(out * in, 11, 0.1f);
  const auto bias = randn(out, 12);
  {
    const auto x = randn(n * in, 13);
    struct Case { QuantScheme s; ActQuant act; };
    std::vector<Case> cases = {{scheme(4, 128, false), ActQuant::kNone}, {scheme(3, 64, false), ActQuant::kNone},
                               {scheme(2, 32, true), ActQuant::kNone},   {scheme(8, 0, true), ActQuant::kNone},
                               {scheme(8, -1, false), ActQuant::kNone},  {scheme(8, 0, true), ActQuant::kInt8}};
    QuantScheme f8;
    f8.format = QFormat::kFp8E4M3;
    f8.bits = 8;
    f8.group = QuantScheme::kPerChannel;
    cases.push_back({f8, ActQuant::kNone});
    cases.push_back({f8, ActQuant::kFp8});
    for (const Case& c : cases) {
      const QTensor q = quantize_rtn(w.data(), out, in, c.s);
      std::vector<float> wd = q.dequantize();
      Linear l;
      l.in = in; l.out = out; l.w = wd.data(); l.b = bias.data();
      QuantizedLinear ql(q, c.act);
      std::vector<float> y(n * out), yr(n * out);
      const auto resid = randn(n * out, 14);
      ql.forward(l, y.data(), x.data(), n, resid.data());
      std::vector<float> xa = x;
      if (c.act == ActQuant::kInt8) fake_quantize_rows(xa.data(), n, in, QFormat::kInt, 8);
      if (c.act == ActQuant::kFp8) fake_quantize_rows(xa.data(), n, in, QFormat::kFp8E4M3, 8);
      l.forward_f32(yr.data(), xa.data(), n, resid.data());
      double ref = 0;
      for (float v : yr) ref += static_cast<double>(v) * v;
      EXPECT_LT(sq_err(y, yr), 1e-8 * ref) << c.s.describe() << " act " << act_quant_name(c.act) << " n " << n
                                            << " in " << in << " out " << out;
    }
  }
  }
}

// A tiny Llama with GQA for model-level tests.
std::unique_ptr<Transformer> tiny_llama(uint64_t seed) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = 64; c.d_model = 64; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 128;
  c.max_seq_len = 32; c.tied_embeddings = false;
  auto m = Transformer::create(c, seed);
  KILN_CHECK(m.ok());
  // Make the norms non-trivial so folding is really tested.
  Rng rng(seed + 1);
  for (const ParamEntry& e : (*m)->param_entries())
    if (e.name.find("norm") != std::string::npos)
      for (int64_t i = 0; i < e.shape.numel(); ++i) (*m)->params()[e.offset + i] = rng.uniform(0.5f, 1.5f);
  return std::move(*m);
}

std::vector<float> logits_of(Transformer& m, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  KILN_CHECK(m.forward(tokens.data(), nullptr, B, T).ok());
  const float* lg = m.logits();
  return {lg, lg + B * T * m.config().vocab_size};
}

std::vector<int32_t> tokens_for(const Transformer& m, int64_t n, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  Rng rng(seed);
  for (auto& v : t) v = static_cast<int32_t>(rng.below(static_cast<uint64_t>(m.config().vocab_size)));
  return t;
}

TEST(QuantSmooth, FoldingLeavesFp32OutputUnchanged) {
  auto m = tiny_llama(20);
  const auto tokens = tokens_for(*m, 4 * 16, 21);
  const auto before = logits_of(*m, tokens, 4, 16);
  TokenShard shard;
  shard.tokens = tokens_for(*m, 4000, 22);
  shard.vocab_size = 64;
  CalibOptions co;
  co.samples = 8; co.seq_len = 16; co.batch = 4;
  auto stats = capture_stats(*m, calibration_tokens(shard, co), co, false);
  ASSERT_TRUE(stats.ok());
  auto groups = smooth_groups(*m);
  ASSERT_TRUE(groups.ok());
  for (double alpha : {0.5, 0.8}) {
    for (const SmoothGroup& g : *groups) {
      // AWQ-style scales and SmoothQuant scales (GQA-tied for o_proj) both fold exactly.
      std::vector<float> s = smoothquant_scales(*m, g, stats->at(g.consumers[0]), alpha);
      ASSERT_TRUE(apply_smoothing(*m, g, s).ok());
      const AwqChoice c = awq_search(*m, g, stats->at(g.consumers[0]), scheme(4, 32, false), alpha);
      ASSERT_TRUE(apply_smoothing(*m, g, c.s).ok());
    }
  }
  const auto after = logits_of(*m, tokens, 4, 16);
  double ref = 0;
  for (float v : before) ref += static_cast<double>(v) * v;
  EXPECT_LT(sq_err(before, after), 1e-9 * ref);
}

TEST(QuantSmooth, SmoothQuantMigratesOutliers) {
  // One input channel 50x larger: after smoothing, that channel's activation max shrinks and
  // per-token int8 quantization of X·W gets more accurate.
  const int64_t n = 256, in = 64, out = 32;
  auto x = randn(n * in, 30);
  for (int64_t r = 0; r < n; ++r) x[r * in + 7] *= 50.0f;
  const auto w = randn(out * in, 31, 0.1f);
  const auto y = matmul_t(x, w, n, in, out);
  auto w8a8_error = [&](const std::vector<float>& xs, const std::vector<float>& ws) {
    std::vector<float> xq = xs;
    fake_quantize_rows(xq.data(), n, in, QFormat::kInt, 8);
    const auto wq = quantize_rtn(ws.data(), out, in, scheme(8, 0, true)).dequantize();
    return sq_err(matmul_t(xq, wq, n, in, out), y);
  };
  std::vector<float> s(in);
  for (int64_t j = 0; j < in; ++j) {
    float xm = 0, wm = 0;
    for (int64_t r = 0; r < n; ++r) xm = std::max(xm, std::fabs(x[r * in + j]));
    for (int64_t r = 0; r < out; ++r) wm = std::max(wm, std::fabs(w[r * in + j]));
    s[j] = std::sqrt(xm) / std::sqrt(wm);
  }
  auto xs = x;
  auto ws = w;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < in; ++j) xs[r * in + j] /= s[j];
  for (int64_t r = 0; r < out; ++r)
    for (int64_t j = 0; j < in; ++j) ws[r * in + j] *= s[j];
  EXPECT_LT(w8a8_error(xs, ws), 0.5 * w8a8_error(x, w));
}

TEST(QuantQat, StraightThroughMaskAndFakeGrid) {
  const int64_t in = 64, out = 8, n = 5;
  auto w = randn(out * in, 40);
  std::vector<float> dw(out * in, 0.0f);
  Linear l;
  l.in = in; l.out = out; l.w = w.data(); l.dw = dw.data();
  QatConfig c;
  c.weight = scheme(4, 32, false);
  c.weight.range = RangeMethod::kPercentile;  // a clipping range: some weights fall outside
  c.weight.percentile = 90.0;
  FakeQuantLinear fq(l, c);
  // The forward weight is on the RTN grid.
  EXPECT_EQ(fq.fake_weight(), quantize_rtn(w.data(), out, in, c.weight).dequantize());
  int64_t outside = 0;
  for (uint8_t m : fq.weight_mask()) outside += m == 0;
  EXPECT_GT(outside, 0);
  const auto x = randn(n * in, 41);
  const auto dy = randn(n * out, 42);
  std::vector<float> dx(n * in);
  fq.backward(l, dx.data(), dy.data(), x.data(), n, false);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t k = 0; k < in; ++k) {
      double g = 0;
      for (int64_t i = 0; i < n; ++i) g += static_cast<double>(dy[i * out + r]) * x[i * in + k];
      const bool inside = fq.weight_mask()[r * in + k] != 0;
      EXPECT_NEAR(dw[r * in + k], inside ? g : 0.0, 1e-4) << r << " " << k;
      // The mask is exactly "inside the grid's range before clamping".
      const QTensor q = quantize_rtn(w.data(), out, in, c.weight);
      const int64_t pi = q.param_index(r, k);
      const float v = std::nearbyint(w[r * in + k] / q.scales[pi]) + q.zeros[pi];
      EXPECT_EQ(inside, v >= 0 && v <= 15);
    }
  // sync() follows a changed master weight.
  w[0] += 1.0f;
  fq.sync(l);
  EXPECT_EQ(fq.fake_weight(), quantize_rtn(w.data(), out, in, c.weight).dequantize());
}

TEST(QuantModel, SaveLoadGivesIdenticalLogits) {
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_quant_test_" + std::to_string(::getpid()));
  TokenShard shard;
  struct Case { Method method; QuantScheme s; };
  QuantScheme f8;
  f8.format = QFormat::kFp8E4M3;
  f8.group = QuantScheme::kPerTensor;
  const Case cases[] = {{Method::kRtn, scheme(4, 32, false)}, {Method::kGptq, scheme(3, 32, false)},
                        {Method::kAwq, scheme(4, 32, false)}, {Method::kSmoothQuant, scheme(8, 0, true)},
                        {Method::kRtn, scheme(2, 32, false)}, {Method::kFp8, f8}};
  for (const Case& c : cases) {
    auto m = tiny_llama(50);
    shard.tokens = tokens_for(*m, 4000, 51);
    shard.vocab_size = 64;
    const auto tokens = tokens_for(*m, 2 * 16, 52);
    const auto fp = logits_of(*m, tokens, 2, 16);
    QuantizeOptions o;
    o.method = c.method;
    o.scheme = c.s;
    o.calib.samples = 8; o.calib.seq_len = 16; o.calib.batch = 4;
    o.quantize_head = true;
    auto st = quantize_model(*m, &shard, o, nullptr);
    ASSERT_TRUE(st.ok()) << st.status().message();
    EXPECT_EQ(st->weights.size(), 2u * 7u + 1u);  // every block Linear and the untied head
    const auto ql = logits_of(*m, tokens, 2, 16);
    ASSERT_TRUE(save_quantized_model(dir.string(), *m, *st).ok());
    QuantizedState loaded_state;
    auto loaded = load_any_model(dir.string(), &loaded_state);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    EXPECT_EQ(loaded_state.weights.size(), st->weights.size());
    EXPECT_EQ(loaded_state.act, st->act);
    EXPECT_EQ(logits_of(**loaded, tokens, 2, 16), ql) << method_name(c.method);
    // Quantization moved the logits, but not far.
    double ref = 0;
    for (float v : fp) ref += static_cast<double>(v) * v;
    EXPECT_GT(sq_err(ql, fp), 0.0);
    EXPECT_LT(sq_err(ql, fp), 0.5 * ref) << method_name(c.method);
  }
  // A plain model loads through the same entry point.
  auto m = tiny_llama(60);
  ASSERT_TRUE(save_model(dir.string(), *m).ok());
  QuantizedState none;
  auto plain = load_any_model(dir.string(), &none);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(none.weights.empty());
  std::filesystem::remove_all(dir);
}

TEST(QuantModel, Gpt2RtnAndGptqRoundTrip) {
  // GPT-2 blocks (fused c_attn, biases, tied head): RTN and GPTQ quantize and reload; AWQ and
  // SmoothQuant say clearly that their folding is Llama-only.
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_quant_gpt2_" + std::to_string(::getpid()));
  ModelConfig c;
  c.family = ModelFamily::kGpt2;
  c.vocab_size = 64; c.d_model = 64; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 4; c.d_ff = 256;
  c.max_seq_len = 32; c.tied_embeddings = true;
  TokenShard shard;
  shard.vocab_size = 64;
  for (Method method : {Method::kRtn, Method::kGptq, Method::kAwq}) {
    auto m = Transformer::create(c, 80);
    ASSERT_TRUE(m.ok());
    shard.tokens = tokens_for(**m, 4000, 81);
    const auto tokens = tokens_for(**m, 32, 82);
    QuantizeOptions o;
    o.method = method;
    o.scheme = scheme(4, 64, false);
    o.calib.samples = 8; o.calib.seq_len = 16; o.calib.batch = 4;
    auto st = quantize_model(**m, &shard, o, nullptr);
    if (method == Method::kAwq) {
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.status().code(), StatusCode::kUnimplemented);
      continue;
    }
    ASSERT_TRUE(st.ok()) << st.status().message();
    EXPECT_EQ(st->weights.size(), 2u * 4u);  // c_attn, c_proj, c_fc, mlp.c_proj per block; head tied
    const auto ql = logits_of(**m, tokens, 2, 16);
    ASSERT_TRUE(save_quantized_model(dir.string(), **m, *st).ok());
    auto loaded = load_any_model(dir.string());
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    EXPECT_EQ(logits_of(**loaded, tokens, 2, 16), ql);
  }
  std::filesystem::remove_all(dir);
}

TEST(QuantModel, BadFilesGiveErrors) {
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_quant_bad_" + std::to_string(::getpid()));
  auto m = tiny_llama(70);
  QuantizeOptions o;
  o.scheme = scheme(4, 32, false);
  auto st = quantize_model(*m, nullptr, o, nullptr);
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(save_quantized_model(dir.string(), *m, *st).ok());
  // The fp32 loader names the format instead of a missing tensor.
  auto fp = load_model(dir.string());
  ASSERT_FALSE(fp.ok());
  EXPECT_NE(fp.status().message().find("quantized model"), std::string::npos) << fp.status().message();
  const auto path = dir / "model.safetensors";
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& b) { std::ofstream(path, std::ios::binary) << b; };
  // Truncated data.
  write(bytes.substr(0, bytes.size() - 100));
  auto r = load_any_model(dir.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
  // An unknown method in the metadata.
  std::string bad = bytes;
  const size_t pos = bad.find("\"rtn\"");
  ASSERT_NE(pos, std::string::npos);
  bad.replace(pos, 5, "\"xyz\"");
  write(bad);
  r = load_any_model(dir.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("xyz"), std::string::npos) << r.status().message();
  // Unsupported bit width.
  bad = bytes;
  const size_t bpos = bad.find("\"kiln.quant.bits\":\"4\"");
  ASSERT_NE(bpos, std::string::npos);
  bad.replace(bpos, 21, "\"kiln.quant.bits\":\"5\"");
  write(bad);
  r = load_any_model(dir.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("5 bits"), std::string::npos) << r.status().message();
  std::filesystem::remove_all(dir);
  // GPTQ without calibration data is a clear error.
  o.method = Method::kGptq;
  EXPECT_FALSE(quantize_model(*m, nullptr, o, nullptr).ok());
  EXPECT_FALSE(parse_method("foo").ok());
  EXPECT_FALSE(parse_weight_scheme("w5g128").ok());
  EXPECT_FALSE(parse_weight_scheme("w4g0").ok());
  for (const char* name : {"w8", "w8a8", "w4g128", "w3g64", "fp8"}) EXPECT_TRUE(parse_weight_scheme(name).ok()) << name;
  auto w8a8 = parse_qat("w8a8");
  ASSERT_TRUE(w8a8.ok());
  EXPECT_TRUE(w8a8->act_int8);
  EXPECT_EQ(w8a8->weight.group, QuantScheme::kPerChannel);
}

}  // namespace
}  // namespace kiln::quant
