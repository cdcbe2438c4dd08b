// Grouped GEMM op-boundary errors: check_grouped_gemm names the op, the group, its shape and what
// is wrong; empty groups and k = 0 are valid; FLOPs and bytes are the sums over the groups.
#include <gtest/gtest.h>

#include "kiln/kernels/grouped_gemm.h"

namespace kiln {
namespace {

// Three forward groups y_e (m_e, 4) = x_e (m_e, 3) · W_eᵀ, W_e (4, 3); m_e = 2, 0, 1.
struct Fixture {
  std::vector<float> x = std::vector<float>(3 * 3, 1.0f), w = std::vector<float>(3 * 4 * 3, 1.0f),
                     y = std::vector<float>(3 * 4, 0.0f);
  std::vector<GemmGroup> groups;
  Fixture() {
    const int64_t rows[] = {2, 0, 1};
    int64_t row = 0;
    for (int e = 0; e < 3; ++e) {
      groups.push_back(
          {rows[e], 4, 3, x.data() + row * 3, 3, w.data() + e * 12, 3, y.data() + row * 4, 4});
      row += rows[e];
    }
  }
  GroupedGemmParams params() const {
    GroupedGemmParams p;
    p.groups = groups;
    p.trans_b = true;
    return p;
  }
};

std::string message_of(const Fixture& f) {
  return check_grouped_gemm(f.params()).message();
}

TEST(GroupedGemmErrors, CheckNamesTheGroupAndTheProblem) {
  Fixture f;
  EXPECT_TRUE(check_grouped_gemm(f.params()).ok());

  Fixture q;
  q.groups[2].ldb = 2;
  Status s = check_grouped_gemm(q.params());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      s.message(),
      "[grouped_gemm] group 2 of 3 (m=1 n=4 k=3): ldb 2 must be >= 3 (the stored row length of "
      "A (1, 3) f32, B^T (3, 4) f32)");

  q = Fixture();
  q.groups[0].lda = 1;
  EXPECT_NE(message_of(q).find("group 0 of 3 (m=2 n=4 k=3): lda 1 must be >= 3"), std::string::npos)
      << message_of(q);

  q = Fixture();
  q.groups[0].ldc = 3;
  EXPECT_NE(message_of(q).find("group 0 of 3 (m=2 n=4 k=3): ldc 3 must be >= n 4"),
            std::string::npos);

  q = Fixture();
  q.groups[1].m = -1;
  EXPECT_NE(message_of(q).find("[grouped_gemm] group 1 of 3 (m=-1 n=4 k=3): negative size"),
            std::string::npos)
      << message_of(q);

  q = Fixture();
  q.groups[2].c = nullptr;
  EXPECT_NE(message_of(q).find("group 2 of 3 (m=1 n=4 k=3): C is null"), std::string::npos)
      << message_of(q);

  q = Fixture();
  q.groups[0].b = nullptr;
  EXPECT_NE(message_of(q).find("group 0 of 3 (m=2 n=4 k=3): A or B is null"), std::string::npos)
      << message_of(q);

  // The first bad group is named.
  q = Fixture();
  q.groups[1].lda = 0;
  q.groups[2].lda = 0;
  EXPECT_NE(message_of(q).find("group 1 of 3"), std::string::npos) << message_of(q);

  GroupedGemmParams p = f.params();
  p.groups = std::span<const GemmGroup>(static_cast<const GemmGroup*>(nullptr), 2);
  EXPECT_EQ(check_grouped_gemm(p).message(), "[grouped_gemm] 2 groups at a null pointer");
}

TEST(GroupedGemmErrors, EmptyGroupsAndZeroKAreValid) {
  GroupedGemmParams p;
  EXPECT_TRUE(check_grouped_gemm(p).ok());  // no groups
  // An expert with no tokens in the weight gradient: k = 0, A and B null, C still written (beta).
  std::vector<float> dw(4 * 3, 2.0f);
  const std::vector<GemmGroup> groups = {{4, 3, 0, nullptr, 4, nullptr, 3, dw.data(), 3},
                                         {0, 3, 5, nullptr, 1, nullptr, 3, nullptr, 3}};
  p.groups = groups;
  p.trans_a = true;
  p.beta = 1.0f;
  ASSERT_TRUE(check_grouped_gemm(p).ok()) << check_grouped_gemm(p).message();
  cpu::grouped_gemm(p);
  EXPECT_EQ(dw, std::vector<float>(4 * 3, 2.0f));  // beta = 1, k = 0: unchanged
  p.beta = 0.0f;
  cpu::grouped_gemm(p);
  EXPECT_EQ(dw, std::vector<float>(4 * 3, 0.0f));  // beta = 0, k = 0: zeroed
}

TEST(GroupedGemmErrors, CostIsTheSumOverGroups) {
  Fixture f;
  const GroupedGemmParams p = f.params();
  EXPECT_EQ(grouped_gemm_flops(p), gemm_flops(2, 4, 3) + gemm_flops(1, 4, 3));
  double bytes = 0;
  for (size_t g = 0; g < 3; ++g) bytes += gemm_bytes(group_gemm_params(p, g));
  EXPECT_EQ(grouped_gemm_bytes(p), bytes);
  // group_gemm_params carries the shared settings.
  const GemmParams g2 = group_gemm_params(p, 2);
  EXPECT_TRUE(g2.trans_b);
  EXPECT_FALSE(g2.trans_a);
  EXPECT_EQ(g2.m, 1);
  EXPECT_EQ(g2.a, f.x.data() + 2 * 3);
  EXPECT_EQ(g2.c, f.y.data() + 2 * 4);
}

}  // namespace
}  // namespace kiln
