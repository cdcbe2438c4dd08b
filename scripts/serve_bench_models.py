#!/usr/bin/env python3
"""Model directories for the serving benchmark (docs/results/serving-*.md).

llama-tiny-1k: the trained runs/llama-tiny (kiln train) with its context raised to 1024 so a
512-token prompt fits (Llama has no learned positions: RoPE extends; speed is what is measured).
w2-s: BENCH.md's W2-S Llama shape (d 768, 12 layers, 12/4 heads, FFN 2048, vocab 32000) with
random N(0, 0.02) weights (seeded) and the llama-tiny tokenizer (4096 ids; the LM head is set so
only those are sampled); speed does not depend on values.

Run:  /usr/bin/python3 scripts/serve_bench_models.py OUT_DIR
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(out):
    src = os.path.join(ROOT, "runs", "llama-tiny")
    tiny = os.path.join(out, "llama-tiny-1k")
    os.makedirs(tiny, exist_ok=True)
    for f in ("model.safetensors", "tokenizer.json"):
        shutil.copy(os.path.join(src, f), os.path.join(tiny, f))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["max_position_embeddings"] = 1024
    json.dump(cfg, open(os.path.join(tiny, "config.json"), "w"), indent=2)

    w2s = os.path.join(out, "w2-s")
    os.makedirs(w2s, exist_ok=True)
    d, layers, heads, kv, ffn, vocab, ctx = 768, 12, 12, 4, 2048, 32000, 2048
    hd = d // heads
    c = dict(cfg)
    c.update({"vocab_size": vocab, "hidden_size": d, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "intermediate_size": ffn, "max_position_embeddings": ctx,
              "tie_word_embeddings": False})
    json.dump(c, open(os.path.join(w2s, "config.json"), "w"), indent=2)
    rng = np.random.default_rng(1)
    t = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,), "lm_head.weight": (vocab, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                  p + "self_attn.q_proj.weight": (heads * hd, d), p + "self_attn.k_proj.weight": (kv * hd, d),
                  p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.o_proj.weight": (d, heads * hd),
                  p + "mlp.gate_proj.weight": (ffn, d), p + "mlp.up_proj.weight": (ffn, d),
                  p + "mlp.down_proj.weight": (d, ffn)})
    tensors = {k: (np.ones(s, np.float32) if len(s) == 1 else (rng.standard_normal(s, np.float32) * 0.02))
               for k, s in t.items()}
    # The tokenizer has 4096 ids: LM-head rows past it are zero and the others N(0, 1), so sampled
    # ids stay inside the tokenizer (logits of std ~28 against 0) and every token has text.
    # Same shape and GEMM work as W2-S.
    tok_vocab = 4096
    head = tensors["lm_head.weight"]
    head[tok_vocab:] = 0.0
    head[:tok_vocab] = rng.standard_normal((tok_vocab, d), np.float32)
    save_file(tensors, os.path.join(w2s, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(src, "tokenizer.json"), os.path.join(w2s, "tokenizer.json"))
    print(f"wrote {tiny} and {w2s}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/kiln-serve-models")
