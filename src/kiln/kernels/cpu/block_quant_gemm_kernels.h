// Internal interface between the block-quantized GEMM driver (block_quant_gemm.cpp: activation
// quantization, threading over channel tiles, the scalar table) and the per-target kernels
// (block_quant_gemm_avx2.cpp, block_quant_gemm_avx512.cpp).
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstring>

#include "kiln/kernels/block_quant_gemm.h"
#include "kiln/kernels/cpu/quant_tiles.h"

namespace kiln::cpu {

struct BlockQuantTargetKernels {
  // y rows [0, p.n), channel tiles [t0, t1) of p.w, epilogue included; the activations are
  // already quantized (a). vnni: use VNNI's vpdpbusd where the target has it. shape: the
  // register tiles (quant_tiles.h) on targets that compile variants; others ignore it.
  void (*tiles)(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t t0, int64_t t1, bool vnni,
                const QuantTiles& shape);
  // Same contract as ref::quantize_blocks_int8 on rows [0, n).
  void (*quantize)(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq, float* scales,
                   int32_t* sums);
  // The kernel's name for `kiln info` and benchmarks, given whether VNNI is used.
  const char* (*name)(bool vnni);
  // Whether this CPU runs the target's VNNI form.
  bool (*has_vnni)();
};

// Four activation codes as one 32-bit word (the broadcast operand of a quad's dot).
inline int32_t load_quad(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The tiles after a pass, fetched into L2 while the pass streams its own: the weight is one
// contiguous run of tiles, and a pass over `tiles` of them reads nb blocks of each side by side.
// At block step b this prefetches the b-th tiles·block_bytes share of the next `tiles` tiles
// (clipped to the weight's end), so the next pass starts on chip. Each tile is a short stream
// (W2-S Q4_0: 24 blocks, 6.9 KiB) that the hardware prefetchers pick up too late. Measured on
// W2-S decode (`kiln bench quant-decode --gguf`, Zen 4 VM, on/off in one binary, three rounds):
// Q4_0 327-383 -> 506-587 tok/s at 1 thread, 546-652 -> 644-737 at 2; Q8_0 +2-7% at 1 thread
// but -5-7% at 2 (its records are twice the bytes per dot), so the AVX-512 kernels use it for Q4
// only. Fetching the same tile's blocks 8 ahead instead gave +20% on Q4_0, 4 ahead +2%. The AVX2
// kernel, one tile per pass (a single stream), lost with it (`--simd avx2`, 1 thread: 478-497 ->
// 389-440 tok/s) and runs without.
class NextTiles {
 public:
  NextTiles(const BlockQuantWeight& w, int64_t t0, int64_t tiles, bool on)
      : next_(on ? w.data + (t0 + tiles) * w.tile_bytes() : nullptr),
        end_(w.data + w.bytes()),
        share_(tiles * w.block_bytes()) {}
  // always_inline: a function whose only effect is a prefetch counts as side-effect free to GCC
  // 12, which then deletes the call (the build had no prefetch left without it).
  [[gnu::always_inline]] void prefetch(int64_t b) const {
    if (next_ == nullptr) return;
    const uint8_t* p = next_ + b * share_;
    const int64_t bytes = std::min<int64_t>(share_, end_ - p);
    for (int64_t q = 0; q < bytes; q += 64) __builtin_prefetch(p + q, 0, 2);
  }

 private:
  const uint8_t* next_;
  const uint8_t* end_;
  int64_t share_;
};

const BlockQuantTargetKernels& block_quant_kernels_avx2();
const BlockQuantTargetKernels& block_quant_kernels_avx512();

}  // namespace kiln::cpu
