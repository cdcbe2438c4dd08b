// GEMM op-boundary errors: check_gemm and matmul name the op, the shapes and what is wrong,
// and matmul computes the right thing on valid input (plain checks beside the harness cases).
#include <gtest/gtest.h>

#include "kiln/kernels/gemm.h"

namespace kiln {
namespace {

GemmParams valid_params(std::vector<float>& a, std::vector<float>& b, std::vector<float>& c) {
  a.assign(2 * 3, 1.0f);
  b.assign(3 * 4, 1.0f);
  c.assign(2 * 4, 0.0f);
  GemmParams p;
  p.m = 2; p.n = 4; p.k = 3;
  p.a = a.data(); p.lda = 3;
  p.b = b.data(); p.ldb = 4;
  p.c = c.data(); p.ldc = 4;
  return p;
}

TEST(GemmErrors, CheckGemmNamesTheProblem) {
  std::vector<float> a, b, c;
  GemmParams p = valid_params(a, b, c);
  EXPECT_TRUE(check_gemm(p).ok());

  GemmParams q = p;
  q.lda = 2;
  Status s = check_gemm(q);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[gemm] lda 2 must be >= 3"), std::string::npos) << s.message();

  q = p;
  q.trans_b = true;  // B stored (n, k) = (4, 3): ldb 4 is fine, but lda/ldb checks use k
  q.ldb = 2;
  s = check_gemm(q);
  EXPECT_NE(s.message().find("ldb 2 must be >= 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("B^T"), std::string::npos) << s.message();

  q = p;
  q.ldc = 3;
  EXPECT_NE(check_gemm(q).message().find("ldc 3 must be >= n 4"), std::string::npos);

  q = p;
  q.a_dtype = DType::kI8;
  EXPECT_NE(check_gemm(q).message().find("A has dtype i8"), std::string::npos);

  q = p;
  q.m = -1;
  EXPECT_FALSE(check_gemm(q).ok());

  q = p;
  q.residual = c.data();
  q.ldr = 1;
  EXPECT_NE(check_gemm(q).message().find("ldr 1"), std::string::npos);

  q = p;
  q.b = nullptr;
  EXPECT_NE(check_gemm(q).message().find("null"), std::string::npos);
}

// The training epilogues' combinations: save_pre needs an activation, act_grad its input and no
// other epilogue, both a leading dim of at least n.
TEST(GemmErrors, TrainingEpiloguesNameWhatIsMissing) {
  std::vector<float> a, b, c, pre(2 * 4, 0.5f);
  const GemmParams p = valid_params(a, b, c);
  GemmParams q = p;
  q.save_pre = pre.data();
  q.ldpre = 4;
  EXPECT_NE(check_gemm(q).message().find("act is none"), std::string::npos)
      << check_gemm(q).message();
  q.act = Activation::kGeluTanh;
  EXPECT_TRUE(check_gemm(q).ok()) << check_gemm(q).message();
  q.ldpre = 3;
  EXPECT_NE(check_gemm(q).message().find("ldpre 3 must be >= n 4"), std::string::npos)
      << check_gemm(q).message();

  q = p;
  q.act_grad = Activation::kGeluTanh;
  EXPECT_NE(check_gemm(q).message().find("act_grad gelu_tanh needs pre"), std::string::npos)
      << check_gemm(q).message();
  q.pre = pre.data();
  q.ldpre = 4;
  EXPECT_TRUE(check_gemm(q).ok()) << check_gemm(q).message();
  q.bias = pre.data();
  EXPECT_NE(check_gemm(q).message().find("takes no bias"), std::string::npos)
      << check_gemm(q).message();
  q.bias = nullptr;
  q.act_grad = Activation::kNone;
  EXPECT_NE(check_gemm(q).message().find("pre is set but act_grad is none"), std::string::npos)
      << check_gemm(q).message();
  q.act_grad = static_cast<Activation>(9);
  EXPECT_NE(check_gemm(q).message().find("unknown activation 9"), std::string::npos)
      << check_gemm(q).message();
}

// The bias-gradient epilogue reads A even where there is no product (n = 0).
TEST(GemmErrors, BiasGradNeedsA) {
  std::vector<float> a, b, c, db(2, 0.0f);
  GemmParams q = valid_params(a, b, c);
  q.bias_grad = db.data();
  EXPECT_TRUE(check_gemm(q).ok()) << check_gemm(q).message();
  q.n = 0;
  q.b = nullptr;
  EXPECT_TRUE(check_gemm(q).ok()) << check_gemm(q).message();
  q.a = nullptr;
  EXPECT_NE(check_gemm(q).message().find("bias_grad sums A's rows, but A is null"),
            std::string::npos)
      << check_gemm(q).message();
}

TEST(GemmErrors, MatmulShapesAndDtypes) {
  Tensor a = Tensor::full({2, 3}, 1.0f);
  Tensor b = Tensor::full({4, 5}, 1.0f);
  Expected<Tensor> r = matmul(a, b);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "[matmul] last dim of a (2, 3) must match first dim of b (4, 5)");

  r = matmul(a, Tensor::full({5, 4}, 1.0f), /*trans_b=*/true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("last dim of b (5, 4) (trans_b)"), std::string::npos);

  r = matmul(Tensor::full({3}, 1.0f), b);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at least 2 dims"), std::string::npos);

  r = matmul(a, Tensor::empty({3, 2}, DType::kI32));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("b has dtype i32"), std::string::npos);
}

TEST(GemmErrors, MatmulComputes) {
  // (2, 2, 3) x (3, 2) with b given as (2, 3)^T in bf16.
  std::vector<float> av = {1, 2, 3, 4, 5, 6, -1, 0, 1, 2, 2, 2};
  std::vector<float> bv = {1, 0, 1, 0, 1, 1};  // rows of b^T: (1,0,1), (0,1,1)
  Tensor a = Tensor::from_floats({2, 2, 3}, av).value();
  Tensor bt = Tensor::from_floats({2, 3}, bv, DType::kBF16).value();
  Expected<Tensor> r = matmul(a, bt, /*trans_b=*/true);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->shape(), Shape({2, 2, 2}));
  const std::vector<float> want = {4, 5, 10, 11, 0, 1, 4, 4};
  EXPECT_EQ(r->to_floats(), want);
}

}  // namespace
}  // namespace kiln
