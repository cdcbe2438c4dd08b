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

# The single-process peer's model (bench/train_torch.py): the same GPT-2 blocks and workloads.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_torch import GPT, WORKLOADS as _WORKLOADS  # noqa: E402

WORKLOADS = {name[:2].upper() + name[2:]: shape for name, shape in _WORKLOADS.items()}  # W1a / W1b: (vocab, d, layers, heads, ctx, batch, seq)


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
