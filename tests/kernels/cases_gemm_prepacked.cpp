// gemm_prepacked cases for the kernel harness: the pre-packed weight GEMM (W (n, k) packed once
// by pack_weight, A packed per call) against ref::gemm with B = W stored (n, k), over m = 1..70
// (the small-M passes with 1-3 strips side by side, and the packed path with partial MR strips),
// odd n and k (partial NR strips, several K blocks), every epilogue, alpha/beta, transposed or
// bf16 A, bf16 weights (pairs of k), f16 weights (IEEE halves), padded leading dims, and small
// cache blockings. Tolerance as in cases_gemm.cpp: fp32 nmse 1e-10; 3e-5 with a bf16 A or W (the
// other operand may be rounded to bf16 for vdpbf16ps). An f16 W is compared with ref::gemm on
// the widened halves (1e-10), and with the f32 packed path on those widened values: equal bit for
// bit (nmse 0), since the half path runs the same FMAs in the same order.
#include <cmath>

#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/gemm_prepacked.h"
#include "tests/kernels/harness.h"

namespace kiln::testing {
namespace {


struct PrepackedCase {
  int64_t m, n, k;
  bool ta = false;
  int64_t pad = 0;  // extra elements per stored row of A, W, C and residual
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false, residual = false;
  Activation act = Activation::kNone;
  bool save_pre = false;                    // with act: the activation's input kept too
  Activation act_grad = Activation::kNone;  // C ⊙ act_grad'(pre), pre random in [-4, 4]
  bool bias_grad = false;  // op(A)'s row sums added into a random (m,) vector: bitwise ref's
  DType a_dtype = DType::kF32;
  DType w_dtype = DType::kF32;  // bf16: pack_weight_as bf16 (pairs of k with AVX512_BF16); f16: halves
  cpu::GemmBlocking blocking{};

  std::string name() const {
    return fmt::format(
        "m={} n={} k={} ta={} pad={} alpha={} beta={} bias={} act={} res={} save_pre={} "
        "act_grad={} bias_grad={} "
        "a={} w={} blk={}/{}",
        m, n, k, ta, pad, alpha, beta, bias, activation_name(act), residual, save_pre,
        activation_name(act_grad), bias_grad, dtype_name(a_dtype), dtype_name(w_dtype), blocking.mc,
        blocking.kc);
  }
};

KernelCase make_case(const PrepackedCase& g, uint64_t seed) {
  return {g.name(), [g, seed]() {
            Rng rng(seed);
            const int64_t lda = std::max<int64_t>(1, (g.ta ? g.m : g.k) + g.pad);
            const int64_t ldw = std::max<int64_t>(1, g.k + g.pad);
            const int64_t ldc = g.n + g.pad, ldr = g.n + 2 * g.pad;
            const std::vector<float> a32 = random_vector(rng, static_cast<size_t>(std::max<int64_t>(1, (g.ta ? g.k : g.m) * lda)));
            std::vector<uint16_t> a16(a32.size());
            for (size_t i = 0; i < a32.size(); ++i) a16[i] = f32_to_bf16(a32[i]);
            std::vector<float> w = random_vector(rng, static_cast<size_t>(std::max<int64_t>(1, g.n * ldw)));
            const bool w_bf16 = g.w_dtype == DType::kBF16, w_f16 = g.w_dtype == DType::kF16;
            std::vector<uint16_t> w16(w.size());
            for (size_t i = 0; i < w.size(); ++i) {
              w16[i] = w_f16 ? f32_to_f16(w[i]) : f32_to_bf16(w[i]);
              if (w_f16) w[i] = f16_to_f32(w16[i]);  // the reference multiplies the halves' values
            }
            const std::vector<float> bias = random_vector(rng, static_cast<size_t>(g.n));
            const std::vector<float> res = random_vector(rng, static_cast<size_t>(g.m * ldr + 1));
            std::vector<float> c0(static_cast<size_t>(g.m * ldc), kPaddingSentinel);
            for (int64_t i = 0; i < g.m; ++i)
              for (int64_t j = 0; j < g.n; ++j) c0[i * ldc + j] = g.beta != 0.0f ? rng.uniform(-1.0f, 1.0f) : NAN;
            const int64_t ldpre = g.n + 3 * g.pad;  // the training epilogues' (m, n) operand
            std::vector<float> pre0(static_cast<size_t>(g.m * ldpre + 1), kPaddingSentinel);
            if (g.act_grad != Activation::kNone)
              for (float& x : pre0) x = rng.uniform(-4.0f, 4.0f);
            std::vector<float> pre_ref = pre0, pre_fast = pre0;

            GemmParams p;
            p.m = g.m; p.n = g.n; p.k = g.k;
            p.a = g.a_dtype == DType::kBF16 ? static_cast<const void*>(a16.data()) : a32.data();
            p.lda = lda; p.a_dtype = g.a_dtype; p.trans_a = g.ta;
            p.b = w_bf16 ? static_cast<const void*>(w16.data()) : w.data();
            p.ldb = ldw; p.b_dtype = w_f16 ? DType::kF32 : g.w_dtype; p.trans_b = true;
            p.ldc = ldc; p.alpha = g.alpha; p.beta = g.beta;
            p.bias = g.bias ? bias.data() : nullptr;
            p.act = g.act;
            p.residual = g.residual ? res.data() : nullptr;
            p.ldr = g.residual ? ldr : 0;
            if (g.save_pre || g.act_grad != Activation::kNone) p.ldpre = ldpre;
            p.save_pre = g.save_pre ? pre_ref.data() : nullptr;
            p.act_grad = g.act_grad;
            p.pre = g.act_grad != Activation::kNone ? pre0.data() : nullptr;
            const std::vector<float> bg0 =
                g.bias_grad ? random_vector(rng, static_cast<size_t>(g.m)) : std::vector<float>{};
            std::vector<float> bg_ref = bg0, bg_fast = bg0;
            p.bias_grad = g.bias_grad ? bg_ref.data() : nullptr;
            std::vector<float> c_ref = c0, c_fast = c0;
            p.c = c_ref.data();
            ref::gemm(p);

            const cpu::GemmBlocking saved = cpu::gemm_blocking(cpu::GemmPath::kF32);
            const cpu::GemmBlocking saved_bf16 = cpu::gemm_blocking(cpu::GemmPath::kBF16);
            if (g.blocking.mc > 0) {
              cpu::set_gemm_blocking(cpu::GemmPath::kF32, g.blocking);
              cpu::set_gemm_blocking(cpu::GemmPath::kBF16, g.blocking);
            }
            const PackedMatrix packed = pack_weight_as(w_f16 ? static_cast<const void*>(w16.data()) : p.b,
                                                       g.w_dtype, g.n, g.k, ldw);
            GemmParams q = p;
            q.b = nullptr;  // ignored by gemm_prepacked
            q.c = c_fast.data();
            if (g.save_pre) q.save_pre = pre_fast.data();
            if (g.bias_grad) q.bias_grad = bg_fast.data();
            Compare ok{"check_gemm_prepacked", {0.0f}, {check_gemm_prepacked(q, packed).ok() ? 0.0f : 1.0f}, 0.0};
            gemm_prepacked(q, packed);
            std::vector<float> c_f32 = c0;  // f16 W: the f32 packed path on the widened weight
            if (w_f16) {
              q.c = c_f32.data();
              q.save_pre = nullptr;
              q.bias_grad = nullptr;
              gemm_prepacked(q, pack_weight(w.data(), g.n, g.k, ldw));
            }
            cpu::set_gemm_blocking(cpu::GemmPath::kF32, saved);
            cpu::set_gemm_blocking(cpu::GemmPath::kBF16, saved_bf16);

            std::vector<Compare> out = compare_strided("C", c_ref, c_fast, g.m, g.n, ldc,
                                                       g.a_dtype == DType::kBF16 || w_bf16 ? 3e-5 : 1e-10);
            out.insert(out.begin(), ok);
            if (g.save_pre) {
              std::vector<Compare> pre =
                  compare_strided("pre", pre_ref, pre_fast, g.m, g.n, ldpre,
                                  g.a_dtype == DType::kBF16 || w_bf16 ? 3e-5 : 1e-10);
              out.insert(out.end(), pre.begin(), pre.end());
            }
            if (g.bias_grad) out.push_back({"bias_grad", bg_ref, bg_fast, 0.0});
            if (w_f16 && g.a_dtype == DType::kF32) {
              std::vector<Compare> same = compare_strided("C vs the f32 path", c_f32, c_fast, g.m, g.n, ldc, 0.0);
              out.insert(out.end(), same.begin(), same.end());
            }
            return out;
          }};
}

}  // namespace

KILN_KERNEL_CASES(gemm_prepacked) {
  std::vector<KernelCase> cases;
  uint64_t seed = 1000;
  // m = 1..70 against odd n and k (k > 256 gives two K blocks at the default KC); the variants
  // cycle so that every feature meets both paths and several strip remainders.
  const int64_t ns[] = {1, 37, 65, 97, 130};
  const int64_t ks[] = {1, 19, 64, 129, 301};
  for (int64_t m = 1; m <= 70; m += (m < 16 ? 1 : 3)) {
    PrepackedCase g{m, ns[m % 5], ks[(m / 2) % 5]};
    g.ta = m % 4 == 3;
    g.pad = m % 3 == 1 ? 3 : 0;
    g.bias = m % 2 == 0;
    g.residual = m % 5 < 2;
    g.beta = m % 7 == 0 ? 0.5f : 0.0f;
    g.alpha = m % 11 == 0 ? -1.5f : 1.0f;
    cases.push_back(make_case(g, seed++));
  }
  // The training pair (activation input saved; C ⊙ act'(pre)) on the packed path over two K
  // blocks and on the small-M path, bf16 weights and padded rows included.
  for (Activation act : {Activation::kGeluTanh, Activation::kSilu, Activation::kRelu}) {
    for (int64_t m : {int64_t{6}, int64_t{33}}) {
      PrepackedCase g{m, 70, 301};
      g.pad = m == 6 ? 2 : 0;
      g.w_dtype = act == Activation::kSilu ? DType::kBF16 : DType::kF32;
      PrepackedCase fwd = g;
      fwd.act = act;
      fwd.bias = true;
      fwd.save_pre = true;
      cases.push_back(make_case(fwd, seed++));
      g.act_grad = act;
      g.beta = m == 33 ? 0.5f : 0.0f;
      cases.push_back(make_case(g, seed++));
    }
  }
  // The bias-gradient epilogue (one pass after the product), transposed and in-place A, the packed
  // and the small-M path: bitwise the reference's sums.
  for (int64_t m : {int64_t{6}, int64_t{33}}) {
    PrepackedCase g{m, 70, 301, m == 33, m == 6 ? 2 : 0};
    g.bias_grad = true;
    cases.push_back(make_case(g, seed++));
  }
  // Every activation on the packed and the small-M path.
  for (Activation act : {Activation::kGeluTanh, Activation::kSilu, Activation::kRelu}) {
    for (int64_t m : {int64_t{6}, int64_t{33}}) {
      PrepackedCase g{m, 70, 50};
      g.act = act;
      g.bias = g.residual = true;
      g.beta = act == Activation::kRelu ? 1.0f : 0.0f;
      cases.push_back(make_case(g, seed++));
    }
  }
  // bf16 A (widened while packing A); k = 0 (epilogue only); m = 0.
  cases.push_back(make_case({.m = 45, .n = 33, .k = 77, .bias = true, .a_dtype = DType::kBF16}, seed++));
  cases.push_back(make_case({.m = 3, .n = 33, .k = 77, .ta = true, .a_dtype = DType::kBF16}, seed++));
  cases.push_back(make_case({.m = 16, .n = 40, .k = 45, .ta = true, .pad = 2, .residual = true, .a_dtype = DType::kBF16}, seed++));
  cases.push_back(make_case({.m = 15, .n = 97, .k = 300, .pad = 1, .beta = 1.0f, .residual = true, .a_dtype = DType::kBF16}, seed++));
  cases.push_back(make_case({.m = 20, .n = 37, .k = 0, .beta = 0.5f, .bias = true, .residual = true}, seed++));
  cases.push_back(make_case({.m = 0, .n = 37, .k = 5}, seed++));
  // bf16 weights (pairs of k with AVX512_BF16, A rounded to bf16; widened to f32 elsewhere):
  // m = 1..8 (the small-M pair kernels, 1-3 strips side by side) and the packed path, odd k
  // (the last pair padded), f32 or bf16 A, transposed A, the epilogues.
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 11, 16, 33, 70}) {
    PrepackedCase g{m, ns[m % 5], ks[(m + 1) % 5]};
    g.w_dtype = DType::kBF16;
    g.a_dtype = m % 3 == 1 ? DType::kBF16 : DType::kF32;
    g.ta = m % 4 == 2;
    g.pad = m % 2 == 1 ? 3 : 0;
    g.bias = m % 2 == 0;
    g.residual = m % 3 == 0;
    g.beta = m % 5 == 0 ? 0.5f : 0.0f;
    g.act = m % 4 == 0 ? Activation::kGeluTanh : Activation::kNone;
    cases.push_back(make_case(g, seed++));
  }
  cases.push_back(make_case({.m = 4, .n = 130, .k = 1, .w_dtype = DType::kBF16}, seed++));
  cases.push_back(make_case({.m = 7, .n = 97, .k = 0, .beta = 0.5f, .bias = true, .w_dtype = DType::kBF16}, seed++));
  // f16 weights (halves widened in registers): m = 1..8 (the small-M half kernels, 1-3 strips
  // side by side), 15 and 16 (two small-M passes), the packed path with partial strips, odd n and
  // k, every epilogue, transposed and bf16 A, padded rows, several K blocks.
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 29, 70}) {
    PrepackedCase g{m, ns[(m + 2) % 5], ks[(m + 3) % 5]};
    g.w_dtype = DType::kF16;
    g.a_dtype = m == 5 || m == 29 ? DType::kBF16 : DType::kF32;
    g.ta = m % 4 == 1;
    g.pad = m % 2 == 0 ? 3 : 0;
    g.bias = m % 3 != 0;
    g.residual = m % 2 == 1;
    g.beta = m % 7 == 0 ? 0.5f : 0.0f;
    g.act = m % 4 == 2 ? Activation::kSilu : Activation::kNone;
    cases.push_back(make_case(g, seed++));
  }
  cases.push_back(make_case({.m = 8, .n = 37, .k = 3001, .bias = true, .w_dtype = DType::kF16}, seed++));
  cases.push_back(make_case({.m = 150, .n = 101, .k = 151, .beta = 1.0f, .residual = true, .w_dtype = DType::kF16,
                             .blocking = {28, 32, 64}}, seed++));
  // Long K: the small-M passes pack A (interleaved, bf16 pairs or f32) split over the threads
  // (m * steps >= 8192); odd k pads the last pair, a second pass of rows (m = 11) restarts it.
  for (int v = 0; v < 4; ++v) {
    PrepackedCase g{v == 3 ? int64_t{11} : int64_t{8 - v}, 37, v % 2 == 0 ? int64_t{2051} : int64_t{3000}};
    g.w_dtype = v < 2 ? DType::kBF16 : DType::kF32;
    g.a_dtype = v == 1 || v == 2 ? DType::kBF16 : DType::kF32;
    g.ta = v >= 2;
    g.bias = v == 0;
    cases.push_back(make_case(g, seed++));
  }
  // Small blockings (independent of the machine's tuning file): several M blocks and K blocks
  // (prefill-like m), odd tails; beta = 0 on the first K block only.
  for (int v = 0; v < 5; ++v) {
    PrepackedCase g{v % 3 == 0 ? int64_t{150} : v % 3 == 1 ? int64_t{64} : int64_t{11}, 101, 151};
    g.w_dtype = v >= 3 ? DType::kBF16 : DType::kF32;
    g.blocking = {28, 32, 64};
    g.beta = v == 1 ? 1.0f : 0.0f;
    g.bias = g.residual = true;
    g.ta = v == 1;
    g.act = Activation::kSilu;
    cases.push_back(make_case(g, seed++));
  }
  return cases;
}

}  // namespace kiln::testing
