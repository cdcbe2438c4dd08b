#!/usr/bin/env python3
"""Serving measurements for docs/results/serving-*.md: `kiln serve` under `kiln bench serve`.

Each scenario starts a server with its flags, runs the load client (--json), samples /metrics
every 50 ms (max KV blocks used, preemptions), stops the server; all of it while holding the
machine's CPU lock (/tmp/kiln-cpu.lock), so timings are comparable. Prints one JSON line per
scenario and a markdown table at the end.

Run:  /usr/bin/python3 scripts/serve_bench.py --models /tmp/kiln-serve-models [--only llama-tiny-1k]
      /usr/bin/python3 scripts/serve_bench.py --speculative   # runs/w2-s with and without the runs/llama-tiny draft
"""
import argparse
import fcntl
import json
import os
import socket
import subprocess
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN = os.path.join(ROOT, "build", "kiln")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base, proc, seconds=120):
    """Until GET /health answers 200; the server's output if it exits first."""
    for _ in range(int(seconds / 0.1)):
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(proc.stdout.read())
        time.sleep(0.1)
    raise SystemExit("server did not come up")


def metrics(base):
    out = {}
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
    return out


def scenario(model_dir, name, serve_flags, bench_flags):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open("/tmp/kiln-cpu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        srv = subprocess.Popen([KILN, "serve", "--model", model_dir, "--port", str(port), "--served-model-name", "m"]
                               + serve_flags, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(base + "/health", timeout=1)
                    break
                except OSError:
                    if srv.poll() is not None:
                        raise SystemExit(srv.stdout.read())
                    time.sleep(0.05)
            peak = {"used": 0}
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    try:
                        peak["used"] = max(peak["used"], metrics(base)["kiln_kv_blocks_used"])
                    except OSError:
                        pass
                    time.sleep(0.05)

            th = threading.Thread(target=sample)
            th.start()
            p = subprocess.run([KILN, "bench", "serve", "--url", base, "--json"] + bench_flags,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            stop.set()
            th.join()
            m = metrics(base)
        finally:
            srv.terminate()
            srv.wait(timeout=30)
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SystemExit(f"bench serve failed: {p.stdout}")
    r.update({"scenario": name, "model": os.path.basename(model_dir), "serve_flags": " ".join(serve_flags),
              "kv_blocks_total": m["kiln_kv_blocks_total"], "kv_blocks_used_peak": peak["used"],
              "kv_cache_bytes": m["kiln_kv_cache_bytes"], "preemptions": m["kiln_num_preemptions_total"],
              "prefix_hit_rate": m["kiln_prefix_cache_hit_rate"],
              "spec_acceptance_rate": m.get("kiln_spec_decode_acceptance_rate"),
              "spec_tokens_per_pass": m.get("kiln_spec_decode_tokens_per_pass"),
              "spec_expected_tokens_per_pass": m.get("kiln_spec_decode_expected_tokens_per_pass")})
    print(json.dumps(r), flush=True)
    return r


SCENARIOS = {
    # (name, serve flags, bench flags) per model
    "llama-tiny-1k": [
        ("continuous", ["--max-running", "16"],
         ["--num", "64", "--rate", "inf", "--prompt-len", "32:128", "--output-len", "16:256", "--ignore-eos", "--seed", "1"]),
        ("static", ["--max-running", "16", "--batching", "static"],
         ["--num", "64", "--rate", "inf", "--prompt-len", "32:128", "--output-len", "16:256", "--ignore-eos", "--seed", "1"]),
        # At most 8 running: every decode GEMM stays on the small-M path (m <= 8) in both modes.
        ("continuous-8", ["--max-running", "8"],
         ["--num", "64", "--rate", "inf", "--prompt-len", "32:128", "--output-len", "16:256", "--ignore-eos", "--seed", "1"]),
        ("static-8", ["--max-running", "8", "--batching", "static"],
         ["--num", "64", "--rate", "inf", "--prompt-len", "32:128", "--output-len", "16:256", "--ignore-eos", "--seed", "1"]),
        ("prefix-cache", [],
         ["--num", "24", "--rate", "4", "--prompt-len", "512:512", "--shared-prefix", "460", "--output-len", "16:16",
          "--ignore-eos", "--seed", "2"]),
        ("no-prefix-cache", ["--no-prefix-caching"],
         ["--num", "24", "--rate", "4", "--prompt-len", "512:512", "--shared-prefix", "460", "--output-len", "16:16",
          "--ignore-eos", "--seed", "2"]),
        ("overload", ["--kv-cache-mem", "4M"],
         ["--num", "96", "--rate", "60", "--prompt-len", "64:256", "--output-len", "64:128", "--ignore-eos",
          "--seed", "3"]),
    ],
    "w2-s": [
        ("continuous-8", ["--max-running", "8"],
         ["--num", "32", "--rate", "inf", "--prompt-len", "32:128", "--output-len", "16:256", "--ignore-eos", "--seed", "1"]),
        ("static-8", ["--max-running", "8", "--batching", "static"],
         ["--num", "32", "--rate", "inf", "--prompt-len", "32:128", "--output-len", "16:256", "--ignore-eos", "--seed", "1"]),
        ("continuous", ["--max-running", "16"],
         ["--num", "32", "--rate", "inf", "--prompt-len", "32:128", "--output-len", "16:256", "--ignore-eos", "--seed", "1"]),
        ("static", ["--max-running", "16", "--batching", "static"],
         ["--num", "32", "--rate", "inf", "--prompt-len", "32:128", "--output-len", "16:256", "--ignore-eos", "--seed", "1"]),
        ("prefix-cache", [],
         ["--num", "12", "--rate", "1", "--prompt-len", "512:512", "--shared-prefix", "460", "--output-len", "16:16",
          "--ignore-eos", "--seed", "2"]),
        ("no-prefix-cache", ["--no-prefix-caching"],
         ["--num", "12", "--rate", "1", "--prompt-len", "512:512", "--shared-prefix", "460", "--output-len", "16:16",
          "--ignore-eos", "--seed", "2"]),
        ("overload", ["--kv-cache-mem", "16M"],
         ["--num", "32", "--rate", "10", "--prompt-len", "64:128", "--output-len", "32:64", "--ignore-eos",
          "--seed", "3"]),
    ],
}


# Speculative decoding in the engine: the trained w2-s target (runs/w2-s) with the trained
# llama-tiny draft (runs/llama-tiny, same tokenizer), 128 output tokens, 1, 2 and 4 requests at
# once; the engine speculates while at most --speculative-max-batch (default 2) sequences decode.
def speculative_scenarios():
    draft = ["--draft-model", os.path.join(ROOT, "runs", "llama-tiny"), "--num-speculative", "4"]
    out = []
    for temp in ("0", "0.8"):
        for conc in ("1", "2", "4"):
            bench = ["--num", "8", "--rate", "inf", "--max-concurrency", conc, "--prompt-len", "16:32",
                     "--output-len", "128:128", "--ignore-eos", "--temperature", temp, "--seed", "4"]
            out.append((f"plain-t{temp}-c{conc}", [], bench))
            out.append((f"spec4-t{temp}-c{conc}", draft, bench))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="/tmp/kiln-serve-models")
    ap.add_argument("--only", default="")
    ap.add_argument("--scenarios", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--extra-serve-flags", default="", help="appended to every scenario's kiln serve flags, e.g. --no-packed-weights")
    ap.add_argument("--speculative", action="store_true", help="only the speculative-decoding scenarios")
    a = ap.parse_args()
    rows = []
    if a.speculative:
        for name, sf, bf in speculative_scenarios():
            rows.append(scenario(os.path.join(ROOT, "runs", "w2-s"), name, sf, bf))
        print("| scenario | out tok/s | TPOT p50 ms | TTFT p50 ms | alpha | tokens/pass (formula) |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            spec = (f"{r['spec_acceptance_rate']:.3f} | {r['spec_tokens_per_pass']:.2f} ({r['spec_expected_tokens_per_pass']:.2f})"
                    if r["spec_acceptance_rate"] is not None else "- | -")
            print(f"| {r['scenario']} | {r['output_throughput']:.1f} | {r['tpot_ms']['p50']:.2f} | {r['ttft_ms']['p50']:.1f} | {spec} |")
        return
    for model, scens in SCENARIOS.items():
        if a.only and model != a.only:
            continue
        for name, sf, bf in scens:
            if a.scenarios and name not in a.scenarios.split(","):
                continue
            rows.append(scenario(os.path.join(a.models, model), name, sf + a.extra_serve_flags.split(), bf))
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print("| model | scenario | done/failed | out tok/s | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
          "peak KV blocks / total | preemptions | prefix hit rate |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['scenario']} | {r['completed']}/{r['failed']} | {r['output_throughput']:.0f} | "
              f"{r['request_throughput']:.2f} | {r['ttft_ms']['p50']:.1f} | {r['ttft_ms']['p99']:.1f} | "
              f"{r['tpot_ms']['p50']:.2f} | {r['kv_blocks_used_peak']:.0f} / {r['kv_blocks_total']:.0f} | "
              f"{r['preemptions']:.0f} | {r['prefix_hit_rate']:.2f} |")


if __name__ == "__main__":
    main()
