// Embedding cases for the kernel harness: cpu vs ref lookup and scatter-add backward with
// many repeated ids (the case that races in a naive threaded kernel), positional add and its
// batch reduction; d weight against finite differences; the id check; determinism across
// thread counts. Tolerance 0 (bit-exact): the forward is a copy, and both backwards add the
// same fp32 values into each entry in the same (token) order.
#include <gtest/gtest.h>

#include "kiln/core/thread_pool.h"
#include "kiln/kernels/embedding.h"
#include "tests/kernels/ops_cases_util.h"

namespace kiln::testing {
namespace {

std::vector<int32_t> random_ids(Rng& rng, int64_t n, int64_t distinct) {
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = static_cast<int32_t>(rng.below(distinct));
  return ids;
}

}  // namespace

KILN_KERNEL_CASES(embedding) {
  std::vector<KernelCase> cases;
  for (int64_t vocab : {5, 1000}) {
    for (int64_t tokens : {1, 17, 64, 300}) {
      for (int64_t cols : {1, 7, 65, 768}) {
        if (vocab * cols > 100000) continue;  // keeps the case fast; C = 768 runs with V = 5
        cases.push_back(
            {fmt::format("V={} N={} C={}", vocab, tokens, cols), [=] {
               Rng rng(1200 + vocab + tokens + cols);
               const std::vector<float> w = random_vector(rng, vocab * cols);
               // ids from a small range: most repeat
               const std::vector<int32_t> ids =
                   random_ids(rng, tokens, std::min<int64_t>(vocab, 5));
               const std::vector<float> dy = random_vector(rng, tokens * cols);
               const std::vector<float> dw0 = random_vector(rng, vocab * cols);
               std::vector<float> y_ref(tokens * cols), y_cpu(tokens * cols, NAN);
               ref::embedding_forward(y_ref.data(), ids.data(), w.data(), tokens, vocab, cols);
               cpu::embedding_forward(y_cpu.data(), ids.data(), w.data(), tokens, vocab, cols);
               std::vector<float> dw_ref = dw0, dw_cpu = dw0;
               ref::embedding_backward(dw_ref.data(), dy.data(), ids.data(), tokens, vocab, cols);
               cpu::embedding_backward(dw_cpu.data(), dy.data(), ids.data(), tokens, vocab, cols);
               return std::vector<Compare>{{"out", y_ref, y_cpu, 0.0},
                                           {"dweight", dw_ref, dw_cpu, 0.0}};
             }});
      }
    }
  }
  for (int64_t batch : {1, 3}) {
    for (int64_t seq : {1, 17, 64}) {
      for (int64_t cols : {7, 768}) {
        cases.push_back({fmt::format("positional B={} T={} C={}", batch, seq, cols), [=] {
                           Rng rng(1300 + batch + seq + cols);
                           const std::vector<float> wpe = random_vector(rng, seq * cols);
                           const std::vector<float> x = random_vector(rng, batch * seq * cols);
                           const std::vector<float> dwpe0 = random_vector(rng, seq * cols);
                           std::vector<float> y_ref = x, y_cpu = x, d_ref = dwpe0, d_cpu = dwpe0;
                           ref::positional_forward(y_ref.data(), wpe.data(), batch, seq, cols);
                           cpu::positional_forward(y_cpu.data(), wpe.data(), batch, seq, cols);
                           ref::positional_backward(d_ref.data(), x.data(), batch, seq, cols);
                           cpu::positional_backward(d_cpu.data(), x.data(), batch, seq, cols);
                           return std::vector<Compare>{{"x + wpe", y_ref, y_cpu, 0.0},
                                                       {"dwpe", d_ref, d_cpu, 0.0}};
                         }});
      }
    }
  }
  return cases;
}

KILN_GRAD_CASES(embedding) {
  const int64_t vocab = 6, tokens = 9, cols = 5;
  Rng rng(1400);
  const std::vector<float> w = random_vector(rng, vocab * cols);
  const std::vector<int32_t> ids = {0, 3, 3, 5, 0, 3, 1, 1, 3};  // repeats; id 2, 4 unused
  const std::vector<float> dy = random_vector(rng, tokens * cols);
  GradCase c{"dweight", w,
             [=](const std::vector<float>& wt) {
               std::vector<double> y(tokens * cols);
               for (int64_t t = 0; t < tokens; ++t) {
                 for (int64_t k = 0; k < cols; ++k) y[t * cols + k] = wt[ids[t] * cols + k];
               }
               return dot_d(dy, y);
             },
             [=](const std::vector<float>&) {
               std::vector<float> dw(vocab * cols, 0.0f);
               ref::embedding_backward(dw.data(), dy.data(), ids.data(), tokens, vocab, cols);
               return dw;
             }};
  c.num_probes = vocab * cols;  // every entry, the unused rows (gradient 0) included
  return {c};
}

TEST(EmbeddingKernels, CheckTokenIds) {
  const std::vector<int32_t> ok = {0, 4, 2};
  EXPECT_TRUE(check_token_ids(ok, 5).ok());
  const std::vector<int32_t> too_big = {0, 5, 2};
  const Status s = check_token_ids(too_big, 5);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token id 5 at position 1"), std::string::npos) << s.message();
  const std::vector<int32_t> negative = {-1};
  EXPECT_FALSE(check_token_ids(negative, 5).ok());
  EXPECT_TRUE(check_token_ids({}, 5).ok());
}

// Repeated ids, many tokens: the cpu scatter-add gives the same bits for 1 and 3 threads.
TEST(EmbeddingKernels, BackwardIsDeterministicAcrossThreadCounts) {
  const int64_t vocab = 50, tokens = 2048, cols = 768;
  Rng rng(1500);
  const std::vector<int32_t> ids = random_ids(rng, tokens, 7);
  const std::vector<float> dy = random_vector(rng, tokens * cols);
  std::vector<float> dw[2];
  const int saved = num_threads();
  for (int k = 0; k < 2; ++k) {
    set_num_threads(k == 0 ? 1 : 3);
    dw[k].assign(vocab * cols, 0.0f);
    cpu::embedding_backward(dw[k].data(), dy.data(), ids.data(), tokens, vocab, cols);
  }
  set_num_threads(saved);
  EXPECT_EQ(dw[0], dw[1]);
}

}  // namespace kiln::testing
