// `kiln info` lines for the non-GEMM kernel families: the SIMD target each one dispatches to
// on this machine (registry.cpp calls append_op_kernel_paths).
#include "kiln/kernels/cpu/ops_paths.h"

#include <fmt/format.h>

#include "kiln/kernels/cpu/ops_targets.h"

namespace kiln::cpu {
namespace {

template <class Fn>
std::string describe(const Dispatch<Fn>& d, const char* how) {
  const SimdTarget t = d.picked_target();
  int lanes = 1;
  for (const auto& info : kSimdTargets) {
    if (info.target == t) lanes = info.f32_lanes;
  }
  return fmt::format("{} ({} lanes), {}", simd_target_name(t), lanes, how);
}

}  // namespace

void append_op_kernel_paths(std::vector<KernelPath>& out) {
  out.push_back({"layernorm", describe(KILN_OPS_DISPATCH(layernorm_forward_rows), "rows/threads")});
  out.push_back({"rmsnorm", describe(KILN_OPS_DISPATCH(rmsnorm_forward_rows), "rows/threads")});
  out.push_back(
      {"softmax", describe(KILN_OPS_DISPATCH(softmax_forward_rows), "rows/threads, poly exp")});
  out.push_back(
      {"gelu/silu/swiglu", describe(KILN_OPS_DISPATCH(gelu_forward_n), "elementwise, poly exp")});
  out.push_back(
      {"rope", describe(KILN_OPS_DISPATCH(rope_rows), "rotate_half, (B*T) rows/threads")});
  out.push_back({"embedding",
                 describe(KILN_OPS_DISPATCH(embedding_backward_cols), "column-split scatter-add")});
  out.push_back({"cross-entropy",
                 describe(KILN_OPS_DISPATCH(cross_entropy_forward_rows), "fused, online max/sum")});
  out.push_back({"adamw", describe(KILN_OPS_DISPATCH(adamw_n), "fused step")});
  out.push_back({"elementwise", describe(KILN_OPS_DISPATCH(add_n), "add/scale/accumulate")});
}

}  // namespace kiln::cpu
