#!/usr/bin/env python3
"""PyTorch's side of W1-MoE (`kiln bench moe --only torch`): one MoE MLP layer in PyTorch eager
fp32, forward + backward, written as HF Mixtral's MixtralSparseMoeBlock computes it: router
logits, softmax, top-k, gates renormalized to sum 1, then a loop over the experts, each taking
its tokens with index_select, running its SwiGLU MLP w2(silu(w1 x) * w3 x), scaling by the gates
and adding back with index_add_ (dropless). Random weights (nn.Linear's init) and inputs, random
router: the routing is roughly balanced, as in kiln's side of the same run. Prints one JSON line
with the median ms per forward + backward and the tokens per expert (max / mean).

Run (BENCH.md: OpenBLAS unpinned, threads set):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 \\
      /work/V/bin/python bench/torch_moe.py --threads 2
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


class MoeLayer(torch.nn.Module):
    def __init__(self, d_model, d_ff, experts, top_k):
        super().__init__()
        self.top_k = top_k
        self.gate = torch.nn.Linear(d_model, experts, bias=False)
        self.w1 = torch.nn.ModuleList(torch.nn.Linear(d_model, d_ff, bias=False) for _ in range(experts))
        self.w3 = torch.nn.ModuleList(torch.nn.Linear(d_model, d_ff, bias=False) for _ in range(experts))
        self.w2 = torch.nn.ModuleList(torch.nn.Linear(d_ff, d_model, bias=False) for _ in range(experts))

    def forward(self, x):  # x (N, C)
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # (N, E)
        gates, choice = torch.topk(probs, self.top_k, dim=-1)  # (N, k)
        gates = gates / gates.sum(dim=-1, keepdim=True)
        y = torch.zeros_like(x)
        # (E, k, N): which tokens chose expert e as their j-th choice
        mask = F.one_hot(choice, num_classes=len(self.w1)).permute(2, 1, 0)
        for e in range(len(self.w1)):
            slot, token = torch.where(mask[e])
            if token.numel() == 0:
                continue
            xe = x.index_select(0, token)  # (m_e, C)
            he = self.w2[e](F.silu(self.w1[e](xe)) * self.w3[e](xe))
            y.index_add_(0, token, he * gates[token, slot, None])
        return x + y, torch.bincount(choice.flatten(), minlength=len(self.w1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layer = MoeLayer(args.d_model, args.ffn, args.experts, args.top_k)
    x = torch.randn(args.tokens, args.d_model, requires_grad=True)
    dy = torch.randn(args.tokens, args.d_model)
    counts = None

    def step():
        nonlocal counts
        layer.zero_grad(set_to_none=False)
        x.grad = None
        y, counts = layer(x)
        y.backward(dy)

    step()  # warm-up (allocations, oneDNN primitives)
    step()
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    c = counts.double()
    print(json.dumps({
        "peer": "torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
        "tokens": args.tokens, "d_model": args.d_model, "ffn": args.ffn, "experts": args.experts,
        "top_k": args.top_k, "fwd_bwd_ms": statistics.median(times) * 1e3,
        "fwd_bwd_ms_min": min(times) * 1e3, "load": float(c.max() / c.mean()),
    }))


if __name__ == "__main__":
    main()
