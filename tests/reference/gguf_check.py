#!/usr/bin/env python3
"""llama.cpp's own `gguf` package (PyPI) reads the GGUF files kiln writes, and kiln loads a GGUF
that `gguf` writes, with the same values.

1. A small kiln Llama model directory (config.json, model.safetensors, tokenizer.json) is written
   here with numpy; `kiln convert --type f32|f16|q8_0|q4_0` turns it into GGUF. gguf.GGUFReader
   must find the llama metadata, the gpt2 tokenizer and every tensor with the expected type and
   shape; gguf.quants.dequantize of each tensor (q/k rows un-permuted here, independently of
   kiln) must equal kiln's own dump (`kiln convert --gguf` back to fp32 safetensors) exactly,
   and be close to the original weights. Q8_0/Q4_0 bytes are also compared with gguf.quants'
   own quantizer of the original weights (nearly all blocks must be identical).
2. gguf.GGUFWriter writes a Llama GGUF with F32, F16, Q8_0 and Q4_0 tensors (quantized with
   gguf.quants); `kiln convert --gguf` must give gguf's dequantized values exactly, and
   `kiln eval --model FILE.gguf` must give the same loss as the converted directory.

Exit 77 (CTest's SKIP_RETURN_CODE) when the gguf package (or numpy) is missing.
Run:  /usr/bin/python3 tests/reference/gguf_check.py [--kiln build/kiln] [--keep DIR]
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError as e:
    print(f"SKIP gguf_check: {e.name} is not installed (/usr/bin/python3 -m pip install --break-system-packages gguf)")
    sys.exit(SKIP)

CFG = dict(d=64, layers=2, heads=4, kv_heads=2, ff=96, ctx=64, theta=10000.0, eps=1e-5)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout


# ---- safetensors without the safetensors package -----------------------------------------------
def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", t
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=np.float32).reshape(t["shape"])
    return out


# ---- the model -----------------------------------------------------------------------------------
def llama_names():
    """kiln (HF) name -> llama.cpp name, written out independently of kiln."""
    m = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
         "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    for i in range(CFG["layers"]):
        for hf, gg in per_layer.items():
            m[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    return m


def random_model(vocab, seed):
    rng = np.random.default_rng(seed)
    d, ff, hd = CFG["d"], CFG["ff"], CFG["d"] // CFG["heads"]
    kv = CFG["kv_heads"] * hd
    t = {"model.embed_tokens.weight": rng.normal(0, 0.5, (vocab, d)), "model.norm.weight": 1 + 0.1 * rng.normal(size=d),
         "lm_head.weight": rng.normal(0, 0.2, (vocab, d))}
    for i in range(CFG["layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=d)
        t[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.2, (d, d))
        t[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.2, (kv, d))
        t[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.2, (kv, d))
        t[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.2, (d, d))
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=d)
        t[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.2, (ff, d))
        t[p + "mlp.up_proj.weight"] = rng.normal(0, 0.2, (ff, d))
        t[p + "mlp.down_proj.weight"] = rng.normal(0, 0.2, (d, ff))
    return {k: v.astype(np.float32) for k, v in t.items()}


def hf_config(vocab):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
            "hidden_size": CFG["d"], "num_hidden_layers": CFG["layers"], "num_attention_heads": CFG["heads"],
            "num_key_value_heads": CFG["kv_heads"], "intermediate_size": CFG["ff"],
            "max_position_embeddings": CFG["ctx"], "rms_norm_eps": CFG["eps"], "rope_theta": CFG["theta"],
            "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32"}


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF rotate-half -> interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def heads_for(name):
    if name.endswith("q_proj.weight"):
        return CFG["heads"]
    if name.endswith("k_proj.weight"):
        return CFG["kv_heads"]
    return None


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


# ---- 1. gguf reads kiln's files ------------------------------------------------------------------
def check_kiln_written(kiln, work, tokenizer_path):
    tok = json.load(open(tokenizer_path))
    vocab = len(tok["model"]["vocab"])
    model = random_model(vocab, 1)
    src = os.path.join(work, "kiln_model")
    os.makedirs(src, exist_ok=True)
    write_safetensors(os.path.join(src, "model.safetensors"), model)
    json.dump(hf_config(vocab), open(os.path.join(src, "config.json"), "w"))
    with open(os.path.join(src, "tokenizer.json"), "w") as f:
        f.write(open(tokenizer_path).read())
    names = llama_names()
    want_type = {"f32": QT.F32, "f16": QT.F16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0}
    # Largest |dequantized - original| / max|original| per tensor, per type (theory: f16 2^-11,
    # Q8_0 1/254 of the block max, Q4_0 1/8 of the block max (-max clips to 7/8), against the
    # tensor max).
    bound = {"f32": 0.0, "f16": 1e-3, "q8_0": 5e-3, "q4_0": 0.13}
    for ty in ["f32", "f16", "q8_0", "q4_0"]:
        path = os.path.join(work, f"kiln_{ty}.gguf")
        run([kiln, "--threads", "1", "convert", "--model", src, "--out", path, "--type", ty])
        back = os.path.join(work, f"kiln_{ty}_back")
        run([kiln, "--threads", "1", "convert", "--gguf", path, "--out", back])
        dump = read_safetensors(os.path.join(back, "model.safetensors"))
        r = gguf.GGUFReader(path)
        assert field(r, "general.architecture") == "llama", field(r, "general.architecture")
        assert field(r, "llama.block_count") == CFG["layers"]
        assert field(r, "llama.embedding_length") == CFG["d"]
        assert field(r, "llama.feed_forward_length") == CFG["ff"]
        assert field(r, "llama.attention.head_count") == CFG["heads"]
        assert field(r, "llama.attention.head_count_kv") == CFG["kv_heads"]
        assert field(r, "llama.context_length") == CFG["ctx"]
        assert abs(field(r, "llama.rope.freq_base") - CFG["theta"]) < 1e-3
        assert abs(field(r, "llama.attention.layer_norm_rms_epsilon") - CFG["eps"]) < 1e-9
        assert field(r, "tokenizer.ggml.model") == "gpt2"
        tokens = field(r, "tokenizer.ggml.tokens")
        assert len(tokens) == vocab and tokens[572] == "<|endoftext|>", (len(tokens), tokens[572])
        inv = {v: k for k, v in tok["model"]["vocab"].items()}
        assert all(tokens[i] == inv[i] for i in range(vocab)), "token strings differ"
        assert len(field(r, "tokenizer.ggml.merges")) == len(tok["model"]["merges"])
        assert field(r, "tokenizer.ggml.token_type")[572] == 3  # control
        seen = set()
        identical_blocks = total_blocks = 0
        for t in r.tensors:
            hf = [k for k, v in names.items() if v == t.name]
            assert len(hf) == 1, f"unexpected tensor {t.name}"
            hf = hf[0]
            seen.add(hf)
            orig = model[hf]
            expect_type = QT.F32 if orig.ndim == 1 else want_type[ty]
            assert t.tensor_type == expect_type, (t.name, t.tensor_type, expect_type)
            assert list(t.shape) == list(reversed(orig.shape)), (t.name, t.shape, orig.shape)
            deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(orig.shape).astype(np.float32)
            n_head = heads_for(hf)
            if n_head:
                deq = unpermute(deq, n_head)
            assert np.array_equal(deq, dump[hf]), f"{ty} {t.name}: gguf's dequantization differs from kiln's dump"
            err = np.abs(deq - orig).max() / np.abs(orig).max()
            assert err <= bound[ty], f"{ty} {t.name}: error {err} vs bound {bound[ty]}"
            if t.tensor_type in (QT.Q8_0, QT.Q4_0):
                src_rows = permute(orig, n_head) if n_head else orig
                mine = np.asarray(t.data).reshape(-1, 34 if t.tensor_type == QT.Q8_0 else 18)
                theirs = gguf.quants.quantize(src_rows, t.tensor_type).reshape(mine.shape)
                identical_blocks += int((mine == theirs).all(axis=1).sum())
                total_blocks += mine.shape[0]
        assert seen == set(model), f"missing tensors: {set(model) - seen}"
        if total_blocks:
            frac = identical_blocks / total_blocks
            print(f"  {ty}: {identical_blocks}/{total_blocks} blocks byte-identical to gguf.quants.quantize")
            assert frac >= 0.999, f"{ty}: only {frac:.4f} of the blocks match gguf's quantizer"
        print(f"  {ty}: gguf reads kiln's file: metadata, {len(r.tensors)} tensors, dequantized values exact")


# ---- 2. kiln reads gguf's files ------------------------------------------------------------------
def check_gguf_written(kiln, work, tokenizer_path):
    tok = json.load(open(tokenizer_path))
    vocab = len(tok["model"]["vocab"])
    model = random_model(vocab, 2)
    names = llama_names()
    path = os.path.join(work, "by_gguf.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("gguf-written")
    w.add_context_length(CFG["ctx"])
    w.add_embedding_length(CFG["d"])
    w.add_block_count(CFG["layers"])
    w.add_feed_forward_length(CFG["ff"])
    w.add_head_count(CFG["heads"])
    w.add_head_count_kv(CFG["kv_heads"])
    w.add_rope_freq_base(CFG["theta"])
    w.add_layer_norm_rms_eps(CFG["eps"])
    w.add_vocab_size(vocab)
    inv = {v: k for k, v in tok["model"]["vocab"].items()}
    w.add_tokenizer_model("gpt2")
    w.add_token_list([inv[i] for i in range(vocab)])
    w.add_token_types([3 if i == 572 else 1 for i in range(vocab)])
    w.add_token_merges(tok["model"]["merges"])
    w.add_eos_token_id(572)
    # Cycle the 2-D tensors through the four types; norms are F32.
    cycle = [QT.F32, QT.F16, QT.Q8_0, QT.Q4_0]
    expect = {}
    for i, (hf, arr) in enumerate(sorted(model.items())):
        n_head = heads_for(hf)
        data = permute(arr, n_head) if n_head else arr
        qt = QT.F32 if arr.ndim == 1 else cycle[i % 4]
        if qt == QT.F32:
            stored = data.astype(np.float32)
            w.add_tensor(names[hf], stored)
            deq = stored
        elif qt == QT.F16:
            stored = data.astype(np.float16)
            w.add_tensor(names[hf], stored)
            deq = stored.astype(np.float32)
        else:
            stored = gguf.quants.quantize(data, qt)
            w.add_tensor(names[hf], stored, raw_dtype=qt)
            deq = gguf.quants.dequantize(stored, qt).reshape(arr.shape).astype(np.float32)
        expect[hf] = unpermute(deq, n_head) if n_head else deq
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = os.path.join(work, "from_gguf")
    run([kiln, "--threads", "1", "convert", "--gguf", path, "--out", out])
    got = read_safetensors(os.path.join(out, "model.safetensors"))
    for hf, want in expect.items():
        assert np.array_equal(got[hf], want), f"kiln's {hf} differs from gguf's values"
    kt = json.load(open(os.path.join(out, "tokenizer.json")))
    assert kt["model"]["vocab"] == tok["model"]["vocab"], "tokenizer vocab differs"
    assert kt["model"]["merges"] == tok["model"]["merges"], "tokenizer merges differ"
    tokens = ",".join(str((5 + 31 * i) % vocab) for i in range(12))
    a = run([kiln, "--threads", "1", "eval", "--model", out, "--tokens", tokens])
    b = run([kiln, "--threads", "1", "eval", "--model", path, "--tokens", tokens])
    la = [l for l in a.splitlines() if "loss" in l]
    lb = [l for l in b.splitlines() if "loss" in l]
    assert la and la == lb, f"eval on the directory and on the .gguf differ:\n{a}\n{b}"
    print(f"  kiln reads gguf's file: {len(expect)} tensors (F32/F16/Q8_0/Q4_0) exact, tokenizer equal; {la[0]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--keep", help="keep the files in this directory")
    args = ap.parse_args()
    tokenizer = os.path.join(ROOT, "tests", "reference", "kiln_tokenizer.json")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or tmp
        os.makedirs(work, exist_ok=True)
        try:
            from importlib.metadata import version
            ver = version("gguf")
        except Exception:  # not installed as a distribution (e.g. from a source tree)
            ver = "?"
        print(f"gguf {ver} from {os.path.dirname(gguf.__file__)}")
        check_kiln_written(args.kiln, work, tokenizer)
        check_gguf_written(args.kiln, work, tokenizer)
    print("gguf_check: OK")


if __name__ == "__main__":
    main()
