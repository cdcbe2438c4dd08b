// Every CUDA kernel's launch for a ProblemShape (cuda_catalog.h), from the same host functions
// the .cu launchers call (kernels/cuda/launch.h), so the numbers match what runs. Plain C++:
// compiled with or without the CUDA backend. built(), archs() and ptxas_log() live in the file
// generated from the CUDA build's ptxas log, or in cuda_build_nocuda.cpp without it.
#include "kiln/kernels/cuda_catalog.h"

#include "kiln/kernels/cuda/launch.h"

namespace kiln::cuda {
namespace {
KernelLaunch launch(std::string kernel, std::string family, std::string variant,
                    const LaunchConfig& c) {
  return {std::move(kernel), std::move(family), std::move(variant),
          c.blocks(),        c.threads,         c.smem_bytes};
}
}  // namespace

std::vector<KernelLaunch> kernel_launches(const ProblemShape& s) {
  std::vector<KernelLaunch> out;
  for (GemmKernel k : kGemmLadder)
    out.push_back(launch(gemm_kernel_symbol(k), "gemm", std::string(gemm_kernel_info(k).variant),
                         gemm_launch(k, s.m, s.n)));
  const LaunchConfig rows = row_launch(s.rows, s.cols);
  out.push_back(launch("kiln::cuda::layernorm_forward_kernel", "norm", "one block per row", rows));
  out.push_back(launch("kiln::cuda::rmsnorm_forward_kernel", "norm", "one block per row", rows));
  out.push_back(launch("kiln::cuda::softmax_forward_kernel", "softmax", "one block per row", rows));
  out.push_back(launch("kiln::cuda::cross_entropy_forward_kernel", "cross_entropy",
                       "one block per row, fused logsumexp", rows));
  out.push_back(
      launch("kiln::cuda::embedding_forward_kernel", "embedding", "one block per token", rows));
  const int64_t n = s.rows * s.cols;
  out.push_back(launch("kiln::cuda::gelu_forward_kernel", "activation", "elementwise",
                       elementwise_launch(n)));
  out.push_back(launch("kiln::cuda::silu_forward_kernel", "activation", "elementwise",
                       elementwise_launch(n)));
  out.push_back(launch("kiln::cuda::swiglu_forward_kernel", "activation", "elementwise",
                       elementwise_launch(n)));
  out.push_back(
      launch("kiln::cuda::adamw_step_kernel", "adamw", "elementwise", elementwise_launch(n)));
  // RoPE: one thread per rotated pair of q laid out (batch, seq, heads, head_dim).
  const int64_t pairs = s.batch * s.seq * s.heads * (s.head_dim / 2);
  out.push_back(launch("kiln::cuda::rope_forward_kernel", "rope", "one thread per pair",
                       elementwise_launch(pairs)));
  out.push_back(launch("kiln::cuda::attention_forward_kernel", "attention",
                       "flash forward, 8 query rows per block, 32-key tiles in shared memory",
                       attention_launch(s.batch, s.heads, s.seq, s.head_dim)));
  return out;
}

}  // namespace kiln::cuda
