// The inference LinearBackend over pre-packed weights: each Linear's fp32 weight is packed once
// (kernels/gemm_prepacked.h) and the forward runs gemm_prepacked, so a decode step with 9..64
// rows no longer re-packs every weight. Packed as f32, or as IEEE halves (a GGUF F16 tensor,
// value for value: the f32 path's arithmetic on half the bytes streamed per decode step).
// Backward falls back to the fp32 path (inference only).
#pragma once

#include "kiln/kernels/gemm_prepacked.h"
#include "kiln/model/transformer.h"

namespace kiln {

class PackedLinear final : public LinearBackend {
 public:
  // weight_dtype: kF32, or kF16 (the master weight rounded to halves: exact where it holds
  // halves' values, as after loading an F16 GGUF tensor).
  explicit PackedLinear(const Linear& l, DType weight_dtype = DType::kF32);
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override;
  void sync(const Linear& l) override;  // re-packs the changed master weight
  bool captured() const override { return true; }  // one gemm_prepacked call (a graph node)
  const PackedMatrix& packed() const { return packed_; }

 private:
  DType weight_dtype_;
  PackedMatrix packed_;
};

// Installs a PackedLinear on every Linear of the model that has no backend yet (quantized or
// mixed-precision backends are left alone). Returns how many were installed. The packed copies
// cost as much memory as the fp32 weights they pack.
int install_packed_weights(Transformer& model);

}  // namespace kiln
