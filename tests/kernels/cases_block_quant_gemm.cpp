// Block-quantized GEMM cases for the kernel harness: cpu::block_quant_gemm (Q8 and Q4 packed
// weights; VNNI and the 16-bit multiply-add path) and cpu::quantize_blocks_int8 against their
// references, over odd channel counts (partial 16-channel tiles, an odd tile count), 1–4 row
// remainders, decode and prefill row counts, long reductions, bias, residual and strides.
//
// Tolerances: the activation codes must match bit for bit (bound 0), so every block dot is the
// same exact int32 in both; each block's scale is the same f32 product dw · da. What differs is
// the sum over the in/32 blocks: f32 with one rounding per block in the fast path, double in
// the reference, so nmse ~ nb · u² (≤ 1e-13 at nb = 128); bound 1e-10.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kiln/kernels/block_quant_gemm.h"
#include "tests/kernels/harness.h"
#include "tests/kernels/quant_test_util.h"

namespace kiln::testing {
namespace {

struct BqCase {
  QuantFormat f;
  int64_t n, out, in;
  bool bias = false, residual = false, vnni = true;
  int64_t pad = 0;
};

KernelCase make_bq_case(const BqCase& c, uint64_t seed) {
  const std::string name = fmt::format("block {} n={} out={} in={} bias={} res={} vnni={} pad={}",
                                       quant_format_name(c.f), c.n, c.out, c.in, c.bias, c.residual, c.vnni, c.pad);
  return {name, [c, seed]() {
            Rng rng(seed);
            const OwnedQuantWeight src = random_quant_weight(rng, c.f, c.out, c.in, kQuantBlock, false);
            PackedBlockWeight packed;
            const Status s = pack_block_quant(src.w, &packed);
            EXPECT_TRUE(s.ok()) << s.to_string();
            const int64_t ldx = c.in + c.pad, ldy = c.out + c.pad, ldr = c.out + 2 * c.pad;
            std::vector<float> x = random_vector(rng, static_cast<size_t>(c.n * ldx), -2.0f, 2.0f);
            if (c.in >= 64)  // an all-zero block (da = 0) and one with a single large value
              for (int64_t k = 32; k < 64; ++k) x[k] = 0.0f;
            if (c.n > 1) x[ldx] = 40.0f;
            const std::vector<float> bias = random_vector(rng, static_cast<size_t>(c.out));
            const std::vector<float> res = random_vector(rng, static_cast<size_t>(c.n * ldr));
            BlockQuantGemmParams p;
            p.w = &packed.w;
            p.n = c.n;
            p.x = x.data();
            p.ldx = ldx;
            p.ldy = ldy;
            p.bias = c.bias ? bias.data() : nullptr;
            p.residual = c.residual ? res.data() : nullptr;
            p.ldr = ldr;
            std::vector<float> y_ref(static_cast<size_t>(c.n * ldy), kPaddingSentinel), y_fast = y_ref;
            p.y = y_ref.data();
            EXPECT_TRUE(check_block_quant_gemm(p).ok()) << check_block_quant_gemm(p).to_string();
            ref::block_quant_gemm(p);
            p.y = y_fast.data();
            cpu::set_block_quant_vnni_allowed(c.vnni);
            cpu::block_quant_gemm(p);
            cpu::set_block_quant_vnni_allowed(true);
            return compare_strided("y", y_ref, y_fast, c.n, c.out, ldy, 1e-10);
          }};
}

KernelCase make_quantize_blocks_case(int64_t n, int64_t in, int64_t pad, uint64_t seed) {
  return {fmt::format("quantize_blocks_int8 n={} in={} pad={}", n, in, pad), [=]() {
            Rng rng(seed);
            const int64_t ldx = in + pad, ldq = in + pad, nb = in / kQuantBlock;
            std::vector<float> x = random_vector(rng, static_cast<size_t>(n * ldx), -3.0f, 3.0f);
            for (int64_t k = 0; k < kQuantBlock; ++k) x[k] = 0.0f;             // an all-zero block
            if (nb > 1) x[kQuantBlock + 1] = 0.5f * x[kQuantBlock];            // values near .5 on the grid
            if (nb > 2)                                                        // exact ties: 2.5, -0.5 on the grid
              for (int64_t k = 0; k < kQuantBlock; ++k) x[2 * kQuantBlock + k] = (k == 0 ? 127.0f : (k % 2 ? 2.5f : -0.5f));
            std::vector<int8_t> q_ref(static_cast<size_t>(n * ldq), 99), q_fast = q_ref;
            std::vector<float> s_ref(static_cast<size_t>(n * nb)), s_fast(s_ref.size());
            std::vector<int32_t> u_ref(s_ref.size()), u_fast(s_ref.size());
            ref::quantize_blocks_int8(x.data(), n, in, ldx, q_ref.data(), ldq, s_ref.data(), u_ref.data());
            cpu::quantize_blocks_int8(x.data(), n, in, ldx, q_fast.data(), ldq, s_fast.data(), u_fast.data());
            return std::vector<Compare>{
                Compare{"q", std::vector<float>(q_ref.begin(), q_ref.end()), std::vector<float>(q_fast.begin(), q_fast.end()), 0.0},
                Compare{"scales", s_ref, s_fast, 0.0},
                Compare{"sums", std::vector<float>(u_ref.begin(), u_ref.end()), std::vector<float>(u_fast.begin(), u_fast.end()), 0.0}};
          }};
}

}  // namespace

KILN_KERNEL_CASES(block_quant_gemm) {
  std::vector<KernelCase> cases;
  uint64_t seed = 700;
  const int64_t ns[] = {1, 2, 3, 4, 5, 7, 16, 33};
  const int64_t ins[] = {32, 64, 96, 160};
  const int64_t outs[] = {1, 5, 16, 17, 33, 48, 70};
  int idx = 0;
  for (QuantFormat f : {QuantFormat::kInt8, QuantFormat::kInt4})
    for (bool vnni : {true, false})
      for (int64_t n : ns)
        for (int64_t in : ins) {
          BqCase c{f, n, outs[idx % 7], in};
          c.bias = idx % 2 == 0;
          c.residual = idx % 3 == 1;
          c.vnni = vnni;
          c.pad = idx % 4 == 2 ? 3 : 0;
          cases.push_back(make_bq_case(c, seed++));
          ++idx;
        }
  // Decode and prefill sizes with long reductions (nb = 64, 128).
  for (QuantFormat f : {QuantFormat::kInt8, QuantFormat::kInt4}) {
    cases.push_back(make_bq_case({f, 1, 40, 2048, true, false, true, 0}, seed++));
    cases.push_back(make_bq_case({f, 1, 40, 2048, false, true, false, 0}, seed++));
    cases.push_back(make_bq_case({f, 9, 35, 4096, true, true, true, 1}, seed++));
  }
  for (int64_t n : {1, 3, 17})
    for (int64_t in : {32, 96, 1024}) cases.push_back(make_quantize_blocks_case(n, in, n % 2 ? 0 : 5, seed++));
  return cases;
}

}  // namespace kiln::testing
