// GEMM peers that kiln is measured beside: OpenBLAS (cblas_sgemm, cblas_sbgemm) and oneDNN
// (dnnl_sgemm for f32, the matmul primitive with bf16 or f16 inputs and f32 output).
// Row-major, plain layouts on both sides (the caller's weights are not pre-packed for anyone).
#pragma once

#include <memory>
#include <string>

#include "kiln/core/dtype.h"

namespace kiln::bench {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_b = false;      // B stored (n, k)
  DType dtype = DType::kF32;  // of A and B; C is f32
};

class PeerGemm {
 public:
  virtual ~PeerGemm() = default;
  virtual const char* name() const = 0;
  // C (m, n) = A (m, k) x op(B); a and b hold shape.dtype elements, contiguous.
  virtual void run(const void* a, const void* b, float* c) = 0;
};

// Null when the peer has no such path (OpenBLAS builds without cblas_sbgemm; oneDNN without an
// f16 matmul for this CPU).
std::unique_ptr<PeerGemm> make_openblas_gemm(const GemmShape& s);
std::unique_ptr<PeerGemm> make_onednn_gemm(const GemmShape& s);

// Threads for both peers: OpenBLAS's own pool and OpenMP (Debian's oneDNN 2.6 runs on OpenMP).
void set_peer_threads(int n);
std::string openblas_core_name();

// OpenBLAS reads OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE when it loads; when either is set, unset
// both and re-exec this process (argv from /proc/self/cmdline), so the peer runs at its own pick.
// When that pick is a generic core (OpenBLAS did not recognise the CPU: "Prescott" on Emerald
// Rapids), re-exec once more with OPENBLAS_CORETYPE set to the strongest core the CPU supports
// (Cooperlake, SkylakeX, Haswell/Zen). Returns when no (further) re-exec is needed or it failed.
void reexec_without_openblas_env();
// How the core was chosen, for the benchmark's header.
std::string openblas_core_note();

}  // namespace kiln::bench
