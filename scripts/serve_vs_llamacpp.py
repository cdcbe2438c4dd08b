#!/usr/bin/env python3
"""W6 serving beside llama.cpp's `llama-server` (BENCH.md's peer): the same model (kiln's GGUF
export, F32), the same load client (`kiln bench serve`), the same requests, one server at a time
while holding the machine's CPU lock (/tmp/kiln-cpu.lock). Prints one JSON line per run and a
markdown table of kiln / llama.cpp ratios.

llama-server is not a dependency: build it once from llama.cpp's source (e.g. the copy vendored in
PyPI's llama-cpp-python sdist) with -DGGML_NATIVE=ON, and pass its path.

Run:  /usr/bin/python3 scripts/serve_vs_llamacpp.py --llama-server PATH \
          --model runs/w2-s --gguf /tmp/w2s-f32.gguf [--parallel 8] [--rates 1,2,inf]
      (make the GGUF with `build/kiln convert --model runs/w2-s --out /tmp/w2s-f32.gguf --type f32`)
"""
import argparse
import fcntl
import json
import os
import subprocess
import time
import urllib.request

from serve_bench import KILN, free_port  # noqa: E402  (scripts/ is on sys.path when run as a script)


def wait_healthy(base, proc, seconds=120):
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


def run(server_cmd, bench_flags):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open("/tmp/kiln-cpu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        srv = subprocess.Popen(server_cmd + ["--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        try:
            wait_healthy(base, srv)
            p = subprocess.run([KILN, "bench", "serve", "--url", base, "--model", "m", "--json"] + bench_flags,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        finally:
            srv.terminate()
            try:
                srv.wait(timeout=30)
            except subprocess.TimeoutExpired:
                srv.kill()
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SystemExit(f"bench serve failed: {p.stdout}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True, help="kiln model directory")
    ap.add_argument("--gguf", required=True, help="the same model as GGUF (kiln convert)")
    ap.add_argument("--parallel", type=int, default=8, help="sequences at once: kiln --max-running, llama -np")
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence")
    ap.add_argument("--rates", default="1,2,inf")
    ap.add_argument("--num", type=int, default=32)
    ap.add_argument("--prompt-len", default="64:512")
    ap.add_argument("--output-len", default="64:256")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    kiln_cmd = [KILN, "--threads", str(a.threads), "serve", "--model", a.model, "--served-model-name", "m",
                "--max-running", str(a.parallel)]
    llama_cmd = [a.llama_server, "-m", a.gguf, "-a", "m", "-np", str(a.parallel), "-c", str(a.ctx * a.parallel),
                 "-t", str(a.threads), "-tb", str(a.threads), "--host", "127.0.0.1", "--no-webui", "-lv", "0"]
    rows = []
    for rate in a.rates.split(","):
        bench = ["--num", str(a.num), "--rate", rate, "--prompt-len", a.prompt_len, "--output-len", a.output_len,
                 "--ignore-eos", "--temperature", "0", "--seed", "6"]
        for name, cmd in (("kiln", kiln_cmd), ("llama.cpp", llama_cmd)):
            r = run(cmd, bench)
            r.update({"server": name, "model": os.path.basename(os.path.normpath(a.model)), "rate": rate})
            print(json.dumps(r), flush=True)
            rows.append(r)
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print("| model | rate | server | done/failed | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['rate']} | {r['server']} | {r['completed']}/{r['failed']} | "
              f"{r['output_throughput']:.1f} | {r['ttft_ms']['p50']:.0f} / {r['ttft_ms']['p99']:.0f} | "
              f"{r['tpot_ms']['p50']:.2f} / {r['tpot_ms']['p99']:.2f} |")
    print()
    for i in range(0, len(rows), 2):
        k, l = rows[i], rows[i + 1]
        print(f"{k['model']} rate {k['rate']}: kiln/llama.cpp output tok/s {k['output_throughput'] / l['output_throughput']:.2f}x, "
              f"TPOT p50 {l['tpot_ms']['p50'] / k['tpot_ms']['p50']:.2f}x (llama/kiln), "
              f"TTFT p50 {l['ttft_ms']['p50'] / k['ttft_ms']['p50']:.2f}x (llama/kiln)")


if __name__ == "__main__":
    main()
