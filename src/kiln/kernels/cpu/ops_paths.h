// `kiln info` lines for the non-GEMM kernel families (norms, softmax, activations, RoPE,
// embedding, cross-entropy, AdamW): which SIMD path each dispatches to on this machine.
#pragma once

#include <vector>

#include "kiln/kernels/registry.h"

namespace kiln::cpu {

void append_op_kernel_paths(std::vector<KernelPath>& out);

}  // namespace kiln::cpu
