#!/usr/bin/env python3
"""PyTorch cross-check data for kiln's non-GEMM kernels.

Computes forward and backward of LayerNorm, RMSNorm (HF LlamaRMSNorm), softmax, GELU (tanh),
SiLU, SwiGLU, RoPE (HF rotate_half), embedding + positional add, cross-entropy
(ignore_index=-1) and torch.optim.AdamW on small fixed seeded inputs, and writes
tests/reference/kernels_torch.json (< 200 KB), which tests/kernels/test_torch_reference.cpp
reads; the C++ test never needs Python. Everything but AdamW is computed in float64 from fp32
inputs (an exact reference); AdamW runs torch's own fp32 optimizer.

Run:  python3 tests/reference/kernels_torch.py     (PyPI torch 2.x or Debian python3-torch)
"""
import json
import math
import os
import struct
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("kernels_torch.py: torch is not importable; keeping the committed JSON", file=sys.stderr)
    sys.exit(0)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels_torch.json")


def f32(t):
    """A tensor as a flat list of Python floats holding fp32 values."""
    return [struct.unpack("f", struct.pack("f", v))[0] for v in t.detach().reshape(-1).tolist()]


def ints(t):
    return [int(v) for v in t.reshape(-1).tolist()]


def rand(gen, *shape, lo=-1.0, hi=1.0):
    """fp32 uniform inputs, returned as float64 tensors holding exactly those fp32 values."""
    x = torch.rand(*shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo
    return x.to(torch.float64)


def leaf(x):
    return x.clone().requires_grad_(True)


def layernorm(gen):
    rows, cols = 4, 33
    x, w, b = rand(gen, rows, cols, lo=1.0, hi=5.0), rand(gen, cols, lo=0.5, hi=1.5), rand(gen, cols)
    dy = rand(gen, rows, cols)
    xl, wl, bl = leaf(x), leaf(w), leaf(b)
    y = F.layer_norm(xl, (cols,), wl, bl, eps=1e-5)
    y.backward(dy)
    return {"op": "layernorm", "rows": rows, "cols": cols, "eps": 1e-5,
            "x": f32(x), "weight": f32(w), "bias": f32(b), "dy": f32(dy),
            "y": f32(y), "dx": f32(xl.grad), "dweight": f32(wl.grad), "dbias": f32(bl.grad)}


def rmsnorm(gen):
    rows, cols = 4, 33
    x, w, dy = rand(gen, rows, cols, lo=-2, hi=2), rand(gen, cols, lo=0.5, hi=1.5), rand(gen, rows, cols)
    xl, wl = leaf(x), leaf(w)
    # HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * weight
    y = wl * (xl * torch.rsqrt(xl.pow(2).mean(-1, keepdim=True) + 1e-6))
    y.backward(dy)
    return {"op": "rmsnorm", "rows": rows, "cols": cols, "eps": 1e-6, "x": f32(x), "weight": f32(w),
            "dy": f32(dy), "y": f32(y), "dx": f32(xl.grad), "dweight": f32(wl.grad)}


def softmax(gen):
    rows, cols = 4, 65
    x, dy = rand(gen, rows, cols, lo=-8, hi=8), rand(gen, rows, cols)
    x[1] += 100.0
    x = x.to(torch.float32).to(torch.float64)  # the shifted row rounded to the fp32 it is stored as
    xl = leaf(x)
    y = F.softmax(xl, dim=-1)
    y.backward(dy)
    return {"op": "softmax", "rows": rows, "cols": cols, "x": f32(x), "dy": f32(dy), "y": f32(y),
            "dx": f32(xl.grad)}


def activations(gen):
    n = 129
    x, up, dy = rand(gen, n, lo=-6, hi=6), rand(gen, n, lo=-2, hi=2), rand(gen, n)
    out = {"op": "activations", "n": n, "x": f32(x), "up": f32(up), "dy": f32(dy)}
    for name, fn in (("gelu", lambda t: F.gelu(t, approximate="tanh")), ("silu", F.silu)):
        xl = leaf(x)
        y = fn(xl)
        y.backward(dy)
        out[name], out["d" + name] = f32(y), f32(xl.grad)
    gl, ul = leaf(x), leaf(up)
    y = F.silu(gl) * ul
    y.backward(dy)
    out["swiglu"], out["swiglu_dgate"], out["swiglu_dup"] = f32(y), f32(gl.grad), f32(ul.grad)
    return out


def rope(gen):
    b, t, h, d, offset, theta = 2, 5, 3, 16, 3, 10000.0
    x, dy = rand(gen, b, t, h, d), rand(gen, b, t, h, d)
    # Hugging Face Llama: inv_freq over even indices, emb = cat(freqs, freqs), rotate_half
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    pos = torch.arange(offset, offset + t, dtype=torch.float64)
    emb = torch.cat([torch.outer(pos, inv_freq)] * 2, dim=-1)  # (T, D)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]

    def rotate_half(v):
        v1, v2 = v[..., : d // 2], v[..., d // 2:]
        return torch.cat((-v2, v1), dim=-1)

    xl = leaf(x)
    y = xl * cos + rotate_half(xl) * sin
    y.backward(dy)
    return {"op": "rope", "batch": b, "seq_len": t, "n_heads": h, "head_dim": d,
            "pos_offset": offset, "theta": theta, "x": f32(x), "dy": f32(dy), "y": f32(y),
            "dx": f32(xl.grad)}


def embedding(gen):
    vocab, cols, batch, seq = 11, 24, 2, 7
    w, wpe = rand(gen, vocab, cols), rand(gen, seq, cols)
    ids = torch.randint(0, 4, (batch, seq), generator=gen)  # ids 0..3 only: many repeats
    dy = rand(gen, batch, seq, cols)
    wl, pl = leaf(w), leaf(wpe)
    y = F.embedding(ids, wl) + pl[None]
    y.backward(dy)
    return {"op": "embedding", "vocab": vocab, "cols": cols, "batch": batch, "seq_len": seq,
            "ids": ints(ids), "weight": f32(w), "wpe": f32(wpe), "dy": f32(dy), "y": f32(y),
            "dweight": f32(wl.grad), "dwpe": f32(pl.grad)}


def cross_entropy(gen):
    cases = []
    for rows, vocab in ((6, 65), (3, 257)):
        x = rand(gen, rows, vocab, lo=-5, hi=5)
        targets = torch.randint(0, vocab, (rows,), generator=gen)
        targets[2] = -1
        dl = rand(gen, rows, lo=0.1, hi=1.0)
        xl = leaf(x)
        loss = F.cross_entropy(xl, targets, ignore_index=-1, reduction="none")
        loss.backward(dl)
        cases.append({"op": "cross_entropy", "rows": rows, "vocab": vocab, "logits": f32(x),
                      "targets": ints(targets), "dlosses": f32(dl), "losses": f32(loss),
                      "dlogits": f32(xl.grad)})
    return cases


def adamw(gen):
    n, steps = 37, 4
    lr, betas, eps, wd = 1e-2, (0.9, 0.999), 1e-8, 0.1
    p0 = torch.rand(n, generator=gen, dtype=torch.float32) * 2 - 1
    grads = [torch.rand(n, generator=gen, dtype=torch.float32) * 2 - 1 for _ in range(steps)]
    p = p0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    st = opt.state[p]
    return {"op": "adamw", "n": n, "steps": steps, "lr": lr, "beta1": betas[0], "beta2": betas[1],
            "eps": eps, "weight_decay": wd, "param0": f32(p0), "grads": [f32(g) for g in grads],
            "param": f32(p), "m": f32(st["exp_avg"]), "v": f32(st["exp_avg_sq"])}


def main():
    gen = torch.Generator().manual_seed(20240611)
    cases = [layernorm(gen), rmsnorm(gen), softmax(gen), activations(gen), rope(gen),
             embedding(gen), *cross_entropy(gen), adamw(gen)]
    doc = {"generator": "tests/reference/kernels_torch.py", "torch": torch.__version__,
           "note": "float64 from fp32 inputs except adamw (torch.optim.AdamW in fp32)",
           "cases": cases}
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    # fp32 values need 9 significant digits; shorten Python's 17-digit float reprs
    text = json.dumps(json.loads(text, parse_float=lambda s: float("%.9g" % float(s))),
                      separators=(",", ":"))
    with open(OUT, "w") as f:
        f.write(text + "\n")
    print(f"wrote {OUT}: {len(text) / 1024:.1f} KiB, {len(cases)} cases, torch {torch.__version__}")


if __name__ == "__main__":
    main()
