#!/usr/bin/env python3
"""Continuous vs static batching, decode steps only, for docs/results/serving-2026-11-30.md §4.

N requests with output lengths uniform in [16, 256]; at most CAP run at once. Continuous: a
finished sequence is replaced at once. Static: batches of CAP in arrival order, each running
until its longest member is done. A step with S sequences costs step_ms(S), interpolated from a
measured curve (`kiln bench prepacked --step-preset ...`) or 1 (flat). Prints static time /
continuous time (= the output tokens/s ratio), averaged over 200 draws.

Run:  python3 scripts/batching_sim.py
"""
import bisect
import random

CURVES = {  # packed ms per forward_paged step by S, 2 threads (section 4 table)
    "llama-tiny": {1: 1.37, 4: 2.32, 8: 3.89, 12: 5.24, 14: 4.73, 16: 5.36, 24: 8.47, 32: 10.79, 64: 16.86},
    "w2-s": {1: 13.92, 4: 14.13, 8: 17.18, 12: 27.11, 14: 27.66, 16: 31.78, 24: 52.61, 32: 68.16, 64: 105.67},
}
REQUESTS = {"llama-tiny": 64, "w2-s": 32}


def interp(curve, s):
    if s in curve:
        return curve[s]
    xs = sorted(curve)
    i = bisect.bisect(xs, s)
    a, b = xs[i - 1], xs[i]
    return curve[a] + (curve[b] - curve[a]) * (s - a) / (b - a)


def ratio(step, n, cap, trials=200):
    total = 0.0
    for t in range(trials):
        rng = random.Random(t)
        outs = [rng.randint(16, 256) for _ in range(n)]
        waiting, running, cont = list(outs), [], 0.0
        while waiting or running:
            while waiting and len(running) < cap:
                running.append(waiting.pop(0))
            cont += step(len(running))
            running = [r - 1 for r in running if r > 1]
        static = 0.0
        for i in range(0, n, cap):
            batch = outs[i:i + cap]
            for k in range(max(batch)):
                static += step(sum(1 for r in batch if r > k))
        total += static / cont
    return total / trials


for model, curve in CURVES.items():
    for cap in (8, 16):
        measured = ratio(lambda s: interp(curve, s), REQUESTS[model], cap)
        flat = ratio(lambda s: 1.0, REQUESTS[model], cap)
        print(f"{model} max-running {cap}: measured step curve {measured:.2f}x, flat step {flat:.2f}x")
