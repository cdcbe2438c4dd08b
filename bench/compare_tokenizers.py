#!/usr/bin/env python3
"""Encoding speed of kiln's BPE beside Hugging Face `tokenizers` on the same file and vocabulary,
both on one thread, plus a check that both give exactly the same ids.

  python3 bench/compare_tokenizers.py [--tokenizer data/kjv/tokenizer.json] [--text data/kjv/corpus.txt]

Needs `pip install tokenizers` and a built kiln (build/kiln); `kiln data prepare` makes the defaults.
"""
import argparse
import json
import os
import subprocess
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizers  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--tokenizer", default="data/kjv/tokenizer.json")
ap.add_argument("--text", default="data/kjv/corpus.txt")
ap.add_argument("--kiln", default="build/kiln")
ap.add_argument("--reps", type=int, default=5)
args = ap.parse_args()

tk = tokenizers.Tokenizer.from_file(args.tokenizer)
text = open(args.text, encoding="utf-8").read()
nbytes = len(text.encode("utf-8"))
lines = text.splitlines(keepends=True)

def median_time(fn):
    times = []
    fn()
    for _ in range(args.reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]

hf_ids = tk.encode(text).ids
t_single = median_time(lambda: tk.encode(text))
t_batch = median_time(lambda: tk.encode_batch(lines))
kiln = json.loads(subprocess.check_output(
    [args.kiln, "--threads", "1", "bench", "tokenizer", "--tokenizer", args.tokenizer, "--text", args.text,
     "--reps", str(args.reps), "--json"]))
kiln_ids = json.loads(subprocess.check_output(
    [args.kiln, "tokenizer", "encode", "--tokenizer", args.tokenizer, "--file", args.text]))
print(f"tokenizers {tokenizers.__version__}; {nbytes} bytes; same ids: {kiln_ids == hf_ids} "
      f"({len(kiln_ids)} kiln, {len(hf_ids)} tokenizers)")
best_hf = max(nbytes / t_single, nbytes / t_batch) / 1e6
print(f"tokenizers encode(text):       {nbytes / t_single / 1e6:8.2f} MB/s")
print(f"tokenizers encode_batch(lines):{nbytes / t_batch / 1e6:8.2f} MB/s (1 thread)")
print(f"kiln encode:                   {kiln['mb_per_s']:8.2f} MB/s (1 thread)")
print(f"ratio: {kiln['mb_per_s'] / best_hf:.2f}  (kiln / the faster tokenizers call)")
