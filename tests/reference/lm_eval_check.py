#!/usr/bin/env python3
"""lm-evaluation-harness's `local-completions` backend runs a multiple-choice task against
`kiln serve`, and its per-example loglikelihoods equal kiln's own.

A tiny llama model is trained in seconds (as openai_client_check.py does) and served on a free
loopback port. lm-eval scores a custom task over a local jsonl file (no network): each choice's
loglikelihood comes from `echo` + `logprobs` completions requests (the prompt's token logprobs),
tokenized by the model's own tokenizer.json through transformers' PreTrainedTokenizerFast. The
same token ids then go through `kiln eval --tokens ... --dump-logits` (the model's dense forward,
the path of `kiln eval`): the sum of log-softmax (in float64) over the continuation's tokens must
equal lm-eval's loglikelihood within TOLERANCE nats, for every choice of every example, and
lm-eval's accuracy must agree with the argmax of kiln's. Exit 77 (CTest's SKIP_RETURN_CODE) when
lm_eval, transformers or numpy is missing.

Run:  /work/V/bin/python3 tests/reference/lm_eval_check.py [--kiln build/kiln]
"""
import argparse
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Per choice, |lm-eval's loglikelihood - kiln eval's| in nats. The server's paged, chunked
# forward and the dense forward sum in different orders (fp32 logits agree to ~1e-6 here, seen
# up to 3e-6 per choice); a continuation has a few tokens.
TOLERANCE = 1e-4

try:
    import numpy as np
    import transformers  # noqa: F401  (lm-eval's huggingface tokenizer backend)
    import lm_eval  # noqa: F401
    import aiohttp  # noqa: F401  (lm-eval[api]: its API models refuse to start without these)
    import tenacity  # noqa: F401
except ImportError as e:
    print(f"SKIP lm_eval_check: {e} (pip install 'lm-eval[api]' transformers numpy)")
    sys.exit(SKIP)

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        "and darkness was upon the face of the deep. And God said, Let there be light: and there was light.\n") * 40

# lm-eval joins context and choice with its target_delimiter, " ".
EXAMPLES = [
    {"context": "In the beginning God created the", "choices": ["heaven", "water", "light"], "label": 0},
    {"context": "And the earth was without", "choices": ["form", "light", "God"], "label": 0},
    {"context": "And God said, Let there be", "choices": ["light", "earth", "darkness and void"], "label": 0},
    {"context": "darkness was upon the face of the", "choices": ["deep", "heaven"], "label": 0},
    {"context": "and there was", "choices": ["light.", "form", "the face"], "label": 0},
]

TASK_YAML = """task: kiln_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
"""


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        print(p.stdout[-6000:])
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expect(cond, what):
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def kiln_loglikelihood(kiln, model_dir, tokens, ctxlen, work):
    """Sum of log p(tokens[t] | tokens[<t]) for t >= ctxlen, from kiln eval's dense forward."""
    out = os.path.join(work, "logits.npy")
    run([kiln, "--threads", "1", "eval", "--model", model_dir, "--tokens", ",".join(map(str, tokens)),
         "--dump-logits", out])
    logits = np.load(out).astype(np.float64)  # (T, V)
    mx = logits.max(axis=1, keepdims=True)
    logp = logits - mx - np.log(np.exp(logits - mx).sum(axis=1, keepdims=True))
    return float(sum(logp[t - 1, tokens[t]] for t in range(ctxlen, len(tokens))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "corpus.txt"), "w") as f:
            f.write(TEXT)
        model_dir = os.path.join(work, "tiny")
        run([args.kiln, "--threads", "1", "train", "--preset", "llama-tiny", "--text", os.path.join(work, "corpus.txt"),
             "--data", os.path.join(work, "data"), "--vocab-size", "300", "--steps", "20", "--batch", "4", "--seq", "32",
             "--eval-every", "0", "--out", model_dir])
        # The model's own tokenizer.json, loaded by transformers as a plain fast tokenizer (lm-eval
        # encodes context and continuation with it and sends token ids).
        tok_dir = os.path.join(work, "tokenizer")
        os.makedirs(tok_dir)
        with open(os.path.join(model_dir, "tokenizer.json")) as f, open(os.path.join(tok_dir, "tokenizer.json"), "w") as g:
            g.write(f.read())
        with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                       "model_max_length": 256}, f)
        task_dir = os.path.join(work, "tasks")
        os.makedirs(task_dir)
        data = os.path.join(work, "mc.jsonl")
        with open(data, "w") as f:
            for ex in EXAMPLES:
                f.write(json.dumps(ex) + "\n")
        with open(os.path.join(task_dir, "kiln_tiny_mc.yaml"), "w") as f:
            f.write(TASK_YAML.format(data=data))

        port = free_port()
        server = subprocess.Popen([args.kiln, "--threads", "1", "serve", "--model", model_dir, "--port", str(port),
                                   "--served-model-name", "tiny", "--kv-cache-mem", "64M"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(200):
                try:
                    urllib.request.urlopen(base + "/health", timeout=1)
                    break
                except OSError:
                    if server.poll() is not None:
                        raise SystemExit("kiln serve exited:\n" + server.stdout.read())
                    time.sleep(0.05)
            env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       HF_DATASETS_CACHE=os.path.join(work, "hf_datasets"), TOKENIZERS_PARALLELISM="false")
            out_dir = os.path.join(work, "out")
            cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
                   f"model=tiny,base_url={base}/v1/completions,tokenizer_backend=huggingface,tokenizer={tok_dir},"
                   "num_concurrent=1,max_retries=1,tokenized_requests=True",
                   "--tasks", "kiln_tiny_mc", "--include_path", task_dir, "--batch_size", "1",
                   "--output_path", out_dir, "--log_samples"]
            print("$ " + " ".join(cmd))
            log = run(cmd, env=env)
            print("\n".join(line for line in log.splitlines() if "|" in line))  # lm-eval's result table
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()

        samples = glob.glob(os.path.join(out_dir, "**", "samples_kiln_tiny_mc_*.jsonl"), recursive=True)
        expect(len(samples) == 1, f"lm-eval wrote its per-example samples ({samples})")
        with open(samples[0]) as f:
            rows = [json.loads(line) for line in f]
        expect(len(rows) == len(EXAMPLES), f"lm-eval scored all {len(EXAMPLES)} examples")
        tk = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(tok_dir, "tokenizer.json"))
        worst = 0.0
        lm_correct = kiln_correct = 0
        for row in sorted(rows, key=lambda r: r["doc_id"]):
            ex = EXAMPLES[row["doc_id"]]
            lls = []
            args_ = row["arguments"]  # {"gen_args_0": {"arg_0": context, "arg_1": continuation}, ...}
            pairs = [(a["arg_0"], a["arg_1"]) for a in args_.values()] if isinstance(args_, dict) else args_
            for (context, continuation), resp in zip(pairs, row["resps"]):
                while isinstance(resp, (list, tuple)):  # [[loglikelihood, is_greedy]]
                    resp = resp[0]
                ll_lm = float(resp)
                # lm-eval's split: the whole text's ids, the context's ids as the prefix.
                whole = tk(context + continuation, add_special_tokens=False)["input_ids"]
                ctx = tk(context, add_special_tokens=False)["input_ids"]
                ll_kiln = kiln_loglikelihood(args.kiln, model_dir, whole, len(ctx), work)
                worst = max(worst, abs(ll_lm - ll_kiln))
                print(f"  doc {row['doc_id']} {continuation!r:24} lm-eval {ll_lm:+.6f}  kiln eval {ll_kiln:+.6f}  "
                      f"diff {abs(ll_lm - ll_kiln):.2e}")
                expect(abs(ll_lm - ll_kiln) <= TOLERANCE,
                       f"doc {row['doc_id']} {continuation!r}: lm-eval's loglikelihood equals kiln eval's")
                lls.append(ll_kiln)
            kiln_correct += int(int(np.argmax(lls)) == ex["label"])
            lm_correct += int(row["acc"])
        expect(lm_correct == kiln_correct, f"lm-eval's accuracy ({lm_correct}/{len(rows)}) is kiln eval's argmax's")
        print(f"max |lm-eval - kiln eval| = {worst:.2e} nats (tolerance {TOLERANCE})")
    print("PASS lm_eval_check")


if __name__ == "__main__":
    main()
