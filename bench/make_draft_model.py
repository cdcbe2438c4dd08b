#!/usr/bin/env python3
"""Makes a layer-skip draft for speculative decoding from a saved Llama/GPT-2 model directory:
the first K transformer layers with the embeddings, final norm and LM head of the full model
(config.json, model.safetensors, tokenizer.json). Standard library only.

    python3 bench/make_draft_model.py runs/llama-tiny runs/llama-tiny-draft2 --layers 2
"""
import argparse
import json
import re
import shutil
import struct
from pathlib import Path

LAYER = re.compile(r"^(model\.layers|transformer\.h)\.(\d+)\.")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, default=2, help="layers to keep (the first K)")
    a = ap.parse_args()
    src, dst = Path(a.src), Path(a.dst)
    cfg = json.loads((src / "config.json").read_text())
    key = "num_hidden_layers" if "num_hidden_layers" in cfg else "n_layer"
    if not 1 <= a.layers <= cfg[key]:
        raise SystemExit(f"--layers {a.layers} must be between 1 and the model's {cfg[key]}")
    with open(src / "model.safetensors", "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    kept, blobs, offset = {}, [], 0
    for name, t in header.items():  # keep the file's order
        m = LAYER.match(name)
        if m and int(m.group(2)) >= a.layers:
            continue
        begin, end = t["data_offsets"]
        blobs.append(data[begin:end])
        kept[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [offset, offset + end - begin]}
        offset += end - begin
    out_header = ({"__metadata__": meta} if meta is not None else {}) | kept
    raw = json.dumps(out_header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # 8-byte alignment of the data section
    dst.mkdir(parents=True, exist_ok=True)
    with open(dst / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for b in blobs:
            f.write(b)
    cfg[key] = a.layers
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    print(f"{dst}: {a.layers} of {len({LAYER.match(k).group(2) for k in header if LAYER.match(k)})} layers, "
          f"{len(kept)} tensors, {offset / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
