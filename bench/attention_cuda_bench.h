// `kiln bench attention --device cuda`: the CUDA FlashAttention forward and forward+backward
// (kernels/cuda/attention.cu, attention_backward.cu) at W5's shape (causal fp32, batch 1, 12
// heads of 64), each checked against kiln's CPU flash kernels on the same inputs (normalized MSE)
// before it is timed with CUDA events (median after a warm-up). bench/attention_torch.py
// --device cuda times PyTorch's SDPA on the same GPU beside it and prints the ratios. A build or
// machine without CUDA says so and returns 1.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::bench {

struct AttentionCudaBenchOptions {
  std::vector<int64_t> seq_lens = {1024, 2048, 4096};
  int reps = 5;
  bool json = false;  // one JSON object per line (the keys of `kiln bench attention --json`)
};

int run_attention_cuda_bench(const AttentionCudaBenchOptions& opt);

}  // namespace kiln::bench
