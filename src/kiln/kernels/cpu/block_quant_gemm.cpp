// The fast block-quantized GEMM (block_quant_gemm.h): activations quantized per block once per
// call (rows spread over threads), then threads take runs of 16-channel tiles (a multiple of the
// register tile's width, quant_tiles.h); the scalar target's table. The SIMD kernels are in block_quant_gemm_avx2.cpp / _avx512.cpp.
#include <algorithm>
#include <atomic>
#include <vector>

#include <fmt/format.h>

#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/block_quant_gemm_kernels.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/parallel.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::cpu {
namespace {

// ---- the scalar target: the packed layout read byte by byte -----------------------------------
void tiles_scalar(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t t0, int64_t t1, bool,
                  const QuantTiles&) {
  const BlockQuantWeight& w = *p.w;
  const int64_t nb = w.blocks();
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t i = 0; i < p.n; ++i) {
      float acc[kQuantTile] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* rec = w.data + t * w.tile_bytes() + b * w.block_bytes();
        const int8_t* qa = a.q + i * a.ldq + b * kQuantBlock;
        const float da = a.scales[i * nb + b];
        for (int64_t c = 0; c < kQuantTile; ++c) {
          // Unsigned codes and the offset through the block sum, as the VNNI kernels do.
          int32_t dot = -w.offset() * a.sums[i * nb + b];
          for (int64_t kk = 0; kk < kQuantBlock; ++kk) {
            const int64_t quad = kk / 4, r = kk % 4;
            int u;
            if (w.format == BlockQuantFormat::kQ8) {
              u = rec[quad * 64 + 4 * c + r];
            } else {
              const uint8_t byte = rec[(quad / 2) * 64 + 4 * c + r];
              u = quad % 2 == 0 ? (byte & 0x0f) : (byte >> 4);
            }
            dot += u * qa[kk];
          }
          const float dw = block_quant_scale(w, t * kQuantTile + c, b);
          acc[c] += static_cast<float>(dot) * (dw * da);
        }
      }
      for (int64_t c = 0; c < kQuantTile && t * kQuantTile + c < w.out; ++c) {
        const int64_t j = t * kQuantTile + c;
        float v = acc[c];
        if (p.bias) v += p.bias[j];
        if (p.residual) v += p.residual[i * p.ldr + j];
        p.y[i * p.ldy + j] = v;
      }
    }
  }
}

const char* name_scalar(bool) { return "scalar int32 block dots"; }
bool no_vnni() { return false; }

const BlockQuantTargetKernels& block_quant_kernels_scalar() {
  static const BlockQuantTargetKernels k{&tiles_scalar, &ref::quantize_blocks_int8, &name_scalar, &no_vnni};
  return k;
}

const BlockQuantTargetKernels& target_kernels() {
  using KernelsFn = const BlockQuantTargetKernels& (*)();
  return Dispatch<KernelsFn>{&block_quant_kernels_scalar, &block_quant_kernels_avx2, &block_quant_kernels_avx512}
      .pick()();
}

std::atomic<bool> g_vnni_allowed{true};
bool use_vnni(const BlockQuantTargetKernels& k) { return g_vnni_allowed && k.has_vnni(); }

// Tiles per thread task: at least four (a pool task's share of a W2-S decode is then 8 KiB+ of
// weights), and a whole register tile's width so that no pass is split between two tasks.
constexpr int64_t kMinTilesPerUnit = 4;
int64_t tiles_per_unit(const QuantTiles& q, int64_t n) {
  const int64_t width = n == 1 ? q.bq_decode : (n >= kBqPrefillMinRows ? q.bq_prefill : q.bq_batch).tiles;
  return std::max(kMinTilesPerUnit, width);  // every width is 1, 2, 4 or 8
}

struct ActBuffers {
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<int32_t> sums;
};
ActBuffers& act_buffers() {
  thread_local ActBuffers b;
  return b;
}

}  // namespace

void set_block_quant_vnni_allowed(bool allowed) { g_vnni_allowed = allowed; }

void quantize_blocks_int8(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq, float* scales,
                          int32_t* sums) {
  const BlockQuantTargetKernels& k = target_kernels();
  const int64_t nb = in / kQuantBlock;
  parallel_for(n, grain_for(in), [&](int64_t b, int64_t e) {
    k.quantize(x + b * ldx, e - b, in, ldx, q + b * ldq, ldq, scales + b * nb, sums + b * nb);
  });
}

void block_quant_gemm(const BlockQuantGemmParams& p) {
  trace::Scope kiln_trace_(trace::Category::kKernel, "block_quant_gemm", [&](trace::Event& e) { const OpCost c = block_quant_gemm_cost(*p.w, p.n); e.flops = c.flops; e.bytes = c.bytes; e.set_dims({p.n, p.w->out, p.w->in}); e.dtype = block_quant_format_name(p.w->format).data(); });
  if (p.n == 0) return;
  maybe_autotune_first_use_quant(p.w->out, p.w->in);  // before this thread's buffers are taken
  const BlockQuantWeight& w = *p.w;
  const int64_t nb = w.blocks();
  ActBuffers& buf = act_buffers();
  buf.q.resize(static_cast<size_t>(p.n * w.in));
  buf.scales.resize(static_cast<size_t>(p.n * nb));
  buf.sums.resize(buf.scales.size());
  quantize_blocks_int8(p.x, p.n, w.in, p.ldx, buf.q.data(), w.in, buf.scales.data(), buf.sums.data());
  BlockQuantActs a;
  a.n = p.n;
  a.in = w.in;
  a.q = buf.q.data();
  a.ldq = w.in;
  a.scales = buf.scales.data();
  a.sums = buf.sums.data();
  const BlockQuantTargetKernels& k = target_kernels();
  const bool vnni = use_vnni(k);
  const QuantTiles shape = quant_tiles();
  const int64_t per_unit = tiles_per_unit(shape, p.n);
  const int64_t tiles = w.tiles(), units = (tiles + per_unit - 1) / per_unit;
  parallel_for(units, grain_for(per_unit * kQuantTile * w.in * p.n / 4), [&](int64_t b, int64_t e) {
    k.tiles(p, a, b * per_unit, std::min(tiles, e * per_unit), vnni, shape);
  });
}

std::string block_quant_path_name() {
  const BlockQuantTargetKernels& k = target_kernels();
  return k.name(use_vnni(k));
}

}  // namespace kiln::cpu
