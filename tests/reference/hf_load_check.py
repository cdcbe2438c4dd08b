#!/usr/bin/env python3
"""Hugging Face `transformers` loads checkpoints that kiln saves and gives kiln's logits.

For GPT-2 (preset w1a), Llama (preset llama-tiny) and Mixtral (preset llama-moe-tiny): `kiln train` runs two steps on a small
text and saves the model directory (config.json + model.safetensors + tokenizer.json); `kiln
eval --dump-logits` writes kiln's logits for fixed token ids; GPT2LMHeadModel /
LlamaForCausalLM / MixtralForCausalLM.from_pretrained(dir) run the same ids in fp32. Passes when the relative error
||kiln - hf|| / ||hf|| of the logits is <= 1e-4 and the argmax agrees at every position.
Exit 77 (CTest's SKIP_RETURN_CODE) when torch or transformers is not installed.

Run:  /usr/bin/python3 tests/reference/hf_load_check.py [--kiln build/kiln] [--keep DIR]
"""
import argparse
import os
import sys
import tempfile

from kiln_fixture import run, train_tiny

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_REL_ERROR = 1e-4

try:
    import numpy as np
    import torch
    import transformers
except ImportError as e:
    print(f"SKIP hf_load_check: {e.name} is not installed "
          f"(/usr/bin/python3 -m pip install --break-system-packages 'transformers<4.40' safetensors)")
    sys.exit(SKIP)


def check(kiln, work, preset, arch, text):
    out = train_tiny(kiln, work, preset=preset, name=preset, text=text)
    vocab = int(__import__("json").load(open(os.path.join(out, "config.json")))["vocab_size"])
    tokens = [(7 + 37 * i * i + 11 * i) % vocab for i in range(24)]
    npy = os.path.join(work, f"{preset}_logits.npy")
    run([kiln, "--threads", "1", "eval", "--model", out, "--tokens", ",".join(map(str, tokens)), "--dump-logits", npy])
    mine = np.load(npy).astype(np.float64)

    cls = getattr(transformers, arch)
    model = cls.from_pretrained(out, torch_dtype=torch.float32).eval()
    if type(model).__name__ != arch:
        raise SystemExit(f"{out} loaded as {type(model).__name__}, not {arch}")
    with torch.no_grad():
        hf = model(torch.tensor([tokens])).logits[0].double().numpy()
    if hf.shape != mine.shape:
        raise SystemExit(f"{preset}: logits shape kiln {mine.shape} vs transformers {hf.shape}")
    rel = float(np.linalg.norm(mine - hf) / np.linalg.norm(hf))
    argmax_ok = bool((mine.argmax(-1) == hf.argmax(-1)).all())
    ok = rel <= MAX_REL_ERROR and argmax_ok
    print(f"{'ok  ' if ok else 'FAIL'} {arch:16s} ({preset}, vocab {vocab}): {len(tokens)} tokens, "
          f"logits relative error {rel:.2e}, argmax {'equal' if argmax_ok else 'DIFFERS'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--keep", help="work in this directory and keep it (default: a temporary one)")
    a = ap.parse_args()
    if not os.access(a.kiln, os.X_OK):
        raise SystemExit(f"{a.kiln} is not built")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or tmp
        os.makedirs(work, exist_ok=True)
        parts = [open(os.path.join(ROOT, "tests", "reference", "data", f), encoding="utf-8").read()
                 for f in ("tokenizer_corpus.txt", "multilingual.txt")]
        text = "\n".join(parts) * 20
        ok = check(a.kiln, work, "w1a", "GPT2LMHeadModel", text)
        ok = check(a.kiln, work, "llama-tiny", "LlamaForCausalLM", text) and ok
        ok = check(a.kiln, work, "llama-moe-tiny", "MixtralForCausalLM", text) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
