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

  // Backward passes.
  out.push_back(
      launch("kiln::cuda::layernorm_backward_kernel", "norm", "backward dinp, one block per row", rows));
  out.push_back(
      launch("kiln::cuda::rmsnorm_backward_kernel", "norm", "backward dinp, one block per row", rows));
  out.push_back(launch("kiln::cuda::norm_weight_backward_kernel", "norm",
                       "backward dweight/dbias, 32 columns x 8 row strides per block, no atomics",
                       column_launch(s.cols)));
  out.push_back(
      launch("kiln::cuda::softmax_backward_kernel", "softmax", "backward, one block per row", rows));
  out.push_back(launch("kiln::cuda::cross_entropy_backward_kernel", "cross_entropy",
                       "backward, one block per row, one-pass online max/sum", rows));
  out.push_back(launch("kiln::cuda::embedding_backward_kernel", "embedding",
                       "backward, one block per token, fp32 atomicAdd", rows));
  out.push_back(launch("kiln::cuda::gelu_backward_kernel", "activation", "backward, elementwise",
                       elementwise_launch(n)));
  out.push_back(launch("kiln::cuda::silu_backward_kernel", "activation", "backward, elementwise",
                       elementwise_launch(n)));
  out.push_back(launch("kiln::cuda::swiglu_backward_kernel", "activation", "backward, elementwise",
                       elementwise_launch(n)));
  out.push_back(launch("kiln::cuda::rope_backward_kernel", "rope", "backward, one thread per pair",
                       elementwise_launch(pairs)));
  out.push_back(launch("kiln::cuda::attention_backward_dkdv_kernel", "attention",
                       "flash backward dK/dV, 32 keys per block, GQA heads summed in the block",
                       attention_backward_dkdv_launch(s.batch, s.kv_heads, s.seq, s.head_dim)));
  out.push_back(launch("kiln::cuda::attention_backward_dq_kernel", "attention",
                       "flash backward dQ, 8 query rows per block",
                       attention_backward_dq_launch(s.batch, s.heads, s.seq, s.head_dim)));

  // Decode over the paged cache: one new token per sequence (batch sequences) against up to
  // seq cached keys in blocks of 16, chunks as decode_split picks them.
  constexpr int64_t kBlockSize = 16;
  const DecodeSplit split = decode_split(0, s.batch, s.heads, s.kv_heads, 1, kBlockSize,
                                         ceil_div(s.seq, kBlockSize));
  out.push_back(launch("kiln::cuda::attention_decode_split_kernel", "attention",
                       "split-KV decode over the paged cache, " +
                           std::to_string(split.num_splits) + " chunks of " +
                           std::to_string(split.chunk_keys) + " keys",
                       attention_decode_launch(s.batch, s.heads, s.kv_heads, 1, s.head_dim,
                                               split.num_splits)));
  out.push_back(launch("kiln::cuda::attention_decode_combine_kernel", "attention",
                       "split-KV merge, a warp per query row",
                       attention_decode_combine_launch(s.batch * s.heads)));
  out.push_back(launch("kiln::cuda::empty_kernel", "launch", "no work: the launch cost alone",
                       empty_kernel_launch()));
  return out;
}

}  // namespace kiln::cuda
