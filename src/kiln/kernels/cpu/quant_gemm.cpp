// The fast quantized GEMMs (quant_gemm.h): path choice (register-tiled decode kernel for a few
// rows, dequantized 64-channel panels + the f32 GEMM for many), threading over output channels,
// and the scalar target's table. The SIMD kernels are in quant_gemm_avx2.cpp / _avx512.cpp.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/fp8.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/parallel.h"
#include "kiln/kernels/cpu/quant_gemm_simd.h"
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/gemm.h"

namespace kiln::cpu {
namespace {

// ---- the scalar target: the shared templates over a 1-lane "vector" -------------------------
struct V1 {
  using T = float;
  static constexpr int kLanes = 1;
  static constexpr float kE4M3Factor = 1.0f;
  static constexpr bool kPairs = false;      // one code per step, natural order
  static constexpr float kInt4Bias = 0.0f;   // int4 codes decoded signed
  static T zero() { return 0.0f; }
  static T set1(float x) { return x; }
  static T loadu(const float* p) { return *p; }
  static void storeu(float* p, T x) { *p = x; }
  static T fmadd(T a, T b, T c) { return a * b + c; }
  static T mul(T a, T b) { return a * b; }
  static float reduce_add(T a) { return a; }
  template <QuantFormat F>
  static T decode(const uint8_t* row, int64_t k) {
    if constexpr (F == QuantFormat::kInt8) {
      return static_cast<float>(static_cast<int8_t>(row[k]));
    } else if constexpr (F == QuantFormat::kInt4) {
      const uint8_t b = row[k / 2];
      const int nib = (k % 2 == 0) ? (b & 0x0f) : (b >> 4);
      return static_cast<float>(nib >= 8 ? nib - 16 : nib);
    } else if constexpr (F == QuantFormat::kF16) {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, sizeof(h));
      return f16_to_f32(h);
    } else if constexpr (F == QuantFormat::kFp8E4M3) {
      return Fp8E4M3::decode(row[k]);
    } else {
      return Fp8E5M2::decode(row[k]);
    }
  }
};

void w8a8_rows_scalar(const W8A8Params& p, int64_t j0, int64_t j1) {
  const QuantWeight& w = *p.w;
  const auto* wq = reinterpret_cast<const int8_t*>(w.data);
  for (int64_t j = j0; j < j1; ++j) {
    const float sw = w.per_tensor_scale ? w.scales[0] : w.scales[j];
    for (int64_t i = 0; i < p.n; ++i) {
      const int8_t* a = p.a + i * p.lda;
      int32_t acc = 0;
      for (int64_t k = 0; k < w.in; ++k) acc += static_cast<int32_t>(a[k]) * wq[j * w.in + k];
      float v = (p.a_scales[i] * sw) * static_cast<float>(acc);
      if (p.bias) v += p.bias[j];
      if (p.residual) v += p.residual[i * p.ldr + j];
      p.y[i * p.ldy + j] = v;
    }
  }
}

const char* w8a8_name_scalar() { return "scalar int32 dot"; }

QuantTargetKernels make_scalar_kernels() {
  QuantTargetKernels k;
  k.name = "scalar 4x4 decode tile";
  k.lanes = 1;
  k.wo_rows = &quant_detail::wo_rows<V1, quant_detail::FixedShapes<4, 4, 4>>;
  k.dequant_rows = &quant_detail::dequant_rows<V1>;
  k.w8a8_rows = &w8a8_rows_scalar;
  k.w8a8_name = &w8a8_name_scalar;
  k.quantize_rows = &ref::quantize_rows_int8;
  return k;
}

const QuantTargetKernels& target_kernels() {
  using KernelsFn = const QuantTargetKernels& (*)();
  return Dispatch<KernelsFn>{&quant_kernels_scalar, &quant_kernels_avx2, &quant_kernels_avx512}.pick()();
}

std::atomic<bool> g_vnni_allowed{true};

// Rows from which the panel path (dequantize 64 channels, then the packed f32 GEMM) beats the
// decode tile: the tile spends ~1 decode per C FMAs and re-reads x per channel block, the
// packed GEMM runs near FMA peak once the one-off dequantization is amortized over the rows.
// On the 2-core dev machine (`kiln bench quant --rows 4,8`), the panel path at 4-8 rows ran at
// 0.6-0.7x f32 against the tile's 0.9-1.2x, so it starts at 16 rows (not swept further).
constexpr int64_t kPanelMinRows = 16;
// Channels per panel: 64 x in f32 (256 KiB at in = 1024, 1.4 MiB at 5632) per thread.
constexpr int64_t kPanelChannels = 64;
// Channel units handed to threads by the decode path: at least 8, and a multiple of the tile
// width in use (2, 4, 8 or 16: quant_tiles.h), so that no tile is split between two tasks.
constexpr int64_t kChannelUnit = 8;
int64_t channel_unit(const QuantTiles& q, int64_t n) {
  return std::max<int64_t>(kChannelUnit, n == 1 ? q.wo_gemv : q.wo_rows);
}

std::vector<float>& panel_buffer() {
  thread_local std::vector<float> b;
  return b;
}

void quant_gemm_panels(const QuantGemmParams& p, const QuantTargetKernels& kernels) {
  const QuantWeight& w = *p.w;
  const int64_t num_panels = (w.out + kPanelChannels - 1) / kPanelChannels;
  parallel_for(num_panels, 1, [&](int64_t b, int64_t e) {
    std::vector<float>& buf = panel_buffer();
    if (buf.size() < static_cast<size_t>(kPanelChannels * w.in)) buf.resize(static_cast<size_t>(kPanelChannels * w.in));
    for (int64_t t = b; t < e; ++t) {
      const int64_t j0 = t * kPanelChannels, j1 = std::min(w.out, j0 + kPanelChannels);
      kernels.dequant_rows(w, j0, j1, buf.data());  // (j1 - j0, in)
      GemmParams g;
      g.m = p.n;
      g.n = j1 - j0;
      g.k = w.in;
      g.a = p.x;
      g.lda = p.ldx;
      g.b = buf.data();
      g.ldb = w.in;
      g.trans_b = true;
      g.c = p.y + j0;
      g.ldc = p.ldy;
      g.bias = p.bias ? p.bias + j0 : nullptr;
      g.residual = p.residual ? p.residual + j0 : nullptr;
      g.ldr = p.ldr;
      gemm(g);  // inside a pool task: runs on this thread
    }
  });
}

}  // namespace

const QuantTargetKernels& quant_kernels_scalar() {
  static const QuantTargetKernels k = make_scalar_kernels();
  return k;
}

void set_w8a8_vnni_allowed(bool allowed) { g_vnni_allowed = allowed; }
bool w8a8_vnni_allowed() { return g_vnni_allowed; }

void quant_gemm(const QuantGemmParams& p) {
  trace::Scope kiln_trace_(trace::Category::kKernel, "quant_gemm", [&](trace::Event& e) { const OpCost c = quant_gemm_cost(p.n, p.w->out, p.w->in, static_cast<double>(quant_weight_bytes(*p.w))); e.flops = c.flops; e.bytes = c.bytes; e.set_dims({p.n, p.w->out, p.w->in}); e.dtype = quant_format_name(p.w->format).data(); });
  if (p.n == 0) return;
  maybe_autotune_first_use_quant(p.w->out, p.w->in);  // before this thread's buffers are taken
  const QuantWeight& w = *p.w;
  const int64_t ng = w.num_groups(), gsize = w.in / ng;
  const QuantTargetKernels& best = target_kernels();
  const QuantTargetKernels& kernels = gsize % best.lanes == 0 ? best : quant_kernels_scalar();
  if (p.n >= kPanelMinRows) {
    quant_gemm_panels(p, kernels);
    return;
  }
  std::vector<float> xsums;  // (n, ng): Σ x over each group, for zero-points and the int4 bias
  if (w.zeros || w.format == QuantFormat::kInt4) {
    xsums.assign(static_cast<size_t>(p.n * ng), 0.0f);
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t g = 0; g < ng; ++g) {
        float s = 0.0f;
        for (int64_t k = g * gsize; k < (g + 1) * gsize; ++k) s += p.x[i * p.ldx + k];
        xsums[i * ng + g] = s;
      }
  }
  const QuantTiles shape = quant_tiles();
  const int64_t unit = channel_unit(shape, p.n);
  const int64_t units = (w.out + unit - 1) / unit;
  parallel_for(units, grain_for(unit * w.in * p.n), [&](int64_t b, int64_t e) {
    kernels.wo_rows(p, xsums.empty() ? nullptr : xsums.data(), b * unit, std::min(w.out, e * unit), shape);
  });
}

void w8a8_gemm(const W8A8Params& p) {
  trace::Scope kiln_trace_(trace::Category::kKernel, "w8a8_gemm", [&](trace::Event& e) { const OpCost c = w8a8_cost(p.n, p.w->out, p.w->in); e.flops = c.flops; e.bytes = c.bytes; e.set_dims({p.n, p.w->out, p.w->in}); e.dtype = "int8"; });
  if (p.n == 0) return;
  const QuantTargetKernels& kernels = target_kernels();
  const int64_t out = p.w->out;
  const int64_t units = (out + kChannelUnit - 1) / kChannelUnit;
  parallel_for(units, grain_for(kChannelUnit * p.w->in * p.n / 4), [&](int64_t b, int64_t e) {
    kernels.w8a8_rows(p, b * kChannelUnit, std::min(out, e * kChannelUnit));
  });
}

void quantize_rows_int8(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq,
                        float* scales) {
  const QuantTargetKernels& kernels = target_kernels();
  parallel_for(n, grain_for(in), [&](int64_t b, int64_t e) {
    kernels.quantize_rows(x + b * ldx, e - b, in, ldx, q + b * ldq, ldq, scales + b);
  });
}

std::string quant_gemm_path_name() {
  return fmt::format("{} (n < {}); dequantized {}-channel panels + f32 GEMM (n >= {})", target_kernels().name,
                     kPanelMinRows, kPanelChannels, kPanelMinRows);
}

std::string w8a8_path_name() { return target_kernels().w8a8_name(); }

}  // namespace kiln::cpu
