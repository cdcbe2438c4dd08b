#!/usr/bin/env python3
"""PyTorch's side of `bench/compare_pytorch.sh`: the training step `kiln bench train` times, in
PyTorch eager fp32 (or, with --precision bf16, the forward under torch.autocast("cpu", bfloat16):
bf16 matmuls on fp32 master weights, as kiln's bf16 mode) — a GPT-2 block stack written the nanoGPT way (nn.Linear, LayerNorm, tanh
GELU, causal attention, tied LM head), cross-entropy, backward, torch.optim.AdamW (weight decay
0.1 on matrices, 0 on norms and biases, lr 3e-4), fresh random tokens each step; median of the
timed steps after warm-up. Prints one JSON object with the same keys as kiln's --json.

Run:  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python3 bench/train_torch.py --preset w1a --threads 1
"""
import argparse
import contextlib
import ctypes
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# BENCH.md W1a / W1b: (vocab, d, layers, heads, context, batch, seq)
WORKLOADS = {"w1a": (65, 384, 6, 6, 256, 8, 256), "w1b": (50257, 768, 12, 12, 1024, 4, 64)}


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: the fused kernel
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            y = torch.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, ctx):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def openblas_core():
    """The OpenBLAS kernel core this process picked, when torch loaded OpenBLAS."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
        for path in sorted(paths):
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        pass
    return "none"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(WORKLOADS), default="w1a")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--foreach", action="store_true", help="AdamW's multi-tensor (foreach) implementation")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: the forward (and so its backward) under torch.autocast(cpu, bfloat16)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    vocab, d, layers, heads, ctx, B, T = WORKLOADS[a.preset]
    model = GPT(vocab, d, layers, heads, ctx)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, foreach=a.foreach)
    # Training FLOPs per token as kiln counts them (ModelConfig::train_flops_per_token): 6 x
    # matmul parameters (non-embedding + the tied LM head) + 12·L·T·d attention.
    n_params = sum(p.numel() for p in model.parameters())
    matmul_params = n_params - ctx * d
    flops_per_token = 6.0 * matmul_params + 12.0 * layers * T * d

    def autocast():
        if a.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    gen = torch.Generator().manual_seed(7)
    total, fwd, bwd, upd = [], [], [], []
    loss = torch.zeros(())
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, vocab, (B, T), generator=gen)
        y = torch.randint(0, vocab, (B, T), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(x, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if step >= a.warmup:
            total.append(t3 - t0), fwd.append(t1 - t0), bwd.append(t2 - t1), upd.append(t3 - t2)
    med = statistics.median(total)
    tokens_per_s = B * T / med
    r = {"bench": "train", "impl": "torch", "version": torch.__version__, "workload": a.preset,
         "threads": torch.get_num_threads(), "batch": B, "seq_len": T, "params": n_params, "steps": a.steps,
         "step_s": med, "step_s_min": min(total), "step_s_max": max(total), "tokens_per_s": tokens_per_s,
         "gflops": tokens_per_s * flops_per_token / 1e9, "forward_s": statistics.median(fwd),
         "backward_s": statistics.median(bwd), "optimizer_s": statistics.median(upd), "loss": loss.item(),
         "openblas_core": openblas_core(), "foreach": a.foreach, "precision": a.precision}
    if a.json:
        print(json.dumps(r))
    else:
        print(f"torch {r['version']} train {a.preset}: batch {B} x seq {T}; {r['threads']} thread(s); {a.precision}; "
              f"OpenBLAS core {r['openblas_core']}")
        print(f"step {med:.3f} s median of {a.steps} (min {min(total):.3f}, max {max(total):.3f}) = forward "
              f"{r['forward_s']:.3f} + backward {r['backward_s']:.3f} + AdamW {r['optimizer_s']:.3f}")
        print(f"{tokens_per_s:.1f} tokens/s, {r['gflops']:.1f} GFLOP/s; last loss {r['loss']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
