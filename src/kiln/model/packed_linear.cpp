// PackedLinear: Linear forward through gemm_prepacked on a weight packed once (see the header).
#include "kiln/model/packed_linear.h"

#include <vector>

#include "kiln/core/dtype.h"

namespace kiln {

PackedLinear::PackedLinear(const Linear& l, DType weight_dtype) : weight_dtype_(weight_dtype) {
  KILN_CHECK_MSG(weight_dtype == DType::kF32 || weight_dtype == DType::kF16,
                 "PackedLinear {}: weights packed as {} (f32 or f16)", l.name, dtype_name(weight_dtype));
  sync(l);
}

void PackedLinear::sync(const Linear& l) {
  if (weight_dtype_ == DType::kF32) {
    packed_ = pack_weight(l.w, l.out, l.in);
    return;
  }
  std::vector<uint16_t> h(static_cast<size_t>(l.out * l.in));
  for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_f16(l.w[i]);
  packed_ = pack_weight_as(h.data(), DType::kF16, l.out, l.in);
}

void PackedLinear::forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const {
  GemmParams p;  // y (n, out) = x (n, in) Wᵀ + b (+ residual)
  p.m = n; p.n = l.out; p.k = l.in;
  p.a = x; p.lda = l.in;
  p.c = y; p.ldc = l.out;
  if (l.split_epilogue) {
    gemm_prepacked(p, packed_);
    return l.split_epilogue_adds(y, n, residual);
  }
  p.bias = l.b;
  p.residual = residual; p.ldr = l.out;
  gemm_prepacked(p, packed_);
}

int install_packed_weights(Transformer& model) {
  int installed = 0;
  for (Linear* l : model.linears()) {
    if (l->backend) continue;
    l->backend = std::make_shared<PackedLinear>(*l);
    ++installed;
  }
  return installed;
}

}  // namespace kiln
