#!/usr/bin/env python3
"""PyTorch's side of W5 (`kiln bench attention`), causal fp32 attention at batch 1, 12 heads,
head dim 64, forward and forward+backward time (median after warm-up):
  * torch-naive: scores = Q Kᵀ / sqrt(d) materialized as (B, H, T, T), masked_fill, softmax, @ V
    (the memory reference: extra_bytes is the size of the (B, H, T, T) tensors the graph keeps or
    creates, computed, not measured);
  * torch-sdpa: torch.nn.functional.scaled_dot_product_attention(is_causal=True), PyTorch 2.x's
    fused CPU flash kernel, the speed peer (absent from Debian's torch 1.13: skipped there).
With --kiln PATH the same run times kiln's flash attention per T first (`kiln bench attention
--part train --no-naive --json`), alternating the two programs, and ends with a table and one
`ratio: X` line per (T, pass): kiln flash speed over torch-sdpa's (time ratio sdpa / kiln).
Prints JSON lines with kiln's keys.

With --device cuda both sides run on the GPU (`kiln bench attention --device cuda`, torch's SDPA
on CUDA tensors, timed with synchronizations); scripts/cuda-device-check.sh runs it there.

Run (BENCH.md: OpenBLAS unpinned, threads set; PyPI torch in .venv-torch, see compare_pytorch.sh):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 \
      .venv-torch/bin/python bench/attention_torch.py --threads 2 --kiln build/kiln
"""
import argparse
import json
import math
import statistics
import subprocess
import time

import torch

HEADS, HEAD_DIM = 12, 64


def attention(q, k, v, mask):
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def sdpa(q, k, v, mask):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def median_ms(fn, reps, sync=lambda: None):
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def kiln_rows(kiln, threads, T, reps, device):
    out = subprocess.run([kiln, "--threads", str(threads), "bench", "attention", "--part", "train", "--seq", str(T),
                          "--reps", str(reps), "--json", "--no-naive", "--device", device],
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seq", default="256,512,1024,2048,4096")
    has_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    ap.add_argument("--impl", default="naive,sdpa" if has_sdpa else "naive", help="naive, sdpa or both (comma-separated)")
    ap.add_argument("--kiln", default="", help="kiln binary: time its flash attention beside, per T")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both sides run")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("attention_torch.py: skipped: --device cuda, but torch sees no CUDA device")
        raise SystemExit(77)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    impls = [x for x in args.impl.split(",") if x]
    for x in impls:
        if x not in ("naive", "sdpa"):
            ap.error(f"--impl: unknown {x!r} (naive, sdpa)")
    if "sdpa" in impls and not has_sdpa:
        ap.error(f"--impl sdpa: torch {torch.__version__} has no scaled_dot_product_attention")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for T in [int(x) for x in args.seq.split(",")]:
        if args.kiln:
            for r in kiln_rows(args.kiln, args.threads, T, args.reps, args.device):
                print(json.dumps(r), flush=True)
                rows.append(r)
        shape = (1, HEADS, T, HEAD_DIM)
        q, k, v = (torch.rand(shape, device=args.device) * 2 - 1 for _ in range(3))
        mask = torch.ones(T, T, dtype=torch.bool, device=args.device).triu(1)
        tt = HEADS * T * T * 4
        for impl in impls:
            fn = attention if impl == "naive" else sdpa
            with torch.no_grad():
                fwd = median_ms(lambda: fn(q, k, v, mask), args.reps, sync)
            qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
            dout = torch.rand(shape, device=args.device)

            def both():
                fn(qg, kg, vg, mask).backward(dout)

            fb = median_ms(both, args.reps, sync)
            # Naive forward: scores and masked scores, probabilities (3 T×T); backward adds their
            # gradients (2 more). SDPA's flash kernel keeps no T×T tensor: not computed here.
            for name, ms, extra in (("fwd", fwd, 3 * tt), ("fwd+bwd", fb, 5 * tt)):
                r = {"bench": "attention", "impl": "torch-" + impl, "T": T, "pass": name, "ms": round(ms, 4),
                     "extra_bytes": extra if impl == "naive" else None, "extra_bytes_measured": False,
                     "threads": args.threads, "heads": HEADS, "head_dim": HEAD_DIM, "torch": torch.__version__,
                     "device": args.device}
                print(json.dumps(r), flush=True)
                rows.append(r)
    if args.kiln and "sdpa" in impls:
        ms = {(r["impl"], r["T"], r["pass"]): r["ms"] for r in rows}
        where = torch.cuda.get_device_name() if args.device == "cuda" else f"{args.threads} thread(s)"
        print(f"\nkiln flash vs torch {torch.__version__} SDPA, causal fp32, {HEADS} heads x {HEAD_DIM}, {where}")
        for (impl, T, pss), kiln_ms in ms.items():
            if impl != "flash" or ("torch-sdpa", T, pss) not in ms:
                continue
            t_ms = ms[("torch-sdpa", T, pss)]
            print(f"T {T:5d} {pss:8s} kiln {kiln_ms:9.2f} ms  sdpa {t_ms:9.2f} ms")
            print(f"ratio: {t_ms / kiln_ms:.2f}  (T {T}, {pss}, sdpa time / kiln flash time)")


if __name__ == "__main__":
    main()
