// Quantized GEMM cases for the kernel harness: cpu::quant_gemm (int8, int4, fp8 E4M3/E5M2, f16;
// group-wise, per-channel, per-tensor; symmetric and zero-point), cpu::w8a8_gemm (VNNI and the
// 16-bit fallback) and cpu::quantize_rows_int8 against their references, over odd shapes, both
// the decode tile (n < 16) and the dequantized-panel path (n >= 16), group sizes the SIMD
// targets take and ones they hand to the scalar kernel.
//
// Tolerances: weight-only sums are f32 in the fast path, double in the reference: nmse ~ k·u²
// (≤ 3e-11 at k = 4096, zero-point terms of the same magnitude), bound 1e-9. W8A8 sums are
// exact int32 in both, and the dequantization is the same f32 expression: bound 1e-12.
// quantize_rows_int8 must match bit for bit (bound 0).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kiln/kernels/cpu/quant_gemm_kernels.h"
#include "kiln/kernels/quant_gemm.h"
#include "tests/kernels/harness.h"
#include "tests/kernels/quant_test_util.h"

namespace kiln::testing {
namespace {

struct WoCase {
  QuantFormat f;
  int64_t n, out, in, group;
  bool zeros = false, per_tensor = false, bias = false, residual = false;
  int64_t pad = 0;
};

KernelCase make_wo_case(const WoCase& c, uint64_t seed) {
  const std::string name =
      fmt::format("{} n={} out={} in={} g={} zeros={} per_tensor={} bias={} res={} pad={}", quant_format_name(c.f),
                  c.n, c.out, c.in, c.group, c.zeros, c.per_tensor, c.bias, c.residual, c.pad);
  return {name, [c, seed]() {
            Rng rng(seed);
            const OwnedQuantWeight w = random_quant_weight(rng, c.f, c.out, c.in, c.group, c.zeros, c.per_tensor);
            const int64_t ldx = c.in + c.pad, ldy = c.out + c.pad, ldr = c.out + 2 * c.pad;
            const std::vector<float> x = random_vector(rng, static_cast<size_t>(c.n * ldx));
            const std::vector<float> bias = random_vector(rng, static_cast<size_t>(c.out));
            const std::vector<float> res = random_vector(rng, static_cast<size_t>(c.n * ldr));
            QuantGemmParams p;
            p.w = &w.w;
            p.n = c.n;
            p.x = x.data();
            p.ldx = ldx;
            p.ldy = ldy;
            p.bias = c.bias ? bias.data() : nullptr;
            p.residual = c.residual ? res.data() : nullptr;
            p.ldr = ldr;
            std::vector<float> y_ref(static_cast<size_t>(c.n * ldy), kPaddingSentinel), y_fast = y_ref;
            p.y = y_ref.data();
            EXPECT_TRUE(check_quant_gemm(p).ok()) << check_quant_gemm(p).to_string();
            ref::quant_gemm(p);
            p.y = y_fast.data();
            cpu::quant_gemm(p);
            return compare_strided("y", y_ref, y_fast, c.n, c.out, ldy, 1e-9);
          }};
}

struct W8A8Case {
  int64_t n, out, in;
  bool per_tensor = false, bias = false, residual = false, vnni = true;
  int64_t pad = 0;
};

KernelCase make_w8a8_case(const W8A8Case& c, uint64_t seed) {
  const std::string name = fmt::format("w8a8 n={} out={} in={} per_tensor={} bias={} res={} vnni={} pad={}", c.n,
                                       c.out, c.in, c.per_tensor, c.bias, c.residual, c.vnni, c.pad);
  return {name, [c, seed]() {
            Rng rng(seed);
            const OwnedQuantWeight w = random_quant_weight(rng, QuantFormat::kInt8, c.out, c.in, c.in, false, c.per_tensor);
            std::vector<int32_t> sums(static_cast<size_t>(c.out));
            w8a8_row_sums(w.w, sums.data());
            const int64_t lda = c.in + c.pad, ldy = c.out + c.pad, ldr = c.out + 2 * c.pad;
            std::vector<int8_t> a(static_cast<size_t>(c.n * lda));
            for (int8_t& v : a) v = static_cast<int8_t>(static_cast<int>(rng.below(256)) - 128);  // -128 included
            const std::vector<float> sa = random_vector(rng, static_cast<size_t>(c.n), 0.001f, 0.02f);
            const std::vector<float> bias = random_vector(rng, static_cast<size_t>(c.out));
            const std::vector<float> res = random_vector(rng, static_cast<size_t>(c.n * ldr));
            W8A8Params p;
            p.w = &w.w;
            p.w_row_sums = sums.data();
            p.n = c.n;
            p.a = a.data();
            p.lda = lda;
            p.a_scales = sa.data();
            p.ldy = ldy;
            p.bias = c.bias ? bias.data() : nullptr;
            p.residual = c.residual ? res.data() : nullptr;
            p.ldr = ldr;
            std::vector<float> y_ref(static_cast<size_t>(c.n * ldy), 7.25f), y_fast = y_ref;
            p.y = y_ref.data();
            EXPECT_TRUE(check_w8a8(p).ok()) << check_w8a8(p).to_string();
            ref::w8a8_gemm(p);
            p.y = y_fast.data();
            cpu::set_w8a8_vnni_allowed(c.vnni);
            cpu::w8a8_gemm(p);
            cpu::set_w8a8_vnni_allowed(true);
            // Padding included: it must stay at the sentinel in both.
            return std::vector<Compare>{Compare{"y", y_ref, y_fast, 1e-12}};
          }};
}

KernelCase make_quantize_case(int64_t n, int64_t in, int64_t pad, uint64_t seed) {
  return {fmt::format("quantize_rows_int8 n={} in={} pad={}", n, in, pad), [=]() {
            Rng rng(seed);
            const int64_t ldx = in + pad, ldq = in + pad;
            std::vector<float> x = random_vector(rng, static_cast<size_t>(n * ldx), -3.0f, 3.0f);
            if (n > 2)
              for (int64_t k = 0; k < in; ++k) x[1 * ldx + k] = 0.0f;  // an all-zero row: scale 0
            if (in > 4) x[3] = 0.5f * x[0];  // values that land near .5 on the grid still round alike
            std::vector<int8_t> q_ref(static_cast<size_t>(n * ldq), 99), q_fast = q_ref;
            std::vector<float> s_ref(static_cast<size_t>(n)), s_fast(static_cast<size_t>(n));
            ref::quantize_rows_int8(x.data(), n, in, ldx, q_ref.data(), ldq, s_ref.data());
            cpu::quantize_rows_int8(x.data(), n, in, ldx, q_fast.data(), ldq, s_fast.data());
            return std::vector<Compare>{Compare{"q", std::vector<float>(q_ref.begin(), q_ref.end()),
                                                std::vector<float>(q_fast.begin(), q_fast.end()), 0.0},
                                        Compare{"scales", s_ref, s_fast, 0.0}};
          }};
}

}  // namespace

KILN_KERNEL_CASES(quant_gemm) {
  std::vector<KernelCase> cases;
  uint64_t seed = 100;
  const QuantFormat formats[] = {QuantFormat::kInt8, QuantFormat::kInt4, QuantFormat::kFp8E4M3, QuantFormat::kFp8E5M2,
                                 QuantFormat::kF16};
  const int64_t ns[] = {1, 2, 3, 7, 16, 33};
  const int64_t ins[] = {32, 64, 96, 128, 384};
  const int64_t outs[] = {1, 5, 17, 33};
  // Every format x n x in, out cycling; groups: 32, per-channel (g = in), and where it divides,
  // 64 / 128 (SIMD) or 16 / 8 (the AVX-512 / AVX2 scalar hand-off).
  int idx = 0;
  for (QuantFormat f : formats) {
    const bool is_int = f == QuantFormat::kInt8 || f == QuantFormat::kInt4;
    for (int64_t n : ns) {
      for (int64_t in : ins) {
        WoCase c{f, n, outs[idx % 4], in, 32};
        const int64_t alt[] = {in, 16, in % 64 == 0 ? 64 : 32, in % 128 == 0 ? 128 : 8};
        c.group = alt[idx % 4];
        c.zeros = is_int && idx % 3 != 0;
        c.per_tensor = !is_int && idx % 5 == 0;
        c.bias = idx % 2 == 0;
        c.residual = idx % 3 == 1;
        c.pad = idx % 4 == 2 ? 3 : 0;
        cases.push_back(make_wo_case(c, seed++));
        ++idx;
      }
    }
    // Decode-sized rows with a long reduction.
    cases.push_back(make_wo_case({f, 1, 9, 4096, 128, is_int, false, true, false, 0}, seed++));
    cases.push_back(make_wo_case({f, 5, 7, 2048, 64, false, false, false, true, 0}, seed++));
  }
  for (int64_t n : ns) {
    for (int64_t in : {1, 7, 32, 64, 100, 384}) {
      for (bool vnni : {true, false}) {
        W8A8Case c{n, outs[idx % 4] + 2, in};
        c.per_tensor = idx % 5 == 0;
        c.bias = idx % 2 == 0;
        c.residual = idx % 3 == 1;
        c.vnni = vnni;
        c.pad = idx % 4 == 2 ? 3 : 0;
        cases.push_back(make_w8a8_case(c, seed++));
        ++idx;
      }
    }
  }
  cases.push_back(make_w8a8_case({1, 11, 4096, false, true, false, true, 0}, seed++));
  cases.push_back(make_w8a8_case({3, 9, 4096, false, false, true, false, 0}, seed++));
  for (int64_t n : {1, 3, 17})
    for (int64_t in : {1, 7, 33, 257, 1000}) cases.push_back(make_quantize_case(n, in, in % 2, seed++));
  return cases;
}

}  // namespace kiln::testing
