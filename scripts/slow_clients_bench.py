#!/usr/bin/env python3
"""How much slow clients slow everyone else down: /health and a short completion against
`kiln serve`, alone and beside N connections that send half a header and keep trickling bytes.

Prints the median (min-max) latency of each over --reps requests, in both conditions, and the
ratio with / without the slow clients (1.0: they cost the others nothing). Standard library
only; trains a tiny model unless --model is given. Loopback only.

Run:  python3 scripts/slow_clients_bench.py --kiln build/kiln [--slow 150] [--reps 30]
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "reference"))
from kiln_fixture import serving, train_tiny  # noqa: E402


def timed(port, method, path, body=None):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
    r = c.getresponse()
    r.read()
    c.close()
    if r.status != 200:
        raise SystemExit(f"{method} {path}: HTTP {r.status}")
    return time.perf_counter() - t0


def series(port, reps):
    comp = json.dumps({"prompt": "And God said", "max_tokens": 4, "temperature": 0})
    health = [timed(port, "GET", "/health") for _ in range(reps)]
    completion = [timed(port, "POST", "/v1/completions", comp) for _ in range(max(3, reps // 5))]
    return health, completion


def describe(xs):
    return f"{statistics.median(xs) * 1e3:8.2f} ms ({min(xs) * 1e3:.2f}-{max(xs) * 1e3:.2f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--model", default="")
    ap.add_argument("--slow", type=int, default=150)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--http-threads", type=int, default=128)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model = a.model or train_tiny(a.kiln, work)
        with serving(a.kiln, model, "--http-threads", str(a.http_threads), "--request-timeout", "600",
                     "--max-connections", str(a.slow + 64)) as (server, port):
            series(port, 5)  # warm-up
            alone = series(port, a.reps)
            slow = []
            for _ in range(a.slow):
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                slow.append(s)
            for s in slow:
                s.sendall(b"X-Trickle: 1\r\n")
            beside = series(port, a.reps)
            for s in slow:
                s.close()
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    print(f"kiln serve, {a.http_threads} HTTP threads, {a.slow} slow clients (half a header, trickling); {cpu}")
    for name, i in (("/health", 0), ("completion (4 tokens)", 1)):
        r = statistics.median(beside[i]) / statistics.median(alone[i])
        print(f"{name:<22} alone {describe(alone[i])}   beside slow clients {describe(beside[i])}   ratio {r:.2f}")


if __name__ == "__main__":
    main()
