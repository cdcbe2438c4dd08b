#!/usr/bin/env python3
"""PyTorch's side of BENCH.md W7 (pipeline parallel): the W1a / W1b GPT-2 training step cut into
stages (embedding + the first blocks on stage 0, the last blocks + final norm + LM head on the
last), run by torch.distributed.pipelining over gloo on CPU, M micro-batches, one thread a rank:
PipelineStage with ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B (V chunks a rank: stages
r, r + P, ...) and, for zb-h1, ScheduleInterleavedZeroBubble with one stage a rank (torch's ZB1P,
the nearest it has to ZB-H1). What kiln's pipeline step also does is done here too: the tied
embedding's gradient summed between the first stage and the last stage's copy of it, the gradient
norm over the stages with clipping at 1.0, and AdamW. Mean step time after warm-up (the slowest
rank's time of each step); rank 0 prints one line per schedule:
  torch_pp schedule=gpipe workload=W1a P=2 M=4 layers=3,3 threads=1 ... step_ms=... step_ms_min=... step_ms_max=...

Run:  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 bench/torch_pp.py --workload W1a --schedule all
      (--layers 8,4 --interleaved-layers ... give kiln's default splits: `kiln bench pp` prints them)
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
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1"]


class StageModule(nn.Module):
    """Blocks [begin, end) of the model; the first stage also embeds the tokens, the last also
    holds the final norm and the LM head: its own copy of the tied embedding (kiln's last stage
    holds one too; their gradients are summed after backward)."""

    def __init__(self, gpt, begin, end, first, last):
        super().__init__()
        self.first, self.last = first, last
        self.h = nn.ModuleList(gpt.h[begin:end])
        if first:
            self.wte, self.wpe = gpt.wte, gpt.wpe
        if last:
            self.ln_f = gpt.ln_f
            self.head = nn.Parameter(gpt.wte.weight.detach().clone())  # (V, C)

    def forward(self, x):  # first: idx (B, T); else (B, T, C) -> (B, T, C), or logits (B, T, V) last
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.head.T if self.last else x


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def make_schedule(name, stages, m):
    from torch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble)
    if name == "gpipe":
        return ScheduleGPipe(stages[0], n_microbatches=m, loss_fn=loss_fn)
    if name == "1f1b":
        return Schedule1F1B(stages[0], n_microbatches=m, loss_fn=loss_fn)
    if name == "interleaved":
        return ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
    return ScheduleInterleavedZeroBubble(stages, n_microbatches=m, loss_fn=loss_fn)


def run(name, a, rank, world, layers, tied_group):
    """Mean, min and max step ms (each step's slowest rank) of one schedule. `layers`: blocks per
    virtual stage in model order; rank r holds stages r, r + P, ... (Megatron's interleaving)."""
    from torch.distributed.pipelining import PipelineStage
    vocab, d, n_layers, heads, ctx, B, T = WORKLOADS[a.workload]
    torch.manual_seed(1)  # the same initial weights on every rank; each keeps its stages
    gpt = GPT(vocab, d, n_layers, heads, ctx)
    S = len(layers)
    modules, stages = [], []
    for v in range(rank, S, world):
        begin = sum(layers[:v])
        modules.append(StageModule(gpt, begin, begin + layers[v], v == 0, v == S - 1))
        stages.append(PipelineStage(modules[-1], v, S, torch.device("cpu")))
    del gpt
    schedule = make_schedule(name, stages, a.micro_batches)
    # Weight decay on matrices only (kiln's trainer: norms and biases get none).
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95))
    tied = [m.wte.weight for m in modules if m.first] + [m.head for m in modules if m.last]
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
        for p in tied:  # the first stage's embedding and the last's head: one parameter
            dist.all_reduce(p.grad, group=tied_group)
        # The gradient norm over the stages (the tied table counted once, on stage 0), clip at 1.
        heads = {id(m.head) for m in modules if m.last}
        sq = sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None and id(p) not in heads)
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


def split(flag, n_layers, stages):
    """Blocks per stage: the flag's list, or as even as it goes."""
    if flag:
        return [int(v) for v in flag.split(",")]
    return [n_layers // stages + (1 if r < n_layers % stages else 0) for r in range(stages)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="W1a")
    ap.add_argument("--schedule", choices=["all"] + SCHEDULES, default="all")
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--virtual-stages", type=int, default=2, help="model chunks per rank for interleaved")
    ap.add_argument("--layers", default="", help="blocks per stage, e.g. 8,4 (default: as even as it goes)")
    ap.add_argument("--interleaved-layers", default="",
                    help="blocks per virtual stage for interleaved, P x V entries in model order")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    n_layers, B = WORKLOADS[a.workload][2], WORKLOADS[a.workload][5]
    names = SCHEDULES if a.schedule == "all" else [a.schedule]
    splits = {name: split(a.interleaved_layers, n_layers, world * a.virtual_stages) if name == "interleaved"
              else split(a.layers, n_layers, world) for name in names}
    for name, layers in splits.items():
        stages = world * (a.virtual_stages if name == "interleaved" else 1)
        if world < 2 or len(layers) != stages or sum(layers) != n_layers or min(layers) < 1 or B % a.micro_batches:
            if rank == 0:
                print(f"error: {name} needs P >= 2 ranks (got {world}), {stages} stages of >= 1 block summing to "
                      f"{n_layers} (got {layers}), and batch {B} divisible by --micro-batches {a.micro_batches}",
                      flush=True)
            dist.destroy_process_group()
            return 2
    tied_group = dist.new_group([0, world - 1])
    rc = 0
    for name in names:
        try:
            mean, lo, hi = run(name, a, rank, world, splits[name], tied_group)
        except Exception as e:  # a schedule this torch cannot run here: say so, try the next
            if rank == 0:
                print(f"torch_pp schedule={name} workload={a.workload} error: {type(e).__name__}: {e}", flush=True)
            rc = 1
            continue
        if rank == 0:
            print(f"torch_pp schedule={name} workload={a.workload} P={world} M={a.micro_batches} "
                  f"layers={','.join(map(str, splits[name]))} threads={torch.get_num_threads()} "
                  f"torch={torch.__version__} step_ms={mean:.1f} step_ms_min={lo:.1f} step_ms_max={hi:.1f}", flush=True)
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
