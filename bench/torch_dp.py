#!/usr/bin/env python3
"""PyTorch's side of BENCH.md W7 (data parallel): the W1a / W1b GPT-2 training step under
torch.distributed on CPU (gloo), as DistributedDataParallel, FSDP2 (fully_shard per block, then
the root) or one process; median step time after warm-up. Rank 0 prints one result line.

Run:  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 bench/torch_dp.py --layout ddp --workload W1a
      python3 bench/torch_dp.py --layout single --workload W1b --print-params
"""
import argparse
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# BENCH.md W1a / W1b, positions as kiln's presets (w1a, gpt2-124m): (vocab, d, layers, heads, ctx, batch, seq)
WORKLOADS = {"W1a": (65, 384, 6, 6, 256, 8, 256), "W1b": (50257, 768, 12, 12, 1024, 4, 64)}


class Block(nn.Module):
    """Pre-LayerNorm GPT-2 block: fused QKV, causal SDPA, tanh-GELU MLP of width 4d."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):  # x: (B, T, C)
        B, T, C = x.shape
        qkv = self.c_attn(self.ln_1(x))  # (B, T, 3C)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in qkv.split(C, dim=2))  # (B, H, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))  # (B, T, C)


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, ctx):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):  # idx, targets: (B, T)
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T  # (B, T, V), LM head tied to wte
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def fully_shard_fn():
    """FSDP2's fully_shard: public since torch 2.6, under _composable before."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def fail(rank, msg):
    if rank == 0:
        print(f"error: {msg}", flush=True)
    sys.exit(3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=["ddp", "fsdp", "single"], default="ddp")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="W1a")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--per-rank-batch", type=int, default=0, help="sequences per rank (default: global batch / P)")
    ap.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP gradient bucket size")
    ap.add_argument("--print-params", action="store_true", help="print the parameter count and exit")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    vocab, d, layers, heads, ctx, global_batch, T = WORKLOADS[a.workload]
    torch.manual_seed(1)  # the same initial weights on every rank
    model = GPT(vocab, d, layers, heads, ctx)
    n_params = sum(p.numel() for p in model.parameters())  # wte counted once (tied)
    if a.print_params:
        print(f"torch params workload={a.workload} params={n_params} ({n_params / 1e6:.2f}M)")
        return 0

    world = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = a.layout != "single"
    if not distributed and world > 1:
        print("error: --layout single runs in one process; launch it without torchrun or with --nproc-per-node 1")
        return 2
    rank = 0
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    if a.per_rank_batch > 0:
        B = a.per_rank_batch
    elif global_batch % world == 0:
        B = global_batch // world
    else:
        fail(rank, f"global batch {global_batch} of {a.workload} does not split over P={world}; pass --per-rank-batch")

    if a.layout == "ddp":
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
    elif a.layout == "fsdp":
        try:
            from torch.distributed.device_mesh import init_device_mesh
            fully_shard = fully_shard_fn()
            mesh = init_device_mesh("cpu", (world,))
            for block in model.h:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        except Exception as e:  # an old torch without FSDP2, or gloo refusing it
            fail(rank, f"{type(e).__name__}: {e}")

    # Weight decay on matrices only (kiln's trainer: norms and biases get none).
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95))

    gen = torch.Generator().manual_seed(7 + rank)  # each rank its own fixed random tokens
    times = []
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, vocab, (B, T), generator=gen)  # (B, T)
        y = torch.randint(0, vocab, (B, T), generator=gen)  # (B, T)
        if distributed:
            dist.barrier()
        t0 = time.perf_counter()
        try:
            opt.zero_grad(set_to_none=True)
            loss = model(x, y)
            loss.backward()
            opt.step()
        except RuntimeError as e:  # FSDP2's collectives can be refused on gloo only when they first run
            if a.layout != "fsdp":
                raise
            fail(rank, f"{type(e).__name__}: {e}")
        t1 = time.perf_counter()
        if step >= a.warmup:
            times.append(t1 - t0)

    if distributed:
        dist.barrier()
    if rank == 0:
        med = statistics.median(times)
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
        print(f"torch layout={a.layout} workload={a.workload} P={world} threads={torch.get_num_threads()} "
              f"step_ms={med * 1e3:.1f} tokens_per_s={B * world * T / med:.1f} peak_rss_mb={peak_rss_mb:.1f}",
              flush=True)
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
