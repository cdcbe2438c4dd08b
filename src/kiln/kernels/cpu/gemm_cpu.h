// Knobs of the fast CPU GEMM that tools see: cache blocking (MC, KC, NC) per path, the tuning
// cache file that `kiln bench gemm --tune` writes and later runs read, and path names for
// `kiln info`. The kernels themselves are behind cpu::gemm (kiln/kernels/gemm.h).
#pragma once

#include <string>

#include "kiln/core/status.h"

namespace kiln::cpu {

// Cache blocking in elements of op(A)/op(B): an MC x KC block of A lives in L2, a KC x NC
// panel of B in L3 (shared by the threads), a KC x NR micro-panel of B in L1.
struct GemmBlocking {
  int mc = 0, kc = 0, nc = 0;
};

enum class GemmPath { kF32, kBF16 };

// The blocking the packed path uses now: set_gemm_blocking(), else the tuning file (read once),
// else the built-in defaults for this machine class.
GemmBlocking gemm_blocking(GemmPath path);
GemmBlocking default_gemm_blocking(GemmPath path);
void set_gemm_blocking(GemmPath path, GemmBlocking b);  // mc, kc, nc are clamped to sane ranges

// $KILN_TUNE_FILE, else $XDG_CACHE_HOME/kiln/gemm_tune.json, else ~/.cache/kiln/gemm_tune.json.
std::string gemm_tune_file();
// Writes the current blocking of both paths (and the CPU it was tuned on) to gemm_tune_file().
Status save_gemm_tuning();

// "avx512 14x32 micro-kernel", "avx512_bf16 dpbf16ps 14x32", ... for the active SIMD target.
std::string gemm_path_name(GemmPath path);
std::string gemm_small_m_name();

// Problems with m <= this take the GEMV-like path that streams B once without packing it.
inline constexpr int kGemmSmallM = 8;

}  // namespace kiln::cpu
