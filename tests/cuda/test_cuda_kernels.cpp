// Every CUDA kernel (kernels/cuda/kernels.h) against its scalar reference (kiln::ref) over odd
// and even shapes and both GEMM dtypes: inputs go to the device with Tensor::to(Device::kCuda),
// results come back with to(Device::kHost), and the normalized MSE sum((a-e)^2) / sum(e^2) is
// compared with a bound (tests/kernels/harness.h's measure). Without a CUDA device the binary
// exits 77 before any test, which CTest reports as skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/rng.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/kernels/cuda/kernels.h"
#include "kiln/kernels/embedding.h"
#include "kiln/kernels/norm.h"
#include "kiln/kernels/ops.h"
#include "kiln/kernels/rope.h"
#include "kiln/kernels/softmax.h"

namespace kiln::cuda {
namespace {

// fp32 results whose only difference from the reference is summation order (and expf against
// the reference's double exp) sit near u² ≈ 4e-15 per element; 1e-9 leaves room for
// reductions of a few thousand terms without hiding a wrong index (nmse ~ 1).
constexpr double kF32Nmse = 1e-9;

std::vector<float> random_floats(Rng& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = lo + (hi - lo) * rng.uniform();
  return v;
}

double nmse(const std::vector<float>& expected, const std::vector<float>& actual) {
  EXPECT_EQ(expected.size(), actual.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < expected.size() && i < actual.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - expected[i];
    num += d * d;
    den += static_cast<double>(expected[i]) * expected[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return den > 0 ? num / den : num;
}

// A device copy of host values (f32, or bf16 when asked), kept alive by the Tensor.
Tensor device_floats(const std::vector<float>& v, DType dtype = DType::kF32) {
  const Tensor host = Tensor::from_floats({static_cast<int64_t>(v.size())}, v, dtype).value();
  Tensor d = host.to(Device::kCuda).value();
  EXPECT_EQ(d.device(), Device::kCuda);
  return d;
}
Tensor device_ints(std::vector<int32_t> v) {
  const Tensor host = Tensor::borrow(v.data(), {static_cast<int64_t>(v.size())}, DType::kI32);
  return host.to(Device::kCuda).value();  // copied before v goes away
}
std::vector<float> host_floats(const Tensor& d) {
  EXPECT_TRUE(cuda_runtime::synchronize().ok());
  return d.to(Device::kHost).value().to_floats();
}
// The values a bf16 tensor holds (what the reference must see).
std::vector<float> rounded(const std::vector<float>& v, DType dtype) {
  return Tensor::from_floats({static_cast<int64_t>(v.size())}, v, dtype).value().to_floats();
}

// ---- GEMM: every rung x dtype x transposes x epilogue -------------------------------------
struct GemmShape {
  int64_t m, n, k;
};
constexpr GemmShape kGemmShapes[] = {{1, 1, 1},     {7, 33, 31},  {33, 7, 64},    {100, 100, 255},
                                     {257, 65, 64}, {64, 257, 1}, {130, 200, 96}, {257, 257, 255},
                                     {1, 300, 31},  {300, 1, 100}};

void check_gemm_case(const GemmShape& s, DType dtype, bool trans_a, bool trans_b, bool epilogue) {
  Rng rng(static_cast<uint64_t>(s.m * 1000003 + s.n * 1009 + s.k));
  // Leading dims rounded up to 8 (valid strides past the logical width, and the cp.async rung's
  // alignment), so padding columns are exercised too.
  const auto round8 = [](int64_t x) { return (x + 7) / 8 * 8; };
  const int64_t a_rows = trans_a ? s.k : s.m, a_cols = trans_a ? s.m : s.k;
  const int64_t b_rows = trans_b ? s.n : s.k, b_cols = trans_b ? s.k : s.n;
  const int64_t lda = round8(a_cols), ldb = round8(b_cols);
  const std::vector<float> a = rounded(random_floats(rng, a_rows * lda), dtype);
  const std::vector<float> b = rounded(random_floats(rng, b_rows * ldb), dtype);
  const std::vector<float> c0 = random_floats(rng, s.m * s.n);
  const std::vector<float> bias = random_floats(rng, s.n);
  const std::vector<float> residual = random_floats(rng, s.m * s.n);

  GemmParams p;
  p.m = s.m, p.n = s.n, p.k = s.k;
  p.lda = lda, p.ldb = ldb, p.ldc = s.n, p.ldr = s.n;
  p.a_dtype = p.b_dtype = dtype;
  p.trans_a = trans_a, p.trans_b = trans_b;
  if (epilogue) p.alpha = 0.5f, p.beta = 1.0f, p.act = Activation::kGeluTanh;

  // The reference on host copies (bf16 operands as bf16 bytes, like the device's).
  const Tensor ha = Tensor::from_floats({a_rows * lda}, a, dtype).value();
  const Tensor hb = Tensor::from_floats({b_rows * ldb}, b, dtype).value();
  std::vector<float> expected = c0;
  GemmParams rp = p;
  rp.a = ha.raw_data(), rp.b = hb.raw_data(), rp.c = expected.data();
  if (epilogue) rp.bias = bias.data(), rp.residual = residual.data();
  ref::gemm(rp);

  const Tensor da = ha.to(Device::kCuda).value(), db = hb.to(Device::kCuda).value();
  const Tensor dbias = device_floats(bias), dres = device_floats(residual);
  for (GemmKernel rung : kGemmLadder) {
    const std::string what =
        fmt::format("{} m={} n={} k={} {} ta={} tb={} epilogue={}", gemm_kernel_name(rung), s.m,
                    s.n, s.k, dtype_name(dtype), trans_a, trans_b, epilogue);
    GemmParams dp = p;
    dp.a = da.raw_data(), dp.b = db.raw_data();
    if (epilogue) dp.bias = dbias.data<float>(), dp.residual = dres.data<float>();
    const Status supported = gemm_supports(dp, rung);
    if (!supported.ok()) {
      EXPECT_EQ(supported.code(), StatusCode::kUnimplemented) << what;
      EXPECT_EQ(gemm(dp, rung).code(), StatusCode::kUnimplemented) << what;
      continue;
    }
    const Tensor dc = device_floats(c0);
    dp.c = dc.data<float>();
    const Status st = gemm(dp, rung);
    ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
    EXPECT_LE(nmse(expected, host_floats(dc)), kF32Nmse) << what;
  }
}

TEST(CudaGemm, EveryRungMatchesTheReference) {
  for (const GemmShape& s : kGemmShapes)
    for (DType dtype : {DType::kF32, DType::kBF16})
      for (auto [ta, tb] :
           {std::pair{false, false}, std::pair{false, true}, std::pair{true, false}})
        check_gemm_case(s, dtype, ta, tb, /*epilogue=*/false);
}

TEST(CudaGemm, FusedEpilogueOnEveryRung) {
  for (const GemmShape& s : {GemmShape{7, 33, 31}, GemmShape{130, 200, 96}, GemmShape{257, 65, 64}})
    for (DType dtype : {DType::kF32, DType::kBF16}) check_gemm_case(s, dtype, false, true, true);
}

TEST(CudaGemm, NamedErrors) {
  GemmParams p;
  p.m = p.n = p.k = 8;
  p.lda = p.ldb = p.ldc = 8;
  const Tensor a = device_floats(std::vector<float>(64, 1.0f));
  const Tensor c = device_floats(std::vector<float>(64, 0.0f));
  p.a = p.b = a.raw_data();
  p.c = c.data<float>();
  const Status mma = gemm(p, GemmKernel::kMma);  // f32 operands on the tensor-core rung
  EXPECT_EQ(mma.code(), StatusCode::kUnimplemented);
  EXPECT_NE(mma.message().find("bf16"), std::string::npos) << mma.to_string();
  EXPECT_EQ(gemm_auto_kernel(p), GemmKernel::kPadded);
  p.lda = 4;  // < k: the op's own check names it
  EXPECT_EQ(gemm(p).code(), StatusCode::kInvalidArgument);
}

// ---- row-wise kernels --------------------------------------------------------------------------
constexpr int64_t kRows[] = {1, 7, 33};
constexpr int64_t kCols[] = {1, 31, 64, 255, 1000};

TEST(CudaRows, LayerNormAndRmsNorm) {
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      Rng rng(static_cast<uint64_t>(rows * 7919 + cols));
      const auto x = random_floats(rng, rows * cols, -2.0f, 3.0f);
      const auto w = random_floats(rng, cols), bias = random_floats(rng, cols);
      std::vector<float> out(x.size()), mean(rows), rstd(rows);
      ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(),
                             rows, cols);
      const Tensor dx = device_floats(x), dw = device_floats(w), db = device_floats(bias);
      const Tensor dout = device_floats(std::vector<float>(x.size())), dmean = device_floats(mean),
                   drstd = device_floats(rstd);
      ASSERT_TRUE(layernorm_forward(dout.data<float>(), dmean.data<float>(), drstd.data<float>(),
                                    dx.data<float>(), dw.data<float>(), db.data<float>(), rows,
                                    cols)
                      .ok());
      const std::string what = fmt::format("rows={} cols={}", rows, cols);
      EXPECT_LE(nmse(out, host_floats(dout)), kF32Nmse) << "layernorm " << what;
      EXPECT_LE(nmse(mean, host_floats(dmean)), kF32Nmse) << "layernorm mean " << what;
      EXPECT_LE(nmse(rstd, host_floats(drstd)), kF32Nmse) << "layernorm rstd " << what;

      ref::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, cols);
      ASSERT_TRUE(rmsnorm_forward(dout.data<float>(), drstd.data<float>(), dx.data<float>(),
                                  dw.data<float>(), rows, cols)
                      .ok());
      EXPECT_LE(nmse(out, host_floats(dout)), kF32Nmse) << "rmsnorm " << what;
      EXPECT_LE(nmse(rstd, host_floats(drstd)), kF32Nmse) << "rmsnorm rstd " << what;
    }
  }
}

TEST(CudaRows, Softmax) {
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      Rng rng(static_cast<uint64_t>(rows * 31 + cols));
      const auto x = random_floats(rng, rows * cols, -20.0f, 20.0f);
      std::vector<float> out(x.size());
      ref::softmax_forward(out.data(), x.data(), rows, cols);
      const Tensor dx = device_floats(x), dout = device_floats(std::vector<float>(x.size()));
      ASSERT_TRUE(softmax_forward(dout.data<float>(), dx.data<float>(), rows, cols).ok());
      EXPECT_LE(nmse(out, host_floats(dout)), kF32Nmse) << "rows=" << rows << " cols=" << cols;
    }
  }
}

TEST(CudaRows, CrossEntropyWithIgnoredTargets) {
  for (int64_t rows : kRows) {
    for (int64_t vocab : {int64_t{1}, int64_t{31}, int64_t{1000}, int64_t{50257}}) {
      Rng rng(static_cast<uint64_t>(rows * 17 + vocab));
      const auto logits = random_floats(rng, rows * vocab, -8.0f, 8.0f);
      std::vector<int32_t> targets(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r)
        targets[r] = r % 5 == 3 ? kIgnoreTarget : static_cast<int32_t>(rng.next_u64() % vocab);
      std::vector<float> losses(static_cast<size_t>(rows));
      ref::cross_entropy_forward(losses.data(), logits.data(), targets.data(), rows, vocab);
      const Tensor dl = device_floats(logits), dt = device_ints(targets);
      const Tensor dloss = device_floats(std::vector<float>(rows));
      ASSERT_TRUE(cross_entropy_forward(dloss.data<float>(), dl.data<float>(), dt.data<int32_t>(),
                                        rows, vocab)
                      .ok());
      EXPECT_LE(nmse(losses, host_floats(dloss)), kF32Nmse)
          << "rows=" << rows << " vocab=" << vocab;
    }
  }
}

TEST(CudaRows, EmbeddingForward) {
  for (int64_t tokens : kRows) {
    for (int64_t cols : kCols) {
      const int64_t vocab = 50;
      Rng rng(static_cast<uint64_t>(tokens * 3 + cols));
      const auto weight = random_floats(rng, vocab * cols);
      std::vector<int32_t> ids(static_cast<size_t>(tokens));
      for (auto& id : ids) id = static_cast<int32_t>(rng.next_u64() % vocab);
      std::vector<float> out(static_cast<size_t>(tokens * cols));
      ref::embedding_forward(out.data(), ids.data(), weight.data(), tokens, vocab, cols);
      const Tensor dw = device_floats(weight), di = device_ints(ids);
      const Tensor dout = device_floats(std::vector<float>(out.size()));
      ASSERT_TRUE(embedding_forward(dout.data<float>(), di.data<int32_t>(), dw.data<float>(),
                                    tokens, vocab, cols)
                      .ok());
      EXPECT_EQ(out, host_floats(dout))
          << "tokens=" << tokens << " cols=" << cols;  // a copy: exact
    }
  }
}

TEST(CudaRows, RopeForward) {
  for (int64_t head_dim : {int64_t{2}, int64_t{64}, int64_t{128}}) {
    for (int64_t pos_offset : {int64_t{0}, int64_t{5}}) {
      const int64_t batch = 2, seq = 7, heads = 3;
      const RopeTable table = make_rope_table(head_dim, 64).value();
      Rng rng(static_cast<uint64_t>(head_dim + pos_offset));
      const auto x = random_floats(rng, batch * seq * heads * head_dim);
      std::vector<float> out(x.size());
      ref::rope_forward(out.data(), x.data(), table, batch, seq, heads, head_dim, pos_offset);
      const Tensor dx = device_floats(x), dcos = device_floats(table.cos),
                   dsin = device_floats(table.sin);
      ASSERT_TRUE(rope_forward(dx.data<float>(), dx.data<float>(), dcos.data<float>(),
                               dsin.data<float>(), table.max_positions, batch, seq, heads, head_dim,
                               pos_offset)
                      .ok());  // in place
      EXPECT_LE(nmse(out, host_floats(dx)), kF32Nmse)
          << "head_dim=" << head_dim << " pos_offset=" << pos_offset;
    }
  }
  const Tensor x = device_floats(std::vector<float>(8));
  EXPECT_EQ(
      rope_forward(x.data<float>(), x.data<float>(), nullptr, nullptr, 4, 1, 4, 1, 2, 1).code(),
      StatusCode::kInvalidArgument);  // positions [1, 5) past a 4-position table
}

TEST(CudaRows, ActivationsAndAdamW) {
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{1000}, int64_t{1} << 20}) {
    Rng rng(static_cast<uint64_t>(n));
    const auto x = random_floats(rng, n, -6.0f, 6.0f), up = random_floats(rng, n);
    const Tensor dx = device_floats(x), dup = device_floats(up),
                 dout = device_floats(std::vector<float>(n));
    std::vector<float> out(static_cast<size_t>(n));
    ref::gelu_forward(out.data(), x.data(), n);
    ASSERT_TRUE(gelu_forward(dout.data<float>(), dx.data<float>(), n).ok());
    EXPECT_LE(nmse(out, host_floats(dout)), kF32Nmse) << "gelu n=" << n;
    ref::silu_forward(out.data(), x.data(), n);
    ASSERT_TRUE(silu_forward(dout.data<float>(), dx.data<float>(), n).ok());
    EXPECT_LE(nmse(out, host_floats(dout)), kF32Nmse) << "silu n=" << n;
    ref::swiglu_forward(out.data(), x.data(), up.data(), n);
    ASSERT_TRUE(swiglu_forward(dout.data<float>(), dx.data<float>(), dup.data<float>(), n).ok());
    EXPECT_LE(nmse(out, host_floats(dout)), kF32Nmse) << "swiglu n=" << n;

    // Three AdamW steps from the same state on both sides.
    auto param = random_floats(rng, n), m = std::vector<float>(n, 0.0f),
         v = std::vector<float>(n, 0.0f);
    const Tensor dparam = device_floats(param), dm = device_floats(m), dv = device_floats(v);
    AdamWConfig config;
    config.lr = 1e-2;
    for (int64_t step = 1; step <= 3; ++step) {
      const auto grad = random_floats(rng, n);
      ref::adamw_step(param.data(), grad.data(), m.data(), v.data(), n, config, step);
      const Tensor dgrad = device_floats(grad);
      ASSERT_TRUE(adamw_step(dparam.data<float>(), dgrad.data<float>(), dm.data<float>(),
                             dv.data<float>(), n, config, step)
                      .ok());
    }
    EXPECT_LE(nmse(param, host_floats(dparam)), kF32Nmse) << "adamw param n=" << n;
    EXPECT_LE(nmse(m, host_floats(dm)), kF32Nmse) << "adamw m n=" << n;
    EXPECT_LE(nmse(v, host_floats(dv)), kF32Nmse) << "adamw v n=" << n;
  }
}

// ---- backward passes of the row-wise and elementwise kernels ------------------------------------
// Inputs as tests/kernels/cases_norm.cpp: x with a nonzero mean, weights near 1, and nonzero
// starting parameter gradients (they must accumulate). At cols = 1 the exact dinp is 0 and the
// fp32 result rounding noise (see cases_norm.cpp), so dinp is compared from cols > 1.
TEST(CudaRows, LayerNormAndRmsNormBackward) {
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      Rng rng(static_cast<uint64_t>(rows * 104729 + cols));
      auto x = random_floats(rng, rows * cols, -2.0f, 2.0f);
      for (float& v : x) v += 3.0f;
      const auto w = random_floats(rng, cols, 0.5f, 1.5f), bias = random_floats(rng, cols);
      const auto dy = random_floats(rng, rows * cols);
      const auto dw0 = random_floats(rng, cols), db0 = random_floats(rng, cols);
      std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size());
      std::vector<float> dw = dw0, db = db0;
      ref::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(),
                             rows, cols);
      ref::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), rows, cols);
      const Tensor dx_d = device_floats(x), dw_d = device_floats(w), ddy = device_floats(dy);
      const Tensor dmean = device_floats(mean), drstd = device_floats(rstd);
      const Tensor ddx = device_floats(std::vector<float>(x.size())), ddw = device_floats(dw0),
                   ddb = device_floats(db0);
      ASSERT_TRUE(layernorm_backward(ddx.data<float>(), ddw.data<float>(), ddb.data<float>(),
                                     ddy.data<float>(), dx_d.data<float>(), dw_d.data<float>(),
                                     dmean.data<float>(), drstd.data<float>(), rows, cols)
                      .ok());
      const std::string what = fmt::format("rows={} cols={}", rows, cols);
      if (cols > 1) {
        EXPECT_LE(nmse(dx, host_floats(ddx)), kF32Nmse) << "layernorm dinp " << what;
      }
      EXPECT_LE(nmse(dw, host_floats(ddw)), kF32Nmse) << "layernorm dweight " << what;
      EXPECT_LE(nmse(db, host_floats(ddb)), kF32Nmse) << "layernorm dbias " << what;

      ref::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, cols);
      dw = dw0;
      ref::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows,
                            cols);
      const Tensor drstd2 = device_floats(rstd), ddw2 = device_floats(dw0);
      ASSERT_TRUE(rmsnorm_backward(ddx.data<float>(), ddw2.data<float>(), ddy.data<float>(),
                                   dx_d.data<float>(), dw_d.data<float>(), drstd2.data<float>(),
                                   rows, cols)
                      .ok());
      if (cols > 1) {
        EXPECT_LE(nmse(dx, host_floats(ddx)), kF32Nmse) << "rmsnorm dinp " << what;
      }
      EXPECT_LE(nmse(dw, host_floats(ddw2)), kF32Nmse) << "rmsnorm dweight " << what;
    }
  }
}

TEST(CudaRows, SoftmaxBackward) {
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      Rng rng(static_cast<uint64_t>(rows * 613 + cols));
      const auto x = random_floats(rng, rows * cols, -5.0f, 5.0f);
      const auto dy = random_floats(rng, rows * cols);
      std::vector<float> y(x.size()), dx(x.size());
      ref::softmax_forward(y.data(), x.data(), rows, cols);
      ref::softmax_backward(dx.data(), dy.data(), y.data(), rows, cols);
      const Tensor dyd = device_floats(y), ddy = device_floats(dy),
                   ddx = device_floats(std::vector<float>(x.size()));
      ASSERT_TRUE(
          softmax_backward(ddx.data<float>(), ddy.data<float>(), dyd.data<float>(), rows, cols)
              .ok());
      const std::string what = fmt::format("rows={} cols={}", rows, cols);
      EXPECT_LE(nmse(dx, host_floats(ddx)), kF32Nmse) << what;
      // In place: dinp aliasing dout.
      ASSERT_TRUE(
          softmax_backward(ddy.data<float>(), ddy.data<float>(), dyd.data<float>(), rows, cols)
              .ok());
      EXPECT_LE(nmse(dx, host_floats(ddy)), kF32Nmse) << "in place " << what;
    }
  }
}

TEST(CudaRows, CrossEntropyBackwardWithIgnoredTargets) {
  for (int64_t rows : kRows) {
    for (int64_t vocab : {int64_t{1}, int64_t{31}, int64_t{1000}, int64_t{50257}}) {
      Rng rng(static_cast<uint64_t>(rows * 29 + vocab));
      const auto logits = random_floats(rng, rows * vocab, -8.0f, 8.0f);
      const auto dlosses = random_floats(rng, rows, 0.1f, 1.0f);
      std::vector<int32_t> targets(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r)
        targets[r] = r % 5 == 3 ? kIgnoreTarget : static_cast<int32_t>(rng.next_u64() % vocab);
      std::vector<float> dlogits(logits.size());
      ref::cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), dlosses.data(),
                                  rows, vocab);
      const Tensor dl = device_floats(logits), dt = device_ints(targets),
                   ddl = device_floats(dlosses);
      const Tensor dgrad = device_floats(std::vector<float>(logits.size(), 7.0f));
      ASSERT_TRUE(cross_entropy_backward(dgrad.data<float>(), dl.data<float>(), dt.data<int32_t>(),
                                         ddl.data<float>(), rows, vocab)
                      .ok());
      const std::string what = fmt::format("rows={} vocab={}", rows, vocab);
      EXPECT_LE(nmse(dlogits, host_floats(dgrad)), kF32Nmse) << what;
      // In place: dlogits aliasing logits (cross_entropy.h allows it).
      ASSERT_TRUE(cross_entropy_backward(dl.data<float>(), dl.data<float>(), dt.data<int32_t>(),
                                         ddl.data<float>(), rows, vocab)
                      .ok());
      EXPECT_LE(nmse(dlogits, host_floats(dl)), kF32Nmse) << "in place " << what;
    }
  }
}

// Few distinct ids, so most rows of dweight take several tokens (the atomics contend); the
// order of those additions is free, so the comparison is by nmse, not bits.
TEST(CudaRows, EmbeddingBackward) {
  for (int64_t tokens : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{1000}}) {
    for (int64_t cols : kCols) {
      const int64_t vocab = 5;
      Rng rng(static_cast<uint64_t>(tokens * 11 + cols));
      const auto dout = random_floats(rng, tokens * cols);
      const auto dw0 = random_floats(rng, vocab * cols);
      std::vector<int32_t> ids(static_cast<size_t>(tokens));
      for (auto& id : ids) id = static_cast<int32_t>(rng.next_u64() % vocab);
      std::vector<float> dw = dw0;
      ref::embedding_backward(dw.data(), dout.data(), ids.data(), tokens, vocab, cols);
      const Tensor ddout = device_floats(dout), di = device_ints(ids), ddw = device_floats(dw0);
      ASSERT_TRUE(embedding_backward(ddw.data<float>(), ddout.data<float>(), di.data<int32_t>(),
                                     tokens, vocab, cols)
                      .ok());
      EXPECT_LE(nmse(dw, host_floats(ddw)), kF32Nmse) << "tokens=" << tokens << " cols=" << cols;
    }
  }
}

TEST(CudaRows, RopeBackward) {
  for (int64_t head_dim : {int64_t{2}, int64_t{64}, int64_t{128}}) {
    for (int64_t pos_offset : {int64_t{0}, int64_t{5}}) {
      const int64_t batch = 2, seq = 7, heads = 3;
      const RopeTable table = make_rope_table(head_dim, 64).value();
      Rng rng(static_cast<uint64_t>(head_dim * 3 + pos_offset));
      const auto dy = random_floats(rng, batch * seq * heads * head_dim);
      std::vector<float> dx(dy.size());
      ref::rope_backward(dx.data(), dy.data(), table, batch, seq, heads, head_dim, pos_offset);
      const Tensor ddy = device_floats(dy), dcos = device_floats(table.cos),
                   dsin = device_floats(table.sin);
      ASSERT_TRUE(rope_backward(ddy.data<float>(), ddy.data<float>(), dcos.data<float>(),
                                dsin.data<float>(), table.max_positions, batch, seq, heads,
                                head_dim, pos_offset)
                      .ok());  // in place
      EXPECT_LE(nmse(dx, host_floats(ddy)), kF32Nmse)
          << "head_dim=" << head_dim << " pos_offset=" << pos_offset;
    }
  }
}

TEST(CudaRows, ActivationsBackward) {
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{1000}, int64_t{1} << 20}) {
    Rng rng(static_cast<uint64_t>(n + 17));
    const auto x = random_floats(rng, n, -6.0f, 6.0f), up = random_floats(rng, n),
               dy = random_floats(rng, n);
    const Tensor dx = device_floats(x), dup = device_floats(up), ddy = device_floats(dy),
                 dgrad = device_floats(std::vector<float>(n)),
                 dgrad2 = device_floats(std::vector<float>(n));
    std::vector<float> grad(static_cast<size_t>(n)), grad2(static_cast<size_t>(n));
    ref::gelu_backward(grad.data(), dy.data(), x.data(), n);
    ASSERT_TRUE(gelu_backward(dgrad.data<float>(), ddy.data<float>(), dx.data<float>(), n).ok());
    EXPECT_LE(nmse(grad, host_floats(dgrad)), kF32Nmse) << "gelu n=" << n;
    ref::silu_backward(grad.data(), dy.data(), x.data(), n);
    ASSERT_TRUE(silu_backward(dgrad.data<float>(), ddy.data<float>(), dx.data<float>(), n).ok());
    EXPECT_LE(nmse(grad, host_floats(dgrad)), kF32Nmse) << "silu n=" << n;
    ref::swiglu_backward(grad.data(), grad2.data(), dy.data(), x.data(), up.data(), n);
    ASSERT_TRUE(swiglu_backward(dgrad.data<float>(), dgrad2.data<float>(), ddy.data<float>(),
                                dx.data<float>(), dup.data<float>(), n)
                    .ok());
    EXPECT_LE(nmse(grad, host_floats(dgrad)), kF32Nmse) << "swiglu dgate n=" << n;
    EXPECT_LE(nmse(grad2, host_floats(dgrad2)), kF32Nmse) << "swiglu dup n=" << n;
  }
}

// ---- FlashAttention forward
// ------------------------------------------------------------------------
TEST(CudaAttention, FlashForwardMatchesTheReference) {
  struct Case {
    int64_t batch, q_len, kv_len, heads, kv_heads, head_dim;
    bool causal;
    int64_t window;
  };
  const Case cases[] = {
      {2, 7, 7, 4, 2, 64, true, 0},    {1, 33, 40, 2, 1, 40, false, 0},
      {1, 1, 100, 8, 8, 128, true, 0}, {2, 65, 65, 4, 1, 32, true, 16},
      {1, 17, 17, 2, 2, 256, true, 0}, {1, 100, 257, 6, 3, 96, true, 0},
      {1, 9, 9, 1, 1, 1, false, 3},
  };
  for (const Case& c : cases) {
    AttentionParams p;
    p.batch = c.batch, p.q_len = c.q_len, p.kv_len = c.kv_len, p.n_heads = c.heads;
    p.n_kv_heads = c.kv_heads, p.head_dim = c.head_dim, p.causal = c.causal, p.window = c.window;
    p = check_attention(p).value();
    Rng rng(static_cast<uint64_t>(c.q_len * 131 + c.kv_len + c.head_dim));
    const auto q = random_floats(rng, c.batch * c.q_len * c.heads * c.head_dim);
    const auto k = random_floats(rng, c.batch * c.kv_len * c.kv_heads * c.head_dim);
    const auto v = random_floats(rng, c.batch * c.kv_len * c.kv_heads * c.head_dim);
    std::vector<float> out(q.size()), lse(static_cast<size_t>(c.batch * c.heads * c.q_len));
    ref::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p);
    const Tensor dq = device_floats(q), dk = device_floats(k), dv = device_floats(v);
    const Tensor dout = device_floats(std::vector<float>(out.size())), dlse = device_floats(lse);
    const Status st = attention_forward(dout.data<float>(), dlse.data<float>(), dq.data<float>(),
                                        dk.data<float>(), dv.data<float>(), p);
    const std::string what =
        fmt::format("B={} T={} S={} H={}/{} D={} causal={} window={}", c.batch, c.q_len, c.kv_len,
                    c.heads, c.kv_heads, c.head_dim, c.causal, c.window);
    ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
    EXPECT_LE(nmse(out, host_floats(dout)), kF32Nmse) << "out " << what;
    EXPECT_LE(nmse(lse, host_floats(dlse)), kF32Nmse) << "lse " << what;
  }
}

// The backward from the reference forward's out and lse, against ref::attention_backward, over
// the forward's cases plus padded row strides (q, k, v read out of a wider fused buffer) and a
// non-causal case with more queries than keys. With padded rows the gradient buffers start at
// zero on both sides, so the padding columns (which neither writes) compare equal.
TEST(CudaAttention, FlashBackwardMatchesTheReference) {
  struct Case {
    int64_t batch, q_len, kv_len, heads, kv_heads, head_dim;
    bool causal;
    int64_t window;
    int64_t pad;  // extra floats per row of q, k, v and out
  };
  const Case cases[] = {
      {2, 7, 7, 4, 2, 64, true, 0, 0},    {1, 33, 40, 2, 1, 40, false, 0, 0},
      {1, 1, 100, 8, 8, 128, true, 0, 0}, {2, 65, 65, 4, 1, 32, true, 16, 0},
      {1, 17, 17, 2, 2, 256, true, 0, 0}, {1, 100, 257, 6, 3, 96, true, 0, 0},
      {1, 9, 9, 1, 1, 1, false, 3, 0},    {2, 40, 40, 4, 2, 64, true, 0, 8},
      {1, 50, 20, 3, 1, 33, false, 0, 5},
  };
  for (const Case& c : cases) {
    AttentionParams p;
    p.batch = c.batch, p.q_len = c.q_len, p.kv_len = c.kv_len, p.n_heads = c.heads;
    p.n_kv_heads = c.kv_heads, p.head_dim = c.head_dim, p.causal = c.causal, p.window = c.window;
    p.q_row_stride = p.o_row_stride = c.heads * c.head_dim + c.pad;
    p.k_row_stride = p.v_row_stride = c.kv_heads * c.head_dim + c.pad;
    p = check_attention(p).value();
    Rng rng(static_cast<uint64_t>(c.q_len * 7 + c.kv_len * 3 + c.head_dim + c.pad));
    const int64_t qn = c.batch * c.q_len * p.q_row_stride, kn = c.batch * c.kv_len * p.k_row_stride;
    const auto q = random_floats(rng, qn), k = random_floats(rng, kn), v = random_floats(rng, kn);
    const auto dout = random_floats(rng, qn);
    std::vector<float> out(static_cast<size_t>(qn)),
        lse(static_cast<size_t>(c.batch * c.heads * c.q_len));
    ref::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p);
    std::vector<float> dq(static_cast<size_t>(qn)), dk(static_cast<size_t>(kn)),
        dv(static_cast<size_t>(kn));
    ref::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                            v.data(), out.data(), lse.data(), p);
    // Device copies: inputs *_d, gradients g*. Unpadded gradients start at 7, so a row the
    // kernels leave unwritten (the contract overwrites every one) shows.
    const Tensor q_d = device_floats(q), k_d = device_floats(k), v_d = device_floats(v);
    const Tensor dout_d = device_floats(dout), out_d = device_floats(out),
                 lse_d = device_floats(lse);
    const float init = c.pad == 0 ? 7.0f : 0.0f;
    const Tensor gq = device_floats(std::vector<float>(dq.size(), init)),
                 gk = device_floats(std::vector<float>(dk.size(), init)),
                 gv = device_floats(std::vector<float>(dv.size(), init));
    const Status st = attention_backward(gq.data<float>(), gk.data<float>(), gv.data<float>(),
                                         dout_d.data<float>(), q_d.data<float>(), k_d.data<float>(),
                                         v_d.data<float>(), out_d.data<float>(),
                                         lse_d.data<float>(), p);
    const std::string what =
        fmt::format("B={} T={} S={} H={}/{} D={} causal={} window={} pad={}", c.batch, c.q_len,
                    c.kv_len, c.heads, c.kv_heads, c.head_dim, c.causal, c.window, c.pad);
    ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
    EXPECT_LE(nmse(dq, host_floats(gq)), kF32Nmse) << "dq " << what;
    EXPECT_LE(nmse(dk, host_floats(gk)), kF32Nmse) << "dk " << what;
    EXPECT_LE(nmse(dv, host_floats(gv)), kF32Nmse) << "dv " << what;
  }
}

// Decode against the paged cache (blocks in shuffled order, as tests/kernels/cases_attention.cpp's
// attention_paged) equals ref::attention_forward over the same keys stored contiguously: one
// chunk, a few, and the automatic count; GQA and MHA; a sliding window; a sequence shorter than
// q_len is not allowed when causal, so the shortest holds exactly q_len keys.
TEST(CudaAttention, PagedDecodeMatchesTheReference) {
  struct Case {
    int64_t heads, kv_heads, head_dim, q_len, block_size, max_blocks;
    std::vector<int32_t> lens;
    int64_t window;
  };
  const std::vector<Case> cases = {
      {6, 2, 64, 2, 16, 20, {2, 300, 47}, 0},
      {8, 8, 128, 1, 32, 10, {1, 17, 320, 64}, 0},
      {32, 8, 96, 1, 16, 33, {513, 5}, 0},
      {4, 1, 40, 3, 8, 12, {90, 3, 33}, 20},
      {2, 2, 256, 1, 16, 4, {64, 1}, 0},
  };
  for (const Case& c : cases) {
    for (int64_t splits : {1, 4, 0}) {
      const int64_t n = static_cast<int64_t>(c.lens.size()), num_blocks = n * c.max_blocks;
      const int64_t H = c.heads, Hkv = c.kv_heads, D = c.head_dim, T = c.q_len, bs = c.block_size;
      Rng rng(static_cast<uint64_t>(H * 100 + D + splits));
      const auto kpool = random_floats(rng, num_blocks * bs * Hkv * D),
                 vpool = random_floats(rng, num_blocks * bs * Hkv * D),
                 q = random_floats(rng, n * T * H * D);
      std::vector<int32_t> table(static_cast<size_t>(num_blocks));
      std::iota(table.begin(), table.end(), 0);
      for (int64_t i = num_blocks - 1; i > 0; --i)
        std::swap(table[i], table[rng.below(static_cast<uint64_t>(i + 1))]);
      AttentionParams p;
      p.q_len = T, p.kv_len = T, p.n_heads = H, p.n_kv_heads = Hkv, p.head_dim = D;
      p.window = c.window, p.num_splits = splits;
      p = check_attention(p).value();

      std::vector<float> ro(static_cast<size_t>(n * T * H * D)), rl(static_cast<size_t>(n * H * T));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t len = c.lens[i];
        std::vector<float> kc(static_cast<size_t>(len * Hkv * D)), vc(kc.size());
        for (int64_t j = 0; j < len; ++j) {
          const int64_t row = table[i * c.max_blocks + j / bs] * bs + j % bs;
          std::copy_n(kpool.data() + row * Hkv * D, Hkv * D, kc.data() + j * Hkv * D);
          std::copy_n(vpool.data() + row * Hkv * D, Hkv * D, vc.data() + j * Hkv * D);
        }
        AttentionParams pi = p;
        pi.kv_len = len;
        ref::attention_forward(ro.data() + i * T * H * D, rl.data() + i * H * T,
                               q.data() + i * T * H * D, kc.data(), vc.data(), pi);
      }

      const Tensor dk = device_floats(kpool), dv = device_floats(vpool), dq = device_floats(q);
      const Tensor dtable = device_ints(table), dlens = device_ints(c.lens);
      const PagedKv kv{dk.data<float>(), dv.data<float>(), dtable.data<int32_t>(),
                       dlens.data<int32_t>(), bs, c.max_blocks, n};
      const int64_t ws = attention_decode_paged_workspace_floats(p, kv);
      const Tensor dws =
          device_floats(std::vector<float>(static_cast<size_t>(std::max<int64_t>(ws, 1))));
      const Tensor dout = device_floats(std::vector<float>(ro.size(), 7.0f)),  // all overwritten
          dlse = device_floats(std::vector<float>(rl.size(), 7.0f));
      const std::string what = fmt::format("H={}/{} D={} T={} bs={} splits={} window={}", H, Hkv,
                                           D, T, bs, splits, c.window);
      if (ws > 0) {  // a missing workspace is a named error, not a fault
        const Status missing = attention_decode_paged(dout.data<float>(), dlse.data<float>(),
                                                      dq.data<float>(), kv, p, nullptr, 0);
        EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument) << what;
      } else {
        EXPECT_EQ(splits, 1) << what << ": only one chunk needs no workspace";
      }
      const Status st = attention_decode_paged(dout.data<float>(), dlse.data<float>(),
                                               dq.data<float>(), kv, p, dws.data<float>(), ws);
      ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
      EXPECT_LE(nmse(ro, host_floats(dout)), kF32Nmse) << "out " << what;
      EXPECT_LE(nmse(rl, host_floats(dlse)), kF32Nmse) << "lse " << what;
    }
  }
}

TEST(CudaDevice, TensorRoundTrip) {
  const std::vector<float> v = {1.0f, -2.5f, 3.25f, 0.0f, 7.0f, 8.0f};
  const Tensor host = Tensor::from_floats({2, 3}, v).value();
  const Tensor dev = host.to(Device::kCuda).value();
  EXPECT_EQ(dev.device(), Device::kCuda);
  EXPECT_NE(dev.to_string().find("cuda"), std::string::npos);
  EXPECT_EQ(dev.to(Device::kHost).value().to_floats(), v);
  // A strided host view is packed on the way; a strided device view is refused.
  const Tensor t = host.transpose(0, 1).value();
  EXPECT_EQ(t.to(Device::kCuda).value().to(Device::kHost).value().to_floats(), t.to_floats());
  EXPECT_EQ(dev.transpose(0, 1).value().to(Device::kHost).status().code(),
            StatusCode::kInvalidArgument);
}

// ---- streams, events, pinned memory, graphs (core/device.h) -----------------------------------
std::vector<float> device_to_vector(const float* d, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  EXPECT_TRUE(cuda_runtime::copy_device_to_host(v.data(), d, n * 4).ok());
  return v;
}

using cuda_runtime::Event;
using cuda_runtime::Graph;
using cuda_runtime::PinnedBuffer;
using cuda_runtime::Stream;
using cuda_runtime::StreamScope;

// StreamScope sets this thread's launch stream and restores the previous one, nested.
TEST(CudaDevice, StreamScopeNestsAndRestores) {
  Stream a = Stream::create().value(), b = Stream::create().value();
  ASSERT_NE(a.handle(), nullptr);
  ASSERT_NE(a.handle(), b.handle());
  EXPECT_EQ(cuda_runtime::current_stream(), nullptr);
  {
    StreamScope sa(a);
    EXPECT_EQ(cuda_runtime::current_stream(), a.handle());
    {
      StreamScope sb(b);
      EXPECT_EQ(cuda_runtime::current_stream(), b.handle());
    }
    EXPECT_EQ(cuda_runtime::current_stream(), a.handle());
  }
  EXPECT_EQ(cuda_runtime::current_stream(), nullptr);
}

// Pinned host -> device -> pinned host on one stream, a kernel between the copies on the same
// stream (in order, no host sync until the end): the softmax of the bytes that arrived.
TEST(CudaDevice, AsyncCopiesAndAKernelInStreamOrder) {
  constexpr int64_t kRows = 5, kCols = 37, kN = kRows * kCols;
  Rng rng(11);
  const std::vector<float> x = random_floats(rng, kN, -3.0f, 3.0f);
  std::vector<float> expected(kN);
  ref::softmax_forward(expected.data(), x.data(), kRows, kCols);
  Stream s = Stream::create().value();
  PinnedBuffer in = PinnedBuffer::allocate(kN * 4).value(),
               out = PinnedBuffer::allocate(kN * 4).value();
  std::copy(x.begin(), x.end(), static_cast<float*>(in.data()));
  auto d_in = Storage::allocate(kN * 4, Device::kCuda).value();
  auto d_out = Storage::allocate(kN * 4, Device::kCuda).value();
  ASSERT_TRUE(cuda_runtime::copy_host_to_device_async(d_in->data(), in.data(), kN * 4, s).ok());
  {
    StreamScope scope(s);
    ASSERT_TRUE(softmax_forward(static_cast<float*>(d_out->data()),
                                static_cast<const float*>(d_in->data()), kRows, kCols)
                    .ok());
  }
  ASSERT_TRUE(cuda_runtime::copy_device_to_host_async(out.data(), d_out->data(), kN * 4, s).ok());
  ASSERT_TRUE(s.synchronize().ok());
  const float* o = static_cast<const float*>(out.data());
  EXPECT_LE(nmse(expected, std::vector<float>(o, o + kN)), kF32Nmse);
}

// Events order two streams on the GPU: the second stream's copy waits for the first's kernel.
TEST(CudaDevice, EventOrdersTwoStreams) {
  constexpr int64_t kN = 1 << 20;
  Stream compute = Stream::create().value(), copy = Stream::create().value();
  Event done = Event::create().value(), start = Event::create().value();
  std::vector<float> gate(kN, 0.5f), up(kN, 3.0f), expected(kN);
  ref::swiglu_forward(expected.data(), gate.data(), up.data(), kN);
  const Tensor g = device_floats(gate), u = device_floats(up);
  auto d_out = Storage::allocate(kN * 4, Device::kCuda).value();
  PinnedBuffer out = PinnedBuffer::allocate(kN * 4).value();
  ASSERT_TRUE(start.record(compute).ok());
  {
    StreamScope scope(compute);
    ASSERT_TRUE(
        swiglu_forward(static_cast<float*>(d_out->data()), g.data<float>(), u.data<float>(), kN)
            .ok());
  }
  ASSERT_TRUE(done.record(compute).ok());
  ASSERT_TRUE(done.make_wait(copy).ok());
  ASSERT_TRUE(
      cuda_runtime::copy_device_to_host_async(out.data(), d_out->data(), kN * 4, copy).ok());
  ASSERT_TRUE(copy.synchronize().ok());
  const float* o = static_cast<const float*>(out.data());
  EXPECT_LE(nmse(expected, std::vector<float>(o, o + kN)), kF32Nmse);
  const auto ms = Event::elapsed_ms(start, done);
  ASSERT_TRUE(ms.ok()) << ms.status().to_string();
  EXPECT_GE(*ms, 0.0f);
}

// A graph of two kernels captured once and replayed on new inputs written into the captured
// buffer: each replay computes what eager calls compute; capturing records, it does not run.
TEST(CudaDevice, GraphReplaysOnNewInputs) {
  constexpr int64_t kRows = 3, kCols = 100, kN = kRows * kCols;
  Stream s = Stream::create().value();
  const Tensor w = device_floats(std::vector<float>(kCols, 1.5f));
  auto d_x = Storage::allocate(kN * 4, Device::kCuda).value();
  auto d_norm = Storage::allocate(kN * 4, Device::kCuda).value();
  auto d_rstd = Storage::allocate(kRows * 4, Device::kCuda).value();
  auto d_out = Storage::allocate(kN * 4, Device::kCuda).value();
  float* x = static_cast<float*>(d_x->data());
  float* norm = static_cast<float*>(d_norm->data());
  float* out = static_cast<float*>(d_out->data());
  ASSERT_TRUE(cuda_runtime::memset_device(out, 0, kN * 4).ok());
  auto graph = Graph::capture(s, [&]() -> Status {
    KILN_RETURN_IF_ERROR(rmsnorm_forward(norm, static_cast<float*>(d_rstd->data()), x,
                                         w.data<float>(), kRows, kCols));
    return softmax_forward(out, norm, kRows, kCols);
  });
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  EXPECT_EQ(graph->nodes(), 2);
  ASSERT_TRUE(s.synchronize().ok());
  EXPECT_EQ(device_to_vector(out, kN), std::vector<float>(kN, 0.0f)) << "capture ran the kernels";
  Rng rng(5);
  for (int replay = 0; replay < 3; ++replay) {
    const std::vector<float> in = random_floats(rng, kN, -2.0f, 2.0f);
    std::vector<float> n(kN), r(kRows), expected(kN);
    ref::rmsnorm_forward(n.data(), r.data(), in.data(), std::vector<float>(kCols, 1.5f).data(),
                         kRows, kCols);
    ref::softmax_forward(expected.data(), n.data(), kRows, kCols);
    ASSERT_TRUE(cuda_runtime::copy_host_to_device(x, in.data(), kN * 4).ok());
    ASSERT_TRUE(graph->launch(s).ok());
    ASSERT_TRUE(s.synchronize().ok());
    EXPECT_LE(nmse(expected, device_to_vector(out, kN)), kF32Nmse) << "replay " << replay;
  }
  // The default stream cannot be captured: a named error, not a CUDA failure later.
  const auto bad = Graph::capture(Stream(), [] { return Status{}; });
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

// ---- tensor-level ops dispatch on their tensors' device (kernels/ops.h) -------------------------
// Each op on CUDA tensors gives the host op's result (the kernels differ by summation order and
// exp only), its result stays on the device, and inputs on two devices are a named error.
TEST(CudaDevice, OpsDispatchOnTheirTensorsDevice) {
  Rng rng(21);
  const Tensor x = Tensor::from_floats({3, 5, 40}, random_floats(rng, 600, -2.0f, 2.0f)).value();
  const Tensor up = Tensor::from_floats({3, 5, 40}, random_floats(rng, 600)).value();
  const Tensor w = Tensor::from_floats({40}, random_floats(rng, 40)).value();
  const Tensor b = Tensor::from_floats({40}, random_floats(rng, 40)).value();
  const Tensor wt = Tensor::from_floats({24, 40}, random_floats(rng, 960)).value();
  const Tensor dx = x.to(Device::kCuda).value(), dup = up.to(Device::kCuda).value();
  const Tensor dw = w.to(Device::kCuda).value(), db = b.to(Device::kCuda).value();
  const Tensor dwt = wt.to(Device::kCuda).value();
  const auto same = [](const Expected<Tensor>& host, const Expected<Tensor>& dev, const char* op) {
    ASSERT_TRUE(host.ok()) << op << ": " << host.status().to_string();
    ASSERT_TRUE(dev.ok()) << op << ": " << dev.status().to_string();
    EXPECT_EQ(dev->device(), Device::kCuda) << op;
    EXPECT_EQ(dev->shape(), host->shape()) << op;
    EXPECT_LE(nmse(host->to_floats(), host_floats(*dev)), kF32Nmse) << op;
  };
  same(ops::rmsnorm(x, w), ops::rmsnorm(dx, dw), "rmsnorm");
  same(ops::layernorm(x, w, b), ops::layernorm(dx, dw, db), "layernorm");
  same(ops::softmax(x), ops::softmax(dx), "softmax");
  same(ops::gelu(x), ops::gelu(dx), "gelu");
  same(ops::silu(x), ops::silu(dx), "silu");
  same(ops::swiglu(x, up), ops::swiglu(dx, dup), "swiglu");
  same(matmul(x, wt, true), matmul(dx, dwt, true), "matmul");
  const auto mixed = ops::rmsnorm(dx, w);
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mixed.status().message().find("x on cuda, weight on host"), std::string::npos)
      << mixed.status().to_string();
  EXPECT_FALSE(matmul(x, dwt, true).ok());
}

}  // namespace
}  // namespace kiln::cuda

// Exit 77 (CTest: skipped) when there is no CUDA device to run on.
int main(int argc, char** argv) {
  if (!kiln::cuda_available()) {
    std::printf("SKIP: %s\n", kiln::cuda_runtime::unavailable_reason().c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
