// Pre-packed weights for inference GEMMs: a Linear weight W (out, in) is packed once into the
// strips the micro-kernels of cpu::gemm consume, and gemm_prepacked() runs C = epilogue(A Wᵀ)
// without re-packing W on every call (cpu::gemm packs B per call once m > kGemmSmallM). Decode
// (m <= kGemmSmallM) runs small-M kernels over the same strips, W read once in memory order.
#pragma once

#include <cstdint>
#include <memory>

#include "kiln/core/cpu_features.h"
#include "kiln/core/dtype.h"
#include "kiln/core/status.h"
#include "kiln/kernels/gemm.h"

namespace kiln {

// W (n, k) = (out, in) packed as ceil(n / nr) strips (the last one zero-padded) for the SIMD
// target active when it was packed (nr depends on it): an f32 W as strips of (k, nr) f32; a
// bf16 W, where the CPU has AVX512_BF16, as strips of (ceil(k / 2), nr) pairs of bf16 of
// consecutive k (k_per_step() 2; cpu::gemm's bf16 path), else widened to f32 strips; an f16 W
// (IEEE halves, as GGUF F16 files hold them) as strips of (k, nr) halves, widened to f32 in the
// micro-kernels' registers — f32 arithmetic on half the bytes (decode streams W from DRAM).
// Move-only; owns its buffer.
class PackedMatrix {
 public:
  PackedMatrix() = default;
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int nr() const { return nr_; }
  SimdTarget target() const { return target_; }
  DType weight_dtype() const { return weight_dtype_; }  // what was packed: f32, bf16 or f16
  int k_per_step() const { return k_per_step_; }         // 1: f32 or f16 elements; 2: bf16 pairs
  int elem_bytes() const { return elem_bytes_; }         // 4, or 2 for f16
  int64_t steps() const { return (k_ + k_per_step_ - 1) / k_per_step_; }
  const void* data() const { return data_.get(); }  // (num_strips, steps, nr) elements
  int64_t packed_bytes() const { return elem_bytes_ * num_strips() * nr_ * steps(); }
  int64_t num_strips() const { return nr_ == 0 ? 0 : (n_ + nr_ - 1) / nr_; }

 private:
  struct Free {
    void operator()(uint32_t* p) const;
  };
  friend PackedMatrix pack_weight_as(const void* w, DType dtype, int64_t out, int64_t in, int64_t ldw);
  int64_t n_ = 0, k_ = 0;
  int nr_ = 0;
  int k_per_step_ = 1;
  int elem_bytes_ = 4;
  DType weight_dtype_ = DType::kF32;
  SimdTarget target_ = SimdTarget::kScalar;
  std::unique_ptr<uint32_t, Free> data_;
};

// Packs w (out, in), rows ldw apart (0: in), of dtype f32, bf16 or f16 (IEEE half bits;
// anything else: an error naming it, via KILN_CHECK), for the active SIMD target; threads over
// strips. Buffers of 2 MiB or more are 2 MiB aligned and advised onto transparent huge pages.
PackedMatrix pack_weight_as(const void* w, DType dtype, int64_t out, int64_t in, int64_t ldw = 0);
inline PackedMatrix pack_weight(const float* w, int64_t out, int64_t in, int64_t ldw = 0) {
  return pack_weight_as(w, DType::kF32, out, in, ldw);
}

// Op-level validation: p as for cpu::gemm with B = the packed matrix (p.b, p.ldb, p.b_dtype and
// p.trans_b are ignored); p.n and p.k must match it. Names the op and the shapes.
Status check_gemm_prepacked(const GemmParams& p, const PackedMatrix& b);

// C (m, n) = act(alpha·op(A)·Wᵀ + beta·C + bias) + residual with W the packed (n, k) weight.
// A is f32 or bf16 (either layout), packed per call; W is not. Same epilogue as cpu::gemm; with a
// bf16 W the products are those of cpu::gemm's bf16 path (A rounded to bf16 where W is in pairs);
// with an f16 W they are the f32 path's on the widened weight (the same result, bit for bit, as
// packing that f32 weight).
// Assumes valid params (KILN_CHECK only).
void gemm_prepacked(const GemmParams& p, const PackedMatrix& b);

// FLOPs as gemm_flops; bytes: A, packed W, C (read when beta != 0), bias, residual.
double gemm_prepacked_bytes(const GemmParams& p, const PackedMatrix& b);

}  // namespace kiln
