#!/usr/bin/env python3
"""Colocated vs disaggregated serving at the same total cores (issue 25): long prompts arriving
beside running decodes. One `kiln serve` with 2 threads, then `mpirun -np 2 kiln serve
--disaggregate 1:1` with 1 thread per rank (one prefill rank, one decode rank), each under the
same two load clients at once (`kiln bench serve`):

  decodes:      short prompts (32-64 tokens), long outputs (128), Poisson at --decode-rate
  long prompts: 2,000-token prompts, short outputs (8), Poisson at --long-rate

A long prompt's prefill stalls every running decode of a colocated server for the steps it takes
(chunked prefill bounds each stall, but the steps are longer); disaggregated, the prefill runs on
its own rank and the decode rank only writes the received K/V. Prints one JSON line per run and a
markdown table: decode TPOT p50/p99 and ITL p99, long-prompt TTFT p50/p99, and goodput (requests/s
meeting TTFT <= --slo-ttft and TPOT <= --slo-tpot) for both.

The model needs a context of at least 2,048 + 8 tokens, e.g.
  build/kiln train --preset llama-tiny --seq-len 2304 --batch 1 --steps 2 --eval-every 0 --out /tmp/long
Run:  python3 scripts/serve_disagg_bench.py --model /tmp/long [--decode-rate 2 --long-rate 0.5]
"""
import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_bench import KILN, free_port, metrics, wait_healthy  # noqa: E402


def run(name, launcher, threads, serve_flags, args):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    srv = subprocess.Popen(launcher + [KILN, "--threads", str(threads), "serve", "--model", args.model, "--port",
                                       str(port), "--kv-cache-mem", "1G"] + serve_flags,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(base, srv)
        common = ["bench", "serve", "--url", base, "--json", "--ignore-eos", "--temperature", "0",
                  "--slo-ttft", str(args.slo_ttft), "--slo-tpot", str(args.slo_tpot)]
        decode = subprocess.Popen([KILN] + common + ["--num", str(args.decode_num), "--rate", str(args.decode_rate),
                                                     "--prompt-len", "32:64", "--output-len", "128:128", "--seed", "1"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(1.0)  # decodes running before the first long prompt arrives
        long = subprocess.Popen([KILN] + common + ["--num", str(args.long_num), "--rate", str(args.long_rate),
                                                   "--prompt-len", "2000:2000", "--output-len", "8:8", "--seed", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        outs = [p.communicate()[0] for p in (decode, long)]
        m = metrics(base)
    finally:
        srv.terminate()  # under mpirun, SIGTERM reaches rank 0, which stops the prefill ranks
        srv.wait(timeout=60)
    try:
        d, lp = (json.loads(o.strip().splitlines()[-1]) for o in outs)
    except (ValueError, IndexError):
        raise SystemExit(f"bench serve failed: {outs}")
    r = {"layout": name, "decode_tpot_p50_ms": d["tpot_ms"]["p50"], "decode_tpot_p99_ms": d["tpot_ms"]["p99"],
         "decode_itl_p99_ms": d["itl_ms"]["p99"], "decode_itl_max_ms": d["itl_ms"]["max"], "long_ttft_p50_ms": lp["ttft_ms"]["p50"],
         "long_ttft_p99_ms": lp["ttft_ms"]["p99"],
         "goodput": (d["num_good"] + lp["num_good"]) / max(d["duration_s"], lp["duration_s"] + 1.0),
         "good": d["num_good"] + lp["num_good"], "requests": d["num_requests"] + lp["num_requests"],
         "failed": d["failed"] + lp["failed"], "output_tok_s": d["output_throughput"] + lp["output_throughput"],
         "kv_transfer_bytes": m.get("kiln_disagg_kv_transfer_bytes_total", 0.0),
         "kv_transfer_mean_ms": 1e3 * m["kiln_disagg_kv_transfer_seconds_sum"] / m["kiln_disagg_kv_transfer_seconds_count"]
         if m.get("kiln_disagg_kv_transfer_seconds_count") else None}
    print(json.dumps(r), flush=True)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--decode-rate", type=float, default=4.0)
    ap.add_argument("--decode-num", type=int, default=64)
    ap.add_argument("--long-rate", type=float, default=2.0)
    ap.add_argument("--long-num", type=int, default=24)
    ap.add_argument("--slo-ttft", type=float, default=2000.0, help="ms")
    ap.add_argument("--slo-tpot", type=float, default=30.0, help="ms")
    args = ap.parse_args()
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise SystemExit("mpirun is needed for the disaggregated layout")
    with open("/tmp/kiln-cpu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = [run("colocated, 1 process × 2 threads", [], 2, [], args),
                run("disaggregated 1:1, 2 ranks × 1 thread",
                    [mpirun, "-np", "2", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader"], 1,
                    ["--disaggregate", "1:1"], args)]
    print(f"\nSLO: TTFT <= {args.slo_ttft:g} ms and TPOT <= {args.slo_tpot:g} ms; decodes at {args.decode_rate:g}/s, "
          f"2,000-token prompts at {args.long_rate:g}/s\n")
    print("| layout | decode TPOT p50 ms | decode TPOT p99 ms | decode ITL p99 ms | decode ITL max ms | long TTFT p50 ms "
          "| long TTFT p99 ms | goodput req/s | good / all | failed | output tok/s | K/V received MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['decode_tpot_p50_ms']:.1f} | {r['decode_tpot_p99_ms']:.1f} | "
              f"{r['decode_itl_p99_ms']:.1f} | {r['decode_itl_max_ms']:.1f} | {r['long_ttft_p50_ms']:.0f} | "
              f"{r['long_ttft_p99_ms']:.0f} | {r['goodput']:.2f} | {r['good']}/{r['requests']} | {r['failed']} | "
              f"{r['output_tok_s']:.0f} | {r['kv_transfer_bytes'] / 2**20:.0f} |")
    a, b = rows
    print(f"\ndisaggregated / colocated: decode TPOT p99 {b['decode_tpot_p99_ms'] / a['decode_tpot_p99_ms']:.2f}×, "
          f"ITL p99 {b['decode_itl_p99_ms'] / a['decode_itl_p99_ms']:.2f}×, long TTFT p99 "
          f"{b['long_ttft_p99_ms'] / a['long_ttft_p99_ms']:.2f}×, goodput {b['goodput'] / max(a['goodput'], 1e-9):.2f}×")


if __name__ == "__main__":
    main()
