#!/usr/bin/env python3
"""Whole-model PyTorch reference for kiln's transformer (GPT-2 and Llama), forward and backward.

For each family this builds a W1a-width model (d 384, 6 heads; 2 layers, B 2, T 32) whose
weights come from a counter-based hash that tests/model/test_torch_model.cpp computes
identically (so no weights are stored), runs one forward/backward in float64 on fixed tokens
and targets (two targets are -1, ignored) and writes tests/reference/model_torch_<family>.safetensors:

  tokens, targets            I32 (B, T)
  loss                       F64 (1,)    mean cross-entropy over the valid targets
  logits                     F32 (B, T, V)
  param_sum.<name>           F64 (1,)    sum of the weights (catches a weight-formula mismatch)
  grad.<name>                F32         full gradient, kiln layout, when numel <= 65536
  grad_rows.<name>           F32 (R, in) evenly spaced rows of a larger matrix's gradient,
  grad_row_idx.<name>        I64 (R,)    with their indices
  grad_norm.<name>           F64 (1,)    Frobenius norm of the full gradient
  grad_sketch.<name>         F64 (32,)   projections of the full gradient on 32 hashed +-1
                                         vectors: ||S(a-b)|| / ||S b|| estimates ||a-b|| / ||b||,
                                         an error anywhere in the tensor shows
Names are Hugging Face's; "kiln layout" is nn.Linear's (out, in), so GPT-2's Conv1D gradients
are the transpose of HF's storage. The metadata holds the HF config.json that kiln parses.

The reference is Hugging Face `transformers` (GPT2LMHeadModel / LlamaForCausalLM, float64)
when installed, checked against the plain-torch model below; without transformers the plain
model is the reference. Run:  /usr/bin/python3 tests/reference/model_torch.py
"""
import json
import math
import os
import struct
import sys

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("model_torch.py: torch is not importable; keeping the committed dumps", file=sys.stderr)
    sys.exit(0)

HERE = os.path.dirname(os.path.abspath(__file__))
B, T = 2, 32
FULL_LIMIT = 65536   # gradients up to this many elements are stored whole
ROW_BUDGET = 16384   # elements of sampled rows per larger matrix
SKETCH_K = 32
IGNORED = [(0, 5), (1, T - 1)]  # (batch, position) targets set to -1

GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 65, "n_embd": 384,
        "n_layer": 2, "n_head": 6, "n_inner": 1536, "n_positions": T, "n_ctx": T,
        "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "tie_word_embeddings": True,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "torch_dtype": "float32"}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96, "hidden_size": 384,
         "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
         "intermediate_size": 1024, "max_position_embeddings": T, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
         "attention_bias": False, "torch_dtype": "float32"}

# ---- the shared weight and sketch formulas (mirrored in tests/model/test_torch_model.cpp) ----
M64 = (1 << 64) - 1


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def mix(x):
    """splitmix64's finalizer on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def counters(seed, n):
    with np.errstate(over="ignore"):
        return np.uint64(seed) + np.arange(n, dtype=np.uint64)


def weight_scale(name, rank):
    """(shift, scale): w = shift + scale * r with r uniform in [-1, 1); powers of two keep fp32 exact."""
    if "norm" in name or ".ln_" in name:
        return (1.0, 0.25) if name.endswith(".weight") else (0.0, 0.125)
    if rank == 1:
        return 0.0, 0.125                      # biases
    if name.endswith("wpe.weight"):
        return 0.0, 0.0625
    if name.endswith("wte.weight") or name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        return 0.0, 0.125
    return 0.0, 0.0625                         # projections


def make_weight(name, shape):
    """float32 array in kiln layout: shift + scale * (2u - 1), u = (mix(fnv(name) + i) >> 40) / 2^24."""
    n = int(np.prod(shape))
    u = (mix(counters(fnv1a64(name), n)) >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    r = np.float32(2.0) * u - np.float32(1.0)
    shift, scale = weight_scale(name, len(shape))
    w = r * np.float32(scale)
    if shift != 0.0:
        w = w + np.float32(shift)
    return w.astype(np.float32).reshape(shape)


def sketch_signs(name, n):
    """(K, n) float64 +-1: sign k of element i is bit k of mix(mix(fnv(name)) + i) (one hash, K <= 64 signs)."""
    seed = int(mix(np.array([fnv1a64(name)], dtype=np.uint64))[0])
    h = mix(counters(seed, n))
    out = np.empty((SKETCH_K, n), dtype=np.float64)
    for k in range(SKETCH_K):
        out[k] = np.where((h >> np.uint64(k)) & np.uint64(1) == 1, 1.0, -1.0)
    return out


# ---- parameter lists in kiln's order and layout (out, in) ----
def gpt2_params(c):
    C, V, F_, L = c["n_embd"], c["vocab_size"], c["n_inner"], c["n_layer"]
    p = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (c["n_positions"], C))]
    for i in range(L):
        h = f"transformer.h.{i}."
        p += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
              (h + "attn.c_attn.weight", (3 * C, C)), (h + "attn.c_attn.bias", (3 * C,)),
              (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
              (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
              (h + "mlp.c_fc.weight", (F_, C)), (h + "mlp.c_fc.bias", (F_,)),
              (h + "mlp.c_proj.weight", (C, F_)), (h + "mlp.c_proj.bias", (C,))]
    return p + [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]


def llama_params(c):
    C, V, F_, L = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["num_hidden_layers"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = C // H
    p = [("model.embed_tokens.weight", (V, C))]
    for i in range(L):
        h = f"model.layers.{i}."
        p += [(h + "input_layernorm.weight", (C,)), (h + "self_attn.q_proj.weight", (H * D, C)),
              (h + "self_attn.k_proj.weight", (KV * D, C)), (h + "self_attn.v_proj.weight", (KV * D, C)),
              (h + "self_attn.o_proj.weight", (C, H * D)), (h + "post_attention_layernorm.weight", (C,)),
              (h + "mlp.gate_proj.weight", (F_, C)), (h + "mlp.up_proj.weight", (F_, C)),
              (h + "mlp.down_proj.weight", (C, F_))]
    p.append(("model.norm.weight", (C,)))
    if not c["tie_word_embeddings"]:
        p.append(("lm_head.weight", (V, C)))
    return p


# ---- plain-torch models (float64), weights in kiln layout ----
def causal_attention(q, k, v):
    """q (B, H, T, D), k and v (B, H, T, D) -> (B, T, H·D)."""
    Tq, D = q.shape[2], q.shape[3]
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.ones(Tq, Tq, dtype=torch.bool).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    y = torch.softmax(s, dim=-1) @ v
    return y.transpose(1, 2).reshape(q.shape[0], Tq, -1)


def gpt2_forward(c, W, tokens):
    C, H, eps = c["n_embd"], c["n_head"], c["layer_norm_epsilon"]
    Bn, Tn = tokens.shape
    x = W["transformer.wte.weight"][tokens] + W["transformer.wpe.weight"][:Tn]
    for i in range(c["n_layer"]):
        h = f"transformer.h.{i}."
        n = F.layer_norm(x, (C,), W[h + "ln_1.weight"], W[h + "ln_1.bias"], eps)
        qkv = n @ W[h + "attn.c_attn.weight"].T + W[h + "attn.c_attn.bias"]
        q, k, v = (t.reshape(Bn, Tn, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=-1))
        x = x + causal_attention(q, k, v) @ W[h + "attn.c_proj.weight"].T + W[h + "attn.c_proj.bias"]
        n = F.layer_norm(x, (C,), W[h + "ln_2.weight"], W[h + "ln_2.bias"], eps)
        a = F.gelu(n @ W[h + "mlp.c_fc.weight"].T + W[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + a @ W[h + "mlp.c_proj.weight"].T + W[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    return x @ W["transformer.wte.weight"].T


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama_forward(c, W, tokens):
    C, H, KV, eps = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    D = C // H
    Bn, Tn = tokens.shape
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.arange(Tn, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()  # (T, D)

    def rms(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    x = W["model.embed_tokens.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        h = f"model.layers.{i}."
        n = rms(x, W[h + "input_layernorm.weight"])
        q = (n @ W[h + "self_attn.q_proj.weight"].T).reshape(Bn, Tn, H, D).transpose(1, 2)
        k = (n @ W[h + "self_attn.k_proj.weight"].T).reshape(Bn, Tn, KV, D).transpose(1, 2)
        v = (n @ W[h + "self_attn.v_proj.weight"].T).reshape(Bn, Tn, KV, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)  # q head j uses kv head j // (H/KV)
        x = x + causal_attention(q, k, v) @ W[h + "self_attn.o_proj.weight"].T
        n = rms(x, W[h + "post_attention_layernorm.weight"])
        a = F.silu(n @ W[h + "mlp.gate_proj.weight"].T) * (n @ W[h + "mlp.up_proj.weight"].T)
        x = x + a @ W[h + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


def run_plain(family, c, weights, tokens, targets):
    W = {n: torch.tensor(w, dtype=torch.float64, requires_grad=True) for n, w in weights.items()}
    logits = (gpt2_forward if family == "gpt2" else llama_forward)(c, W, tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    loss.backward()
    return loss.item(), logits.detach(), {n: t.grad.detach() for n, t in W.items()}


# ---- Hugging Face transformers (float64) ----
def gpt2_conv1d(name):
    return name.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"))


def run_hf(family, c, weights, tokens, targets):
    import transformers
    if family == "gpt2":
        cfg = transformers.GPT2Config(**{k: v for k, v in c.items() if k not in ("architectures", "torch_dtype")})
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(**{k: v for k, v in c.items() if k not in ("architectures", "torch_dtype")},
                                       attn_implementation="eager")
        model = transformers.LlamaForCausalLM(cfg)
    model = model.double().eval()  # eval: no dropout (all zero anyway); gradients still flow
    state = {}
    for n, w in weights.items():
        t = torch.tensor(w, dtype=torch.float64)
        state[n] = t.T.contiguous() if family == "gpt2" and gpt2_conv1d(n) else t
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith(("attn.bias", "attn.masked_bias")) and m != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if c["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    logits = model(input_ids=tokens).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    loss.backward()
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad.detach()
        grads[n] = g.T.contiguous() if family == "gpt2" and gpt2_conv1d(n) else g
    return loss.item(), logits.detach(), grads, transformers.__version__


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# ---- safetensors writer (the format is a u64 header length, a JSON header, then raw data) ----
def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    codes = {np.float32: "F32", np.float64: "F64", np.int32: "I32", np.int64: "I64"}
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        data = arr.tobytes()
        header[name] = {"dtype": codes[arr.dtype.type], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def dump(family, c, params):
    rng = np.random.RandomState(20240 + (family == "llama"))
    tokens = rng.randint(0, c["vocab_size"], size=(B, T)).astype(np.int32)
    targets = rng.randint(0, c["vocab_size"], size=(B, T)).astype(np.int32)
    for b, t in IGNORED:
        targets[b, t] = -1
    weights = {n: make_weight(n, s) for n, s in params}
    tok, tgt = torch.tensor(tokens, dtype=torch.long), torch.tensor(targets, dtype=torch.long)

    loss, logits, grads = run_plain(family, c, weights, tok, tgt)
    reference = f"plain torch {torch.__version__} (float64)"
    try:
        hf_loss, hf_logits, hf_grads, hf_version = run_hf(family, c, weights, tok, tgt)
    except ImportError:
        print(f"{family}: transformers not installed; the plain-torch model is the reference")
    else:
        worst = max(rel(hf_grads[n].numpy(), grads[n].numpy()) for n, _ in params)
        print(f"{family}: transformers {hf_version} vs plain torch: loss {abs(hf_loss - loss) / abs(loss):.2e}, "
              f"logits {rel(hf_logits.numpy(), logits.numpy()):.2e}, worst gradient {worst:.2e}")
        if worst > 1e-6 or rel(hf_logits.numpy(), logits.numpy()) > 1e-6:
            raise SystemExit(f"{family}: transformers and the plain-torch model disagree")
        loss, logits, grads = hf_loss, hf_logits, hf_grads
        reference = f"transformers {hf_version} {c['architectures'][0]} on torch {torch.__version__} (float64)"

    out = {"tokens": tokens, "targets": targets, "loss": np.array([loss]),
           "logits": logits.numpy().astype(np.float32)}
    for name, shape in params:
        g = grads[name].numpy().astype(np.float64)
        assert g.shape == tuple(shape), (name, g.shape, shape)
        out["param_sum." + name] = np.array([weights[name].astype(np.float64).sum()])
        if g.size <= FULL_LIMIT:
            out["grad." + name] = g.astype(np.float32)
            continue
        rows_n = min(shape[0], max(8, ROW_BUDGET // shape[1]))
        idx = np.array([(2 * j + 1) * shape[0] // (2 * rows_n) for j in range(rows_n)], dtype=np.int64)
        out["grad_rows." + name] = g[idx].astype(np.float32)
        out["grad_row_idx." + name] = idx
        out["grad_norm." + name] = np.array([np.linalg.norm(g)])
        out["grad_sketch." + name] = sketch_signs(name, g.size) @ g.reshape(-1)
    meta = {"config": json.dumps({k: v for k, v in c.items() if "pdrop" not in k}), "reference": reference,
            "generator": "tests/reference/model_torch.py", "batch": str(B), "seq_len": str(T),
            "sketch_k": str(SKETCH_K)}
    path = os.path.join(HERE, f"model_torch_{family}.safetensors")
    write_safetensors(path, out, meta)
    print(f"wrote {path}: {os.path.getsize(path) / 1024:.0f} KiB, loss {loss:.6f}; reference: {reference}")


def main():
    torch.manual_seed(0)
    dump("gpt2", GPT2, gpt2_params(GPT2))
    dump("llama", LLAMA, llama_params(LLAMA))


if __name__ == "__main__":
    main()
