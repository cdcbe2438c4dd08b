// GEMM cases for the kernel harness: cpu::gemm against ref::gemm over odd and even shapes, all
// four transpose combinations, padded leading dims, alpha/beta, every epilogue (the training
// pair too: the activation's input saved, the multiply by act'), bf16 inputs, several cache
// blockings (multi-block K, N and M loops) and the decode-like small-M path.
//
// Tolerances (normalized MSE, see harness.cpp): an fp32 length-k dot product in any summation
// order has nmse ~ k u^2 with u = 2^-24 (~6e-15 per 100 terms), so 1e-10 is orders above any
// correct kernel and far below a wrong one (a single misplaced element gives ~1e-3). With a bf16
// input, the fast path may round the other f32 operand to bf16 (u = 2^-8): each product then
// carries a relative error up to u, variance u^2/3, so nmse ~ 5e-6; the bound is 3e-5.
#include <cmath>
#include <memory>

#include <gtest/gtest.h>

#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/gemm.h"
#include "tests/kernels/harness.h"

namespace kiln::testing {
namespace {


struct GemmCase {
  int64_t m, n, k;
  bool ta = false, tb = false;
  int64_t pad = 0;  // extra elements per stored row of A, B, C and residual
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false, residual = false;
  Activation act = Activation::kNone;
  bool save_pre = false;                    // with act: the activation's input kept too
  Activation act_grad = Activation::kNone;  // C ⊙ act_grad'(pre), pre random in [-4, 4]
  bool bias_grad = false;  // op(A)'s row sums added into a random (m,) vector: bitwise ref's
  DType a_dtype = DType::kF32, b_dtype = DType::kF32;
  cpu::GemmBlocking blocking{};  // {0,0,0}: the current blocking

  std::string name() const {
    return fmt::format(
        "m={} n={} k={} ta={} tb={} pad={} alpha={} beta={} bias={} act={} res={} "
        "save_pre={} act_grad={} bias_grad={} a={} b={} blk={}/{}/{}",
        m, n, k, ta, tb, pad, alpha, beta, bias, activation_name(act), residual, save_pre,
        activation_name(act_grad), bias_grad, dtype_name(a_dtype), dtype_name(b_dtype), blocking.mc,
        blocking.kc, blocking.nc);
  }
};

// Operand storage in f32 or bf16 with every element (padding included) random.
struct Operand {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  DType dtype;
  const void* data() const { return dtype == DType::kBF16 ? static_cast<const void*>(bf16.data()) : f32.data(); }
};

Operand make_operand(Rng& rng, int64_t rows, int64_t ld, DType dtype) {
  Operand o;
  o.dtype = dtype;
  o.f32 = random_vector(rng, static_cast<size_t>(std::max<int64_t>(1, rows * ld)));
  if (dtype == DType::kBF16) {
    o.bf16.resize(o.f32.size());
    for (size_t i = 0; i < o.f32.size(); ++i) o.bf16[i] = f32_to_bf16(o.f32[i]);
  }
  return o;
}

KernelCase make_case(const GemmCase& g, uint64_t seed) {
  return {g.name(), [g, seed]() {
            Rng rng(seed);
            const int64_t a_rows = g.ta ? g.k : g.m, a_cols = g.ta ? g.m : g.k;
            const int64_t b_rows = g.tb ? g.n : g.k, b_cols = g.tb ? g.k : g.n;
            const int64_t lda = std::max<int64_t>(1, a_cols + g.pad);
            const int64_t ldb = std::max<int64_t>(1, b_cols + g.pad);
            const int64_t ldc = g.n + g.pad, ldr = g.n + 2 * g.pad;
            const Operand a = make_operand(rng, a_rows, lda, g.a_dtype);
            const Operand b = make_operand(rng, b_rows, ldb, g.b_dtype);
            const std::vector<float> bias = random_vector(rng, static_cast<size_t>(g.n));
            const std::vector<float> res = random_vector(rng, static_cast<size_t>(g.m * ldr + 1));
            // C: valid region random when beta reads it, NaN when beta = 0 (must not be read).
            std::vector<float> c0(static_cast<size_t>(g.m * ldc), kPaddingSentinel);
            for (int64_t i = 0; i < g.m; ++i)
              for (int64_t j = 0; j < g.n; ++j)
                c0[i * ldc + j] = g.beta != 0.0f ? rng.uniform(-1.0f, 1.0f) : NAN;
            // The training epilogues' (m, n) operand, rows ldpre apart: written (save_pre, padding
            // sentinels around it) or read (act_grad: wide enough to reach the activations'
            // curved parts and ReLU's both sides).
            const int64_t ldpre = g.n + 3 * g.pad;
            std::vector<float> pre0(static_cast<size_t>(g.m * ldpre + 1), kPaddingSentinel);
            if (g.act_grad != Activation::kNone)
              for (float& x : pre0) x = rng.uniform(-4.0f, 4.0f);

            GemmParams p;
            p.m = g.m; p.n = g.n; p.k = g.k;
            p.a = a.data(); p.lda = lda; p.a_dtype = g.a_dtype; p.trans_a = g.ta;
            p.b = b.data(); p.ldb = ldb; p.b_dtype = g.b_dtype; p.trans_b = g.tb;
            p.ldc = ldc; p.alpha = g.alpha; p.beta = g.beta;
            p.bias = g.bias ? bias.data() : nullptr;
            p.act = g.act;
            p.residual = g.residual ? res.data() : nullptr;
            p.ldr = g.residual ? ldr : 0;
            std::vector<float> pre_ref = pre0;
            if (g.save_pre || g.act_grad != Activation::kNone) p.ldpre = ldpre;
            p.save_pre = g.save_pre ? pre_ref.data() : nullptr;
            p.act_grad = g.act_grad;
            p.pre = g.act_grad != Activation::kNone ? pre0.data() : nullptr;
            // bias_grad: added into, so its start is random (drawn only for these cases).
            const std::vector<float> bg0 =
                g.bias_grad ? random_vector(rng, static_cast<size_t>(g.m)) : std::vector<float>{};
            std::vector<float> bg_ref = bg0;
            p.bias_grad = g.bias_grad ? bg_ref.data() : nullptr;
            std::vector<float> c_ref = c0;
            p.c = c_ref.data();
            EXPECT_TRUE(check_gemm(p).ok()) << check_gemm(p).to_string();
            ref::gemm(p);
            const cpu::GemmBlocking saved_f32 = cpu::gemm_blocking(cpu::GemmPath::kF32);
            const cpu::GemmBlocking saved_bf16 = cpu::gemm_blocking(cpu::GemmPath::kBF16);
            if (g.blocking.mc > 0) {
              cpu::set_gemm_blocking(cpu::GemmPath::kF32, g.blocking);
              cpu::set_gemm_blocking(cpu::GemmPath::kBF16, g.blocking);
            }
            const bool low = g.a_dtype == DType::kBF16 || g.b_dtype == DType::kBF16;
            // bf16: every product the packed path can pick (vdpbf16ps, widened to f32, and AMX
            // tiles where this process may use them).
            const cpu::Bf16Kernel picked = cpu::bf16_gemm_kernel();
            std::vector<Compare> out;
            for (cpu::Bf16Kernel kernel : {cpu::Bf16Kernel::kDot, cpu::Bf16Kernel::kWiden, cpu::Bf16Kernel::kAmx}) {
              if (!low && kernel != cpu::Bf16Kernel::kDot) break;
              if (kernel == cpu::Bf16Kernel::kAmx && !cpu::bf16_amx_available()) continue;
              cpu::set_bf16_gemm_kernel(kernel);
              std::vector<float> c = c0, pre = pre0, bg = bg0;
              p.c = c.data();
              if (g.save_pre) p.save_pre = pre.data();
              if (g.bias_grad) p.bias_grad = bg.data();
              cpu::gemm(p);
              const char* what = kernel == cpu::Bf16Kernel::kDot ? "C" : kernel == cpu::Bf16Kernel::kWiden ? "C widened" : "C amx";
              for (Compare& cmp : compare_strided(what, c_ref, c, g.m, g.n, ldc, low ? 3e-5 : 1e-10))
                out.push_back(std::move(cmp));
              if (g.save_pre) {
                for (Compare& cmp : compare_strided(fmt::format("{} pre", what), pre_ref, pre, g.m,
                                                    g.n, ldpre, low ? 3e-5 : 1e-10))
                  out.push_back(std::move(cmp));
              }
              if (g.bias_grad) out.push_back({fmt::format("{} bias_grad", what), bg_ref, bg, 0.0});
            }
            cpu::set_bf16_gemm_kernel(picked);
            cpu::set_gemm_blocking(cpu::GemmPath::kF32, saved_f32);
            cpu::set_gemm_blocking(cpu::GemmPath::kBF16, saved_bf16);
            return out;
          }};
}

}  // namespace

KILN_KERNEL_CASES(gemm) {
  std::vector<KernelCase> cases;
  uint64_t seed = 1;
  const int64_t sizes[] = {1, 2, 7, 16, 33, 64, 100, 257};
  // Shapes: every (m, n) pair of the size set with k cycling through it; transposes cycle too.
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      GemmCase g{sizes[i], sizes[j], sizes[(i + 3 * j) % 8]};
      g.ta = (i + j) % 2 == 1;
      g.tb = (i + j) / 2 % 2 == 1;
      if ((i * 8 + j) % 5 == 0) g.pad = 3;
      cases.push_back(make_case(g, seed++));
    }
  }
  // Larger, all four transposes; padded; alpha/beta.
  for (int t = 0; t < 4; ++t) {
    GemmCase g{300, 520, 129, t % 2 == 1, t / 2 == 1};
    g.pad = t == 3 ? 5 : 0;
    cases.push_back(make_case(g, seed++));
  }
  cases.push_back(make_case({.m = 33, .n = 100, .k = 64, .pad = 1, .alpha = -0.5f, .beta = 1.0f}, seed++));
  cases.push_back(make_case({.m = 64, .n = 33, .k = 257, .tb = true, .alpha = 2.0f, .beta = 0.75f}, seed++));
  cases.push_back(make_case({.m = 20, .n = 37, .k = 0, .beta = 0.5f, .bias = true, .residual = true}, seed++));
  // Every epilogue, with and without beta, on the packed and the small-M path.
  for (Activation act : {Activation::kNone, Activation::kGeluTanh, Activation::kSilu, Activation::kRelu}) {
    for (int64_t m : {int64_t{3}, int64_t{45}}) {
      GemmCase g{m, 70, 50, false, true, 2, 1.5f, act == Activation::kRelu ? 1.0f : 0.0f, true, true, act};
      cases.push_back(make_case(g, seed++));
      g.residual = false;
      g.beta = 0.25f;
      g.ta = true;
      cases.push_back(make_case(g, seed++));
    }
  }
  // The training pair on the packed path (several K blocks: only the last one's epilogue saves
  // or multiplies), the small-M path, transposed A, beta, bf16 inputs (the AMX tiles' scratch
  // epilogue) and padded rows: the activation's input saved beside act(C + bias), and
  // C = (alpha A B + beta C) ⊙ act'(pre) for every activation.
  for (Activation act : {Activation::kGeluTanh, Activation::kSilu, Activation::kRelu}) {
    for (int v = 0; v < 4; ++v) {
      GemmCase g{v == 1 ? int64_t{5} : int64_t{70}, 96, 130, v == 2, true, v == 3 ? 2 : 0};
      g.beta = v == 2 ? 0.5f : 0.0f;
      g.alpha = v == 3 ? 0.75f : 1.0f;
      if (v == 0) g.blocking = {28, 48, 64};
      if (v == 3) g.a_dtype = g.b_dtype = DType::kBF16;
      GemmCase fwd = g;
      fwd.act = act;
      fwd.bias = v != 2;
      fwd.residual = v == 1;
      fwd.save_pre = true;
      cases.push_back(make_case(fwd, seed++));
      g.act_grad = act;
      cases.push_back(make_case(g, seed++));
    }
  }
  // The bias-gradient epilogue (BGRADA), bitwise the reference's k-order sums: transposed f32 A
  // (the weight gradient's dYᵀ) on the packed path with several K blocks and two NC panels (only
  // the task holding column 0 adds), on the column split (m <= n, several strips per thread),
  // with C accumulated; A in place (element by element), bf16 A (every bf16 kernel), the
  // small-M path, n = 0 (no product, the sums still made) and k = 0 (nothing added).
  {
    const GemmCase bg[] = {
        {.m = 70, .n = 96, .k = 130, .ta = true, .tb = true, .blocking = {28, 48, 64}},
        {.m = 70, .n = 260, .k = 77, .ta = true, .pad = 2},
        {.m = 300, .n = 520, .k = 129, .ta = true, .beta = 1.0f, .bias = true},
        {.m = 45, .n = 33, .k = 100, .pad = 1, .blocking = {28, 48, 64}},
        {.m = 57, .n = 65, .k = 130, .ta = true, .a_dtype = DType::kBF16, .b_dtype = DType::kBF16},
        {.m = 5, .n = 70, .k = 50, .ta = true},
        {.m = 20, .n = 0, .k = 37, .ta = true, .pad = 1},
        {.m = 20, .n = 37, .k = 0, .beta = 0.5f},
    };
    for (GemmCase g : bg) {
      g.bias_grad = true;
      cases.push_back(make_case(g, seed++));
    }
  }
  // bf16 A, B or both (dpbf16ps on AVX512_BF16, widened elsewhere), odd k for pair padding.
  for (int v = 0; v < 6; ++v) {
    GemmCase g{v < 3 ? int64_t{57} : int64_t{5}, 65, v % 2 ? 33 : 130, v % 2 == 0, v / 2 % 2 == 1};
    g.a_dtype = v % 3 == 2 ? DType::kF32 : DType::kBF16;
    g.b_dtype = v % 3 == 0 ? DType::kF32 : DType::kBF16;
    g.bias = v == 1;
    g.act = v == 1 ? Activation::kGeluTanh : Activation::kNone;
    g.beta = v == 4 ? 1.0f : 0.0f;
    cases.push_back(make_case(g, seed++));
  }
  // The AMX path's whole tiles that run in C (C += acc, gemm_amx.cpp's run_tile) or go through
  // the scratch tile and the epilogue (bias, residual, both, alpha): 70 = 2 x 32 + 6 rows, so the
  // partial strip takes the scratch tile too. Padded rows: the terms' strides are not the width.
  for (int v = 0; v < 5; ++v) {
    GemmCase g{70, 96, 130, v == 4, true, 3};
    g.a_dtype = g.b_dtype = DType::kBF16;
    g.beta = v == 0 || v == 3 ? 1.0f : 0.0f;
    g.bias = v == 1 || v == 3;
    g.residual = v == 2 || v == 4;
    g.alpha = v == 4 ? 0.5f : 1.0f;
    cases.push_back(make_case(g, seed++));
  }
  // Small cache blockings: several M blocks, K blocks (odd tail for bf16) and N panels.
  for (int v = 0; v < 4; ++v) {
    GemmCase g{100, 200, 151, v % 2 == 1, v / 2 == 1};
    g.blocking = {28, 32, 64};
    g.beta = 1.0f;
    g.bias = g.residual = v == 0;
    g.act = v == 0 ? Activation::kSilu : Activation::kNone;
    if (v >= 2) g.a_dtype = g.b_dtype = DType::kBF16;
    cases.push_back(make_case(g, seed++));
  }
  // Several groups of B micro-panels in one panel (run_block's tile order: groups of 8 strips of
  // 32, the last group short and its last strip partial: 600 = 18 x 32 + 24) over several M and
  // K blocks, M > N so the shared-panel path runs at every thread count.
  for (DType dt : {DType::kF32, DType::kBF16}) {
    GemmCase g{650, 600, 97};
    g.blocking = {56, 48, 1024};
    g.beta = 0.5f;
    g.bias = true;
    g.a_dtype = g.b_dtype = dt;
    cases.push_back(make_case(g, seed++));
  }
  // The column split (M <= N, one column chunk per thread, each thread packing its own B) with
  // bf16, transposed B and the full epilogue; even K: full strips read A in place (the direct-A
  // kernel), the partial last strip (90 = 6 x 14 + 6) is packed; odd K: all of A packed.
  for (int64_t k : {int64_t{76}, int64_t{75}}) {
    GemmCase g{90, 260, k, false, true, 2, 1.25f, 0.5f, true, true, Activation::kGeluTanh};
    g.a_dtype = g.b_dtype = DType::kBF16;
    cases.push_back(make_case(g, seed++));
  }
  // Every row count of a partial last strip (m % MR = 1..13 for the 14-row AVX-512 kernels; the
  // AVX2 and scalar targets see their own remainders): the kernels for the first R rows of a
  // strip, f32 and bf16, A in place (full strips) or packed (transposed A), with beta and bias.
  for (int64_t r = 1; r <= 13; ++r) {
    GemmCase g{28 + r, 40 + 3 * r, 17 + 2 * r, r % 3 == 0};
    if (r % 2 == 0) g.a_dtype = g.b_dtype = DType::kBF16;
    g.beta = r % 4 == 1 ? 0.5f : 0.0f;
    g.bias = r % 5 == 2;
    cases.push_back(make_case(g, seed++));
  }
  // Row strides that run_block's L1-set test sorts (in place when a strip's rows spread over the
  // L1 sets as evenly as a packed strip, else packed): rows 2 KiB apart with 2 KiB per row in the
  // K block (f32 K = 512, bf16 K = 1024 at the default blockings: in place), 4 KiB apart (f32
  // K = 1024: packed), and 2 KiB apart with K blocks of 512 and 511 bf16 (1 KiB rows: packed,
  // the odd block too).
  for (int v = 0; v < 4; ++v) {
    GemmCase g{45, 70, v == 0 ? int64_t{512} : v == 3 ? int64_t{1023} : int64_t{1024}};
    if (v % 2 == 1) g.a_dtype = g.b_dtype = DType::kBF16;
    if (v == 3) {
      g.pad = 1;
      g.blocking = {28, 600, 64};
    }
    g.beta = 1.0f;
    cases.push_back(make_case(g, seed++));
  }
  // Decode-like small M with K, N large enough to stream B in several chunks per thread.
  // (m = 5: f32 with the small-M kernel's L1 prefetch of its own B rows)
  for (int64_t m : {int64_t{1}, int64_t{4}, int64_t{5}, int64_t{8}}) {
    for (bool tb : {true, false}) {
      GemmCase g{m, 1000, 515, false, tb};
      g.b_dtype = m == 4 ? DType::kBF16 : DType::kF32;
      g.pad = m == 8 ? 4 : 0;
      cases.push_back(make_case(g, seed++));
    }
  }
  // Small-M kernels with B stored (n, k) at every M: group remainders (n % J != 0), k tails that
  // are not a whole 64-byte line (f32 16, bf16 32 elements), k shorter than one line, bf16 B
  // with bf16 or f32 A (rounded to bf16 for vdpbf16ps), transposed A, beta and bias.
  for (int64_t m = 1; m <= 8; ++m) {
    GemmCase g{m, 29 + 4 * m, m % 4 == 0 ? 7 : 45 + 16 * m, m % 3 == 0, true};
    g.b_dtype = m % 2 == 1 ? DType::kBF16 : DType::kF32;
    g.a_dtype = m == 3 || m == 7 ? DType::kBF16 : DType::kF32;
    g.beta = m == 5 ? 0.5f : 0.0f;
    g.bias = m == 6;
    g.pad = m == 2 ? 3 : 0;
    cases.push_back(make_case(g, seed++));
  }
  return cases;
}

}  // namespace kiln::testing
