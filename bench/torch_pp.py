#!/usr/bin/env python3
"""PyTorch's side of BENCH.md W7 (pipeline parallel): the W1a / W1b GPT-2 training step cut into
P stages (embedding + the first blocks on stage 0, the last blocks + final norm + LM head on the
last), run by torch.distributed.pipelining (PipelineStage; ScheduleGPipe, Schedule1F1B, and for
zb-h1 ScheduleInterleavedZeroBubble with one stage a rank) over gloo on CPU, M micro-batches,
one thread a rank. What kiln's pipeline step also does is done here too: the tied embedding's
gradient summed between the first stage and the last stage's copy of it, the gradient norm over
the stages with clipping at 1.0, and AdamW. Mean step time after warm-up (the slowest rank's
time of each step); rank 0 prints one line per schedule:
  torch_pp schedule=gpipe workload=W1a P=2 M=4 layers=3,3 threads=1 step_ms=... step_ms_min=... step_ms_max=...

Run:  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 bench/torch_pp.py --workload W1a --schedule all
      (--layers 8,4 for W1b gives kiln's default split: `kiln bench pp` prints it)
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# The single-process peer's model (bench/train_torch.py): the same GPT-2 blocks and workloads.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_torch import GPT, WORKLOADS as _WORKLOADS  # noqa: E402

WORKLOADS = {name[:2].upper() + name[2:]: shape for name, shape in _WORKLOADS.items()}  # W1a / W1b
SCHEDULES = ["gpipe", "1f1b", "zb-h1"]


class FirstStage(nn.Module):
    """Token and position embeddings, then blocks [0, n)."""

    def __init__(self, gpt, n):
        super().__init__()
        self.wte, self.wpe, self.h = gpt.wte, gpt.wpe, nn.ModuleList(gpt.h[:n])

    def forward(self, idx):  # (B, T) -> (B, T, C)
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return x


class MiddleStage(nn.Module):
    def __init__(self, gpt, begin, end):
        super().__init__()
        self.h = nn.ModuleList(gpt.h[begin:end])

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        for block in self.h:
            x = block(x)
        return x


class LastStage(nn.Module):
    """Blocks [begin, L), the final norm and the LM head: its own copy of the tied embedding
    (kiln's last stage holds one too; their gradients are summed after backward)."""

    def __init__(self, gpt, begin):
        super().__init__()
        self.h, self.ln_f = nn.ModuleList(gpt.h[begin:]), gpt.ln_f
        self.head = nn.Parameter(gpt.wte.weight.detach().clone())  # (V, C)

    def forward(self, x):  # (B, T, C) -> logits (B, T, V)
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.head.T


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def make_schedule(name, stage, m):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleavedZeroBubble
    if name == "gpipe":
        return ScheduleGPipe(stage, n_microbatches=m, loss_fn=loss_fn)
    if name == "1f1b":
        return Schedule1F1B(stage, n_microbatches=m, loss_fn=loss_fn)
    return ScheduleInterleavedZeroBubble([stage], n_microbatches=m, loss_fn=loss_fn)


def run(name, a, rank, world, layers, tied_group):
    from torch.distributed.pipelining import PipelineStage
    vocab, d, n_layers, heads, ctx, B, T = WORKLOADS[a.workload]
    torch.manual_seed(1)  # the same initial weights on every rank; each keeps its stage
    gpt = GPT(vocab, d, n_layers, heads, ctx)
    begin = sum(layers[:rank])
    end = begin + layers[rank]
    if rank == 0:
        module = FirstStage(gpt, end)
    elif rank == world - 1:
        module = LastStage(gpt, begin)
    else:
        module = MiddleStage(gpt, begin, end)
    del gpt
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = make_schedule(name, stage, a.micro_batches)
    # Weight decay on matrices only (kiln's trainer: norms and biases get none).
    params = list(module.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95))
    tied = module.wte.weight if rank == 0 else module.head if rank == world - 1 else None
    gen = torch.Generator().manual_seed(7)  # the same tokens on every rank: the first reads x, the last y
    times = []
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, vocab, (B, T), generator=gen)  # (B, T)
        y = torch.randint(0, vocab, (B, T), generator=gen)  # (B, T)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            losses = []
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        if tied is not None:  # the first stage's embedding and the last's head: one parameter
            dist.all_reduce(tied.grad, group=tied_group)
        # The gradient norm over the stages (the tied table counted once, on stage 0), clip at 1.
        counted = [p for p in params if p.grad is not None and not (rank == world - 1 and p is tied)]
        sq = sum(float(p.grad.pow(2).sum()) for p in counted)
        sq_t = torch.tensor([sq], dtype=torch.float64)
        dist.all_reduce(sq_t)
        coef = 1.0 / max(1.0, math.sqrt(sq_t.item()))
        if coef < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        opt.step()
        t1 = time.perf_counter()
        if step >= a.warmup:
            times.append(t1 - t0)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # each step's slowest rank
    ms = [1e3 * t for t in slowest.tolist()]
    return sum(ms) / len(ms), min(ms), max(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="W1a")
    ap.add_argument("--schedule", choices=["all"] + SCHEDULES, default="all")
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--layers", default="", help="blocks per stage, e.g. 8,4 (default: as even as it goes)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    n_layers, B = WORKLOADS[a.workload][2], WORKLOADS[a.workload][5]
    if a.layers:
        layers = [int(v) for v in a.layers.split(",")]
    else:
        layers = [n_layers // world + (1 if r < n_layers % world else 0) for r in range(world)]
    if world < 2 or len(layers) != world or sum(layers) != n_layers or min(layers) < 1 or B % a.micro_batches:
        if rank == 0:
            print(f"error: need P >= 2 ranks (got {world}), --layers of P entries >= 1 summing to {n_layers} "
                  f"(got {layers}), and batch {B} divisible by --micro-batches {a.micro_batches}", flush=True)
        dist.destroy_process_group()
        return 2
    tied_group = dist.new_group([0, world - 1])
    rc = 0
    for name in SCHEDULES if a.schedule == "all" else [a.schedule]:
        try:
            mean, lo, hi = run(name, a, rank, world, layers, tied_group)
        except Exception as e:  # a schedule this torch cannot run here: say so, try the next
            if rank == 0:
                print(f"torch_pp schedule={name} workload={a.workload} error: {type(e).__name__}: {e}", flush=True)
            rc = 1
            continue
        if rank == 0:
            print(f"torch_pp schedule={name} workload={a.workload} P={world} M={a.micro_batches} "
                  f"layers={','.join(map(str, layers))} threads={torch.get_num_threads()} torch={torch.__version__} "
                  f"step_ms={mean:.1f} step_ms_min={lo:.1f} step_ms_max={hi:.1f}", flush=True)
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
