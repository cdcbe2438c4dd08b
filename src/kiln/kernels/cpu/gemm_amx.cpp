// The AMX bf16 packed path (gemm_amx.h) in baseline code: whether this process may use the tiles,
// the packing of A into the tiles' row layout, and the micro-kernel around the tile code
// (gemm_tile_amx.cpp) with the shared epilogue (the AVX-512 target's, the only one holding it).
#include "kiln/kernels/cpu/gemm_amx.h"

#include <algorithm>
#include <cstring>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "kiln/core/cpu_features.h"
#include "kiln/kernels/cpu/gemm_simd.h"

namespace kiln::cpu {
namespace {

// op(A)'s packed strip of kAmxMr rows over `steps` pairs of k: chunk after chunk of 16 pairs,
// within a chunk row after row (a tile row of 64 bytes), the last chunk dense at its w pairs.
// Rows past `rows` are zeros. f32 A is rounded to bf16 here (as the vdpbf16ps path does).
template <class T>
void pack_a_amx_impl(const GemmParams& p, int64_t i0, int64_t rows, int64_t k0, int64_t kc, uint32_t* dst) {
  using gemm_detail::to_bf16;
  const T* a = static_cast<const T*>(p.a);
  const int64_t steps = (kc + 1) / 2;
  auto elem = [&](int64_t row, int64_t l) -> uint32_t {  // op(A)(row, k0 + l) as bf16, 0 past kc
    if (l >= kc) return 0;
    return p.trans_a ? to_bf16(a[(k0 + l) * p.lda + row]) : to_bf16(a[row * p.lda + k0 + l]);
  };
  for (int64_t s = 0; s < rows; s += kAmxMr, dst += kAmxMr * steps) {
    const int64_t mr = std::min<int64_t>(kAmxMr, rows - s);
    for (int64_t c0 = 0; c0 < steps; c0 += kAmxStepsPerTile) {
      const int64_t w = std::min<int64_t>(kAmxStepsPerTile, steps - c0);
      uint32_t* chunk = dst + c0 * kAmxMr;
      if (p.trans_a && mr == kAmxMr) {
        // Stored (k, m), as the weight gradient's dyᵀ: two stored rows make a pair for 32
        // consecutive rows of the strip at once (a loop the compiler vectorizes), then the w x 32
        // block of pairs is transposed into the tile's row layout.
        uint32_t pairs[kAmxStepsPerTile][kAmxMr];
        for (int64_t l2 = 0; l2 < w; ++l2) {
          const int64_t l = 2 * (c0 + l2);
          const T* r0 = a + (k0 + l) * p.lda + i0 + s;
          const T* r1 = r0 + p.lda;
          if (l + 1 < kc) {
            for (int r = 0; r < kAmxMr; ++r) pairs[l2][r] = to_bf16(r0[r]) | static_cast<uint32_t>(to_bf16(r1[r])) << 16;
          } else {
            for (int r = 0; r < kAmxMr; ++r) pairs[l2][r] = to_bf16(r0[r]);
          }
        }
        for (int r = 0; r < kAmxMr; ++r)
          for (int64_t l2 = 0; l2 < w; ++l2) chunk[r * w + l2] = pairs[l2][r];
        continue;
      }
      for (int64_t r = 0; r < kAmxMr; ++r) {
        uint32_t* out = chunk + r * w;
        if (r >= mr) {
          std::fill(out, out + w, 0u);
          continue;
        }
        const int64_t row = i0 + s + r;
        int64_t l2 = 0;
        if constexpr (sizeof(T) == 2) {
          if (!p.trans_a) {  // bf16 rows: whole pairs are already in place
            l2 = std::min(w, (kc - 2 * c0) / 2);
            std::memcpy(out, a + row * p.lda + k0 + 2 * c0, static_cast<size_t>(l2) * 4);
          }
        }
        for (; l2 < w; ++l2) {
          const int64_t l = 2 * (c0 + l2);
          out[l2] = elem(row, l) | elem(row, l + 1) << 16;
        }
      }
    }
  }
}

void pack_a_amx(const GemmParams& p, int64_t i0, int64_t rows, int64_t k0, int64_t kc, void* dst) {
  if (p.a_dtype == DType::kBF16)
    pack_a_amx_impl<uint16_t>(p, i0, rows, k0, kc, static_cast<uint32_t*>(dst));
  else
    pack_a_amx_impl<float>(p, i0, rows, k0, kc, static_cast<uint32_t*>(dst));
}

// A whole tile whose epilogue is C = acc or C += acc (every K block but the last of a plain
// GEMM) runs in C itself: the accumulator tiles start from C (or zero) and are stored back, with
// no pass over a scratch tile. Anything else (a partial tile, alpha, another beta, bias,
// activation, residual) goes through a scratch tile and the shared epilogue.
void run_tile(int64_t steps, const AmxA& a, const void* b_packed, float* c, int64_t ldc, int m, int n,
              const TileEpilogue& ep) {
  const auto* b = static_cast<const uint32_t*>(b_packed);
  if (m == kAmxMr && n == kAmxNr && ep.alpha == 1.0f && (ep.beta == 0.0f || ep.beta == 1.0f) &&
      ep.scales_only())
    return amx_bf16_tile_32x32(steps, a, b, c, ldc, ep.beta == 1.0f);
  alignas(64) float acc[kAmxMr * kAmxNr];
  amx_bf16_tile_32x32(steps, a, b, acc, kAmxNr, false);
  gemm_kernels_avx512().epilogue_rows(c, ldc, acc, kAmxNr, m, n, ep);
}

void micro_kernel_amx(int64_t steps, const void* a_packed, const void* b_packed, float* c, int64_t ldc, int m,
                      int n, const TileEpilogue& ep) {
  run_tile(steps, {static_cast<const char*>(a_packed), 64, 64 * kAmxMr, 4 * (steps % kAmxStepsPerTile)},
           b_packed, c, ldc, m, n, ep);
}

// A's 32 bf16 rows read in place: a tile row is 32 consecutive k of one row of A.
void micro_kernel_amx_direct(int64_t steps, const void* a_rows, int64_t lda, const void* b_packed, float* c,
                             int64_t ldc, int n, const TileEpilogue& ep) {
  run_tile(steps, {static_cast<const char*>(a_rows), 2 * lda, 64, 2 * lda}, b_packed, c, ldc, kAmxMr, n, ep);
}

}  // namespace

bool amx_bf16_usable() {
  static const bool usable = [] {
    const CpuFeatures& f = cpu_features();
    if (!f.amx_tile || !f.amx_bf16 || !f.avx512_bf16) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
    // Linux hands out the 8 KiB tile state only on request (since 5.16): without it the first
    // tile instruction dies with SIGILL.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
#else
    return false;
#endif
  }();
  return usable;
}

PackedPath amx_bf16_path() {
  PackedPath path;
  path.name = "amx_bf16 tdpbf16ps 32x32 (4 accumulator tiles, pairs-of-k packing)";
  path.mr = kAmxMr;
  path.nr = kAmxNr;
  path.k_per_step = 2;
  if (!amx_bf16_usable()) return path;
  path.pack_a = &pack_a_amx;
  path.kernel = &micro_kernel_amx;
  path.kernel_direct_a = &micro_kernel_amx_direct;
  path.direct_a_dtype = DType::kBF16;
  return path;
}

}  // namespace kiln::cpu
