#!/usr/bin/env python3
"""kiln computes the model a Hugging Face config.json describes: RoPE scalings, biases, GPT-2's attention scales.

For each case, transformers builds a tiny random LlamaForCausalLM / GPT2LMHeadModel with one
config option set (RoPE linear, llama3 and yarn scalings; Llama attention_bias and mlp_bias;
GPT-2 scale_attn_weights=False and scale_attn_by_inverse_layer_idx=True; and the plain default
LlamaConfig / GPT2Config with every key transformers 5 writes), saves it with save_pretrained()
(config.json + model.safetensors), and `kiln eval --model DIR --dump-logits` runs fixed token
ids through it; transformers runs the same ids in fp32; and the config.json kiln writes back
(through `kiln quantize`) must mean the same model to transformers. Passes when the relative error
||kiln - hf|| / ||hf|| of the logits is <= 1e-4 and the argmax agrees at every position. A
config with a setting kiln does not implement (a rope_type, sliding_window, head_dim, an
unknown key) must be refused with an error naming it. And the config.json `kiln train` saves
carries the tokenizer's end-of-text id as bos_token_id and eos_token_id, as transformers reads
them. Exit 77 (CTest's SKIP_RETURN_CODE) when torch or transformers is not installed.

Run:  python3 tests/reference/hf_config_check.py [--kiln build/kiln] [--keep DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from kiln_fixture import train_tiny

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_REL_ERROR = 1e-4
VOCAB = 97
T = 40  # tokens per check: past original_max_position_embeddings of the scaled cases

try:
    import numpy as np
    import torch
    import transformers
except ImportError as e:
    print(f"SKIP hf_config_check: {e.name} is not installed")
    sys.exit(SKIP)


def llama(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    base.update(kw)
    return transformers.LlamaConfig(**base)


def gpt2(**kw):
    base = dict(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64)
    base.update(kw)
    return transformers.GPT2Config(**base)


# (name, config, what the file must show): each config sets one option kiln must implement.
CASES = [
    ("llama default (transformers 5 LlamaConfig keys)", lambda: llama(), None),
    ("gpt2 default (transformers 5 GPT2Config keys)", lambda: gpt2(), None),
    ("llama rope linear x2", lambda: llama(rope_parameters={"rope_type": "linear", "rope_theta": 5000.0,
                                                            "factor": 2.0}), "linear"),
    ("llama rope llama3", lambda: llama(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 32}), "llama3"),
    ("llama rope yarn (derived attention factor)",
     lambda: llama(max_position_embeddings=128,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 32}), "yarn"),
    ("llama rope yarn (betas, mscale ratio, no truncation)",
     lambda: llama(max_position_embeddings=128,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 20000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 32, "beta_fast": 16.0, "beta_slow": 2.0,
                                    "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False}), "yarn"),
    ("llama rope yarn (explicit attention_factor)",
     lambda: llama(max_position_embeddings=128,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                    "original_max_position_embeddings": 64, "attention_factor": 1.3}), "yarn"),
    ("llama attention_bias", lambda: llama(attention_bias=True), "attention_bias"),
    ("llama mlp_bias", lambda: llama(mlp_bias=True), "mlp_bias"),
    ("gpt2 scale_attn_weights=false", lambda: gpt2(scale_attn_weights=False), "scale_attn_weights"),
    ("gpt2 scale_attn_by_inverse_layer_idx", lambda: gpt2(scale_attn_by_inverse_layer_idx=True),
     "scale_attn_by_inverse_layer_idx"),
]

# (name, edit of a saved default Llama config.json, text the error must contain)
REFUSED = [
    ("rope_type dynamic", lambda j: j.update(rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                              "rope_theta": 10000.0}), "dynamic"),
    ("sliding_window", lambda j: j.update(sliding_window=16), "sliding_window"),
    ("head_dim decoupled", lambda j: j.update(head_dim=16), "head_dim"),
    ("hidden_act gelu", lambda j: j.update(hidden_act="gelu"), "hidden_act"),
    ("an unknown key", lambda j: j.update(use_magic_attention=True), "use_magic_attention"),
]


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if expect_ok and p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p


def save(cfg, out):
    torch.manual_seed(0)
    cls = transformers.LlamaForCausalLM if cfg.model_type == "llama" else transformers.GPT2LMHeadModel
    model = cls(cfg).eval()
    with torch.no_grad():  # larger than the 0.02 init, biases non-zero: every option carries signal
        for p in model.parameters():
            p.add_(0.15 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    return model


def check(kiln, work, i, name, make, key):
    out = os.path.join(work, f"case{i}")
    cfg = make()
    model = save(cfg, out)
    written = json.load(open(os.path.join(out, "config.json")))
    if key is not None and key not in json.dumps(written):
        raise SystemExit(f"{name}: transformers did not write {key} into config.json: {written}")
    tokens = [(5 + 31 * t * t + 7 * t) % VOCAB for t in range(T)]
    npy = os.path.join(work, f"case{i}.npy")
    run([kiln, "--threads", "1", "eval", "--model", out, "--tokens", ",".join(map(str, tokens)), "--dump-logits", npy])
    mine = np.load(npy).astype(np.float64)
    with torch.no_grad():
        hf = model(torch.tensor([tokens])).logits[0].double().numpy()
    if hf.shape != mine.shape:
        raise SystemExit(f"{name}: logits shape kiln {mine.shape} vs transformers {hf.shape}")
    rel = float(np.linalg.norm(mine - hf) / np.linalg.norm(hf))
    argmax_ok = bool((mine.argmax(-1) == hf.argmax(-1)).all())
    ok = rel <= MAX_REL_ERROR and argmax_ok
    print(f"{'ok  ' if ok else 'FAIL'} {name:55s} logits relative error {rel:.2e}, "
          f"argmax {'equal' if argmax_ok else 'DIFFERS'}")
    return written_back(kiln, work, i, name, cfg) and ok


def written_back(kiln, work, i, name, cfg):
    """The config.json kiln writes (here through `kiln quantize`, which saves the model's config)
    means the same model to transformers: the same RoPE frequencies and attention factor, biases
    and attention scales."""
    q = os.path.join(work, f"case{i}_kiln")
    run([kiln, "--threads", "1", "quantize", "--model", os.path.join(work, f"case{i}"), "--out", q, "--method", "rtn",
         "--bits", "8", "--group", "0"])
    back = transformers.AutoConfig.from_pretrained(q)
    same = True
    if cfg.model_type == "llama":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        def rope(c):
            t = c.rope_parameters["rope_type"]
            if t == "default":
                base = c.rope_parameters["rope_theta"]
                d = c.hidden_size // c.num_attention_heads
                return (1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float) / d)).tolist(), 1.0
            f, a = ROPE_INIT_FUNCTIONS[t](c, "cpu")
            return f.tolist(), a
        (f0, a0), (f1, a1) = rope(cfg), rope(back)
        same = np.allclose(f0, f1, rtol=1e-6) and abs(a0 - a1) < 1e-9
        same = same and (cfg.attention_bias, cfg.mlp_bias) == (back.attention_bias, back.mlp_bias)
    else:
        same = (cfg.scale_attn_weights, cfg.scale_attn_by_inverse_layer_idx) == \
               (back.scale_attn_weights, back.scale_attn_by_inverse_layer_idx)
    print(f"{'ok  ' if same else 'FAIL'} {name:55s} kiln's config.json read by transformers: "
          f"{'the same model' if same else 'DIFFERS'}")
    return same


def refused(kiln, work, name, edit, needle):
    src = os.path.join(work, "case0")  # the default Llama
    out = os.path.join(work, "refused")
    os.makedirs(out, exist_ok=True)
    j = json.load(open(os.path.join(src, "config.json")))
    edit(j)
    json.dump(j, open(os.path.join(out, "config.json"), "w"))
    st = os.path.join(out, "model.safetensors")
    if not os.path.exists(st):
        os.symlink(os.path.join(src, "model.safetensors"), st)
    p = run([kiln, "--threads", "1", "eval", "--model", out, "--tokens", "1,2,3"], expect_ok=False)
    ok = p.returncode != 0 and needle in p.stdout and "terminate" not in p.stdout
    print(f"{'ok  ' if ok else 'FAIL'} refused: {name:46s} {p.stdout.strip().splitlines()[-1] if p.stdout else ''}")
    return ok


def trained_ids(kiln, work):
    corpus = open(os.path.join(ROOT, "tests", "reference", "data", "tokenizer_corpus.txt"), encoding="utf-8").read()
    out = train_tiny(kiln, work, steps=1, batch=1, seq=16, name="trained", text=corpus * 5)
    cfg = transformers.AutoConfig.from_pretrained(out)
    tok = json.load(open(os.path.join(out, "tokenizer.json"), encoding="utf-8"))
    eot = [t["id"] for t in tok.get("added_tokens", []) if t["content"] == "<|endoftext|>"]
    ok = len(eot) == 1 and cfg.bos_token_id == eot[0] and cfg.eos_token_id == eot[0]
    print(f"{'ok  ' if ok else 'FAIL'} kiln train's config.json: bos_token_id {cfg.bos_token_id}, eos_token_id "
          f"{cfg.eos_token_id}, tokenizer's <|endoftext|> {eot}")
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
    torch.set_num_threads(1)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or tmp
        os.makedirs(work, exist_ok=True)
        for i, (name, make, key) in enumerate(CASES):
            ok = check(a.kiln, work, i, name, make, key) and ok
        for name, edit, needle in REFUSED:
            ok = refused(a.kiln, work, name, edit, needle) and ok
        ok = trained_ids(a.kiln, work) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
