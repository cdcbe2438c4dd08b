#!/usr/bin/env python3
"""PyTorch's side of W5 (`kiln bench attention`): naive causal attention in PyTorch eager fp32 —
scores = Q Kᵀ / sqrt(d) materialized as (B, H, T, T), masked_fill, softmax, @ V — forward and
forward+backward time (median after warm-up) at batch 1, 12 heads, head dim 64. Torch 1.13 has
no fused scaled_dot_product_attention, so this is the peer BENCH.md names. extra_bytes is the
size of the (B, H, T, T) tensors the graph keeps or creates (scores, probabilities, and in
backward their gradients), computed, not measured. Prints JSON lines with kiln's keys.

Run (BENCH.md: OpenBLAS unpinned, threads set):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 \
      /usr/bin/python3 bench/attention_torch.py --threads 2
"""
import argparse
import json
import math
import statistics
import time

import torch

HEADS, HEAD_DIM = 12, 64


def attention(q, k, v, mask):
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seq", default="256,512,1024,2048,4096")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for T in [int(x) for x in args.seq.split(",")]:
        shape = (1, HEADS, T, HEAD_DIM)
        q, k, v = (torch.rand(shape) * 2 - 1 for _ in range(3))
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        tt = HEADS * T * T * 4
        with torch.no_grad():
            fwd = median_ms(lambda: attention(q, k, v, mask), args.reps)
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
        dout = torch.rand(shape)

        def both():
            attention(qg, kg, vg, mask).backward(dout)

        fb = median_ms(both, args.reps)
        # Forward: scores and masked scores, probabilities (3 T×T); backward adds their gradients (2 more).
        for name, ms, extra in (("fwd", fwd, 3 * tt), ("fwd+bwd", fb, 5 * tt)):
            print(json.dumps({"bench": "attention", "impl": "torch-naive", "T": T, "pass": name, "ms": round(ms, 4),
                              "extra_bytes": extra, "extra_bytes_measured": False, "threads": args.threads,
                              "heads": HEADS, "head_dim": HEAD_DIM, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
