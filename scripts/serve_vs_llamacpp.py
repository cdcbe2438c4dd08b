#!/usr/bin/env python3
"""W6 serving beside llama.cpp's `llama-server` (BENCH.md's peer): the same model (kiln's GGUF
export, F32), the same load client (`kiln bench serve`), the same requests, the same number of
sequences at once, one server at a time while holding the machine's CPU lock
(/tmp/kiln-cpu.lock). With --mixes, each workload preset of `kiln bench serve --mix` (chat:
lognormal outputs of mean ~200 to 2,048; rag: long shared-prefix prompts, short outputs) at each
rate; at rate inf kiln also runs with each --saturation-batching mode (classic padded static,
kiln's static) beside continuous batching. Prints one JSON line per run, a markdown table and
the ratios (kiln / llama.cpp, continuous / classic).

llama-server is not a dependency: build it once from llama.cpp's source (e.g. the copy vendored in
PyPI's llama-cpp-python sdist) with -DGGML_NATIVE=ON, and pass its path. Without --llama-server only
kiln runs (the batching comparison at rate inf); --repeat R runs every row R times, interleaved
(round by round), and the tables give each ratio as the median over rounds with its min-max.

Run:  /usr/bin/python3 scripts/serve_vs_llamacpp.py --llama-server PATH \
          --model runs/w2-s --gguf /tmp/w2s-f32.gguf [--parallel 8] [--rates 1,2,inf]
          [--mixes chat,rag --nums 24,24,64 --slo-ttft 10000 --slo-tpot 100]
      (make the GGUF with `build/kiln convert --model runs/w2-s --out /tmp/w2s-f32.gguf --type f32`;
      the chat mix needs 1,024 + 2,048 positions: raise the model's max_position_embeddings first)
"""
import argparse
import fcntl
import json
import os
import subprocess

from serve_bench import KILN, free_port, wait_healthy  # noqa: E402  (scripts/ is on sys.path when run as a script)


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
        raise SystemExit(f"bench serve failed (exit status {p.returncode}): {p.stdout}")


def ratio(a, b):
    return f"{a / b:.2f}x" if b else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", default="", help="llama-server binary (none: kiln rows only)")
    ap.add_argument("--model", required=True, help="kiln model directory")
    ap.add_argument("--gguf", default="", help="the same model as GGUF (kiln convert); with --llama-server")
    ap.add_argument("--kiln-gguf", action="store_true",
                    help="kiln serves the --gguf file too (its weights as stored there, its tokenizer read from it), "
                         "not --model's directory")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every row (ratios: median over rounds)")
    ap.add_argument("--parallel", type=int, default=8, help="sequences at once: kiln --max-running, llama -np")
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence (chat mix: 3072)")
    ap.add_argument("--rates", default="1,2,inf")
    ap.add_argument("--num", type=int, default=32, help="requests per run")
    ap.add_argument("--nums", default="", help="requests per rate, one per --rates entry (overrides --num)")
    ap.add_argument("--mixes", default="", help="comma list of `kiln bench serve --mix` presets (chat, rag)")
    ap.add_argument("--prompt-len", default="64:512", help="without --mixes")
    ap.add_argument("--output-len", default="64:256", help="without --mixes")
    ap.add_argument("--saturation-batching", default="classic,static",
                    help="kiln --batching modes also run at rate inf, beside continuous ('' for none)")
    ap.add_argument("--slo-ttft", default="0", help="goodput SLO, ms (0: none)")
    ap.add_argument("--slo-tpot", default="0", help="goodput SLO, ms (0: none)")
    ap.add_argument("--kv-cache-mem", default="1G", help="kiln's KV-cache pool")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.llama_server and not a.gguf:
        raise SystemExit("--llama-server needs --gguf (the same model as GGUF)")
    if a.kiln_gguf and not a.gguf:
        raise SystemExit("--kiln-gguf needs --gguf")
    if a.repeat < 1:
        raise SystemExit("--repeat must be >= 1")
    kiln_cmd = [KILN, "--threads", str(a.threads), "serve", "--model", a.gguf if a.kiln_gguf else a.model, "--served-model-name", "m",
                "--max-running", str(a.parallel), "--kv-cache-mem", a.kv_cache_mem]
    llama_cmd = [a.llama_server, "-m", a.gguf, "-a", "m", "-np", str(a.parallel), "-c", str(a.ctx * a.parallel),
                 "-t", str(a.threads), "-tb", str(a.threads), "--host", "127.0.0.1", "--no-webui", "-lv", "0"]
    rates = a.rates.split(",")
    nums = [int(n) for n in a.nums.split(",")] if a.nums else [a.num] * len(rates)
    if len(nums) != len(rates):
        raise SystemExit("--nums needs one count per --rates entry")
    modes = [m for m in a.saturation_batching.split(",") if m]
    model = os.path.basename(os.path.normpath(a.model))
    rows = []
    for mix in a.mixes.split(",") if a.mixes else [""]:
        load = ["--mix", mix] if mix else ["--prompt-len", a.prompt_len, "--output-len", a.output_len]
        for rate, num in zip(rates, nums):
            bench = ["--num", str(num), "--rate", rate, "--ignore-eos", "--temperature", "0", "--seed", "6",
                     "--slo-ttft", a.slo_ttft, "--slo-tpot", a.slo_tpot] + load
            servers = [("kiln", "continuous", kiln_cmd)]
            if a.llama_server:
                servers.append(("llama.cpp", "continuous", llama_cmd))
            if rate == "inf":
                servers += [("kiln", m, kiln_cmd + ["--batching", m]) for m in modes]
            for round_ in range(a.repeat):
                for name, batching, cmd in servers:
                    r = run(cmd, bench)
                    r.update({"server": name, "batching": batching, "model": model, "rate": rate, "mix": mix or "-",
                              "round": round_})
                    print(json.dumps(r), flush=True)
                    rows.append(r)
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"\nmodel {model}, {a.parallel} sequences at once, {a.threads} threads; "
          f"goodput SLO: TTFT <= {a.slo_ttft} ms, TPOT <= {a.slo_tpot} ms (0: none)\n")
    print("| mix | rate | round | server | batching | done/failed | out tok/s | goodput req/s | TTFT p50 / p99 ms | "
          "TPOT p50 / p99 ms | output len mean / p50 / p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        o = r["output_tokens_per_request"]
        print(f"| {r['mix']} | {r['rate']} | {r['round']} | {r['server']} | {r['batching']} | {r['completed']}/{r['failed']} | "
              f"{r['output_throughput']:.1f} | {r['goodput']:.3f} | {r['ttft_ms']['p50']:.0f} / {r['ttft_ms']['p99']:.0f} | "
              f"{r['tpot_ms']['p50']:.1f} / {r['tpot_ms']['p99']:.1f} | {o['mean']:.0f} / {o['p50']:.0f} / {o['p99']:.0f} |")

    def find(mix, rate, server, batching, round_):
        return next((r for r in rows if (r["mix"], r["rate"], r["server"], r["batching"], r["round"]) ==
                     (mix, rate, server, batching, round_)), None)

    def over_rounds(f):  # f(round) -> (a, b) per round; "median (min-max)" of a / b
        rs = sorted(x / y for x, y in (f(i) for i in range(a.repeat)) if y)
        if not rs:
            return "-"
        mid = rs[len(rs) // 2] if len(rs) % 2 else (rs[len(rs) // 2 - 1] + rs[len(rs) // 2]) / 2
        return f"{mid:.2f}x" + (f" ({rs[0]:.2f}-{rs[-1]:.2f})" if len(rs) > 1 else "")

    mixes = list(dict.fromkeys(r["mix"] for r in rows))
    if a.llama_server:
        print("\n| mix | rate | kiln / llama.cpp out tok/s | p99 TTFT llama / kiln | p99 TPOT llama / kiln | "
              "goodput kiln / llama.cpp |")
        print("|---|---|---|---|---|---|")
        for mix in mixes:
            for rate in rates:
                def kl(i, key, mix=mix, rate=rate):  # (kiln's, llama.cpp's) value in round i
                    return (find(mix, rate, "kiln", "continuous", i)[key],
                            find(mix, rate, "llama.cpp", "continuous", i)[key])

                def p99(i, key):
                    k, l = kl(i, key)
                    return l["p99"], k["p99"]
                print(f"| {mix} | {rate} | {over_rounds(lambda i: kl(i, 'output_throughput'))} | "
                      f"{over_rounds(lambda i: p99(i, 'ttft_ms'))} | {over_rounds(lambda i: p99(i, 'tpot_ms'))} | "
                      f"{over_rounds(lambda i: kl(i, 'goodput'))} |")
    if modes and "inf" in rates:
        print("\n| mix | kiln continuous / X at rate inf | out tok/s | goodput |")
        print("|---|---|---|---|")
        for mix in mixes:
            for m in modes:
                def cx(i, key, m=m):
                    return (find(mix, "inf", "kiln", "continuous", i)[key], find(mix, "inf", "kiln", m, i)[key])
                print(f"| {mix} | {m} | {over_rounds(lambda i: cx(i, 'output_throughput'))} | "
                      f"{over_rounds(lambda i: cx(i, 'goodput'))} |")


if __name__ == "__main__":
    main()
