// Pre-packed weights for inference GEMMs: a Linear weight W (out, in) is packed once into the
// strips the f32 micro-kernel of cpu::gemm consumes, and gemm_prepacked() runs C = epilogue(A Wᵀ)
// without re-packing W on every call (cpu::gemm packs B per call once m > kGemmSmallM).
#pragma once

#include <cstdint>
#include <memory>

#include "kiln/core/cpu_features.h"
#include "kiln/core/status.h"
#include "kiln/kernels/gemm.h"

namespace kiln {

// W (n, k) = (out, in) packed as ceil(n / nr) strips of (k, nr) f32 (the last strip zero-padded),
// for the SIMD target active when it was packed (nr depends on it). Move-only; owns its buffer.
class PackedMatrix {
 public:
  PackedMatrix() = default;
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int nr() const { return nr_; }
  SimdTarget target() const { return target_; }
  const float* data() const { return data_.get(); }  // (ceil(n/nr), k, nr)
  int64_t packed_bytes() const { return 4 * num_strips() * nr_ * k_; }
  int64_t num_strips() const { return nr_ == 0 ? 0 : (n_ + nr_ - 1) / nr_; }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  friend PackedMatrix pack_weight(const float* w, int64_t out, int64_t in, int64_t ldw);
  int64_t n_ = 0, k_ = 0;
  int nr_ = 0;
  SimdTarget target_ = SimdTarget::kScalar;
  std::unique_ptr<float, Free> data_;
};

// Packs w (out, in), rows ldw apart (0: in), for the active SIMD target; threads over strips.
// Buffers of 2 MiB or more are 2 MiB aligned and advised onto transparent huge pages.
PackedMatrix pack_weight(const float* w, int64_t out, int64_t in, int64_t ldw = 0);

// Op-level validation: p as for cpu::gemm with B = the packed matrix (p.b, p.ldb, p.b_dtype and
// p.trans_b are ignored); p.n and p.k must match it. Names the op and the shapes.
Status check_gemm_prepacked(const GemmParams& p, const PackedMatrix& b);

// C (m, n) = act(alpha·op(A)·Wᵀ + beta·C + bias) + residual with W the packed (n, k) weight.
// A is f32 or bf16 (either layout), packed per call; W is not. Same epilogue as cpu::gemm.
// Assumes valid params (KILN_CHECK only).
void gemm_prepacked(const GemmParams& p, const PackedMatrix& b);

// FLOPs as gemm_flops; bytes: A, packed W, C (read when beta != 0), bias, residual.
double gemm_prepacked_bytes(const GemmParams& p, const PackedMatrix& b);

}  // namespace kiln
