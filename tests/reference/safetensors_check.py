#!/usr/bin/env python3
"""kiln's safetensors reader accepts exactly the files the reference (the `safetensors` package,
huggingface/safetensors' Rust validation) accepts.

A batch of files is written here: each rule of the format broken once (header length, JSON
syntax and types, __metadata__, dtypes, shapes, offsets that overlap, leave holes or pass the
end, data not fully covered, duplicates, nesting depth), valid edge cases (empty tensors,
scalars, sub-byte dtypes, unsorted offsets), and a few hundred random corruptions of valid files
(a byte flipped, inserted or deleted in the header; the file cut or extended). For every file the
verdict of safetensors.safe_open must equal kiln's (tests/reference/safetensors_verdict.cpp,
which opens it with kiln::SafetensorsFile): both accept or both reject.

Exit 77 (CTest's SKIP_RETURN_CODE) when safetensors (or numpy) is missing.
Run:  /usr/bin/python3 tests/reference/safetensors_check.py --verdict build/tests/safetensors_verdict [--keep DIR]
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

SKIP = 77

try:
    import numpy  # noqa: F401  (safe_open's "np" framework)
    import safetensors
except ImportError as e:
    print(f"skipping: {e}")
    sys.exit(SKIP)


def st(header, data=b"", hlen=None):
    """A file: u64 header length, header (a dict is JSON-encoded; bytes are taken as is), data."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def t(dtype, shape, offsets, **extra):
    return dict({"dtype": dtype, "shape": shape, "data_offsets": offsets}, **extra)


def rule_cases():
    a4 = {"a": t("F32", [1], [0, 4])}
    nest = lambda d: (b'{"a":{"x":' + b"[" * d + b"]" * d +  # noqa: E731
                      b',"dtype":"F32","shape":[0],"data_offsets":[0,0]}}')
    c = {
        "valid": st(a4, b"\0" * 4),
        "empty_object": st({}),
        "metadata_null": st({"__metadata__": None}),
        "metadata_strings": st({"__metadata__": {"k": "v"}, **a4}, b"\0" * 4),
        "metadata_repeated_key": st(b'{"__metadata__":{"k":"1","k":"2"}}'),
        "metadata_int_value": st({"__metadata__": {"a": 1}}),
        "metadata_null_value": st({"__metadata__": {"a": None}}),
        "metadata_list": st({"__metadata__": []}),
        "metadata_string": st({"__metadata__": "x"}),
        "metadata_twice": st(b'{"__metadata__":{"a":"b"},"__metadata__":{"c":"d"}}'),
        "metadata_null_then_object": st(b'{"__metadata__":null,"__metadata__":{}}'),
        "header_length_0": st(b""),
        "header_length_past_file": st({}, hlen=3),
        "header_length_above_limit": st({}, hlen=100_000_001),
        "header_length_huge": st({}, hlen=2**64 - 1),
        "file_5_bytes": b"\0" * 5,
        "file_empty": b"",
        "header_array": st([]),
        "header_string": st(b'"x"'),
        "trailing_spaces": st(b"{}   "),
        "leading_whitespace": st(b" \t\r\n{}"),
        "trailing_nuls": st(b"{}\0\0"),
        "nul_inside": st(b'{"a\0":1}'),
        "form_feed": st(b"{}\x0c"),
        "byte_order_mark": st(b"\xef\xbb\xbf{}"),
        "trailing_garbage": st(b"{}x"),
        "two_objects": st(b"{}{}"),
        "comment": st(b"{}//"),
        "invalid_utf8": st(b'{"\xff":' + json.dumps(t("F32", [0], [0, 0])).encode() + b"}"),
        "utf8_surrogate": st(b'{"\xed\xa0\x80":' + json.dumps(t("F32", [0], [0, 0])).encode() + b"}"),
        "utf8_overlong": st(b'{"\xc0\xaf":' + json.dumps(t("F32", [0], [0, 0])).encode() + b"}"),
        "escaped_lone_surrogate": st(b'{"\\ud800":' + json.dumps(t("F32", [0], [0, 0])).encode() + b"}"),
        "control_char_in_key": st(b'{"a\x01":' + json.dumps(t("F32", [0], [0, 0])).encode() + b"}"),
        "unicode_name": st({"\u00e9\u4e2d": t("F32", [0], [0, 0])}),
        "data_not_covered": st(a4, b"\0" * 5),
        "data_too_short": st(a4, b"\0" * 3),
        "hole_first": st({"a": t("F32", [1], [4, 8])}, b"\0" * 8),
        "hole_between": st({"a": t("F32", [1], [0, 4]), "b": t("F32", [1], [8, 12])}, b"\0" * 12),
        "overlap": st({"a": t("F32", [2], [0, 8]), "b": t("F32", [1], [4, 8])}, b"\0" * 8),
        "same_range_twice": st({"a": t("F32", [1], [0, 4]), "b": t("F32", [1], [0, 4])}, b"\0" * 4),
        "end_before_begin": st({"a": t("F32", [0], [0, 0]), "b": t("F32", [1], [4, 0])}, b"\0" * 4),
        "size_mismatch": st({"a": t("F32", [2], [0, 4])}, b"\0" * 4),
        "unsorted_tiling": st({"b": t("F32", [1], [4, 8]), "a": t("F32", [1], [0, 4])}, b"\0" * 8),
        "two_empty_at_0": st({"a": t("F32", [0], [0, 0]), "b": t("F32", [0], [0, 0])}),
        "empty_after": st({"a": t("F32", [0], [4, 4]), "b": t("F32", [1], [0, 4])}, b"\0" * 4),
        "scalar": st({"a": t("F32", [], [0, 4])}, b"\0" * 4),
        "unknown_dtype": st({"a": t("F31", [1], [0, 4])}, b"\0" * 4),
        "lower_case_dtype": st({"a": t("f32", [1], [0, 4])}, b"\0" * 4),
        "dtype_int": st({"a": t(3, [1], [0, 4])}, b"\0" * 4),
        "F4_half_byte": st({"a": t("F4", [3], [0, 2])}, b"\0" * 2),
        "F4_whole_bytes": st({"a": t("F4", [4], [0, 2])}, b"\0" * 2),
        "F6_E3M2_3_elems": st({"a": t("F6_E3M2", [3], [0, 3])}, b"\0" * 3),
        "missing_dtype": st({"a": {"shape": [0], "data_offsets": [0, 0]}}),
        "missing_shape": st({"a": {"dtype": "F32", "data_offsets": [0, 0]}}),
        "missing_offsets": st({"a": {"dtype": "F32", "shape": [0]}}),
        "three_offsets": st({"a": t("F32", [1], [0, 4, 4])}, b"\0" * 4),
        "one_offset": st({"a": t("F32", [0], [0])}),
        "negative_offsets": st({"a": t("F32", [0], [-1, -1])}),
        "offsets_object": st({"a": t("F32", [0], {"0": 0, "1": 0})}),
        "offsets_float": st(b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[0.0,0]}}'),
        "offsets_u64_max": st({"a": t("F32", [0], [2**64 - 1, 2**64 - 1])}),
        "dtype_twice": st(b'{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
        "shape_twice": st(b'{"a":{"dtype":"F32","shape":[1],"shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
        "unknown_field": st({"a": t("F32", [1], [0, 4], x=[1, {"y": 2}])}, b"\0" * 4),
        "unknown_field_twice": st(b'{"a":{"x":1,"x":2,"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
        "unknown_field_1e400": st(b'{"a":{"x":1e400,"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
        "unknown_field_bigint": st(b'{"a":{"x":123456789012345678901234567890,"dtype":"F32","shape":[1],'
                                   b'"data_offsets":[0,4]}}', b"\0" * 4),
        "tensor_twice_last_wins": st(b'{"a":' + json.dumps(t("F32", [1], [0, 4])).encode() + b',"a":' +
                                     json.dumps(t("F32", [2], [0, 8])).encode() + b"}", b"\0" * 8),
        "tensor_twice_first_invalid": st(b'{"a":3,"a":' + json.dumps(t("F32", [1], [0, 4])).encode() + b"}", b"\0" * 4),
        "tensor_int": st({"a": 3}),
        "tensor_null": st({"a": None}),
        "tensor_list": st({"a": []}),
        "shape_minus_0": st(b'{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}'),
        "shape_float": st(b'{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', b"\0" * 4),
        "shape_exponent": st(b'{"a":{"dtype":"F32","shape":[1e0],"data_offsets":[0,4]}}', b"\0" * 4),
        "shape_bool": st({"a": t("F32", [True], [0, 0])}),
        "shape_null": st({"a": t("F32", None, [0, 0])}),
        "shape_nested": st({"a": t("F32", [[1]], [0, 4])}, b"\0" * 4),
        "shape_2_64": st(b'{"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,0]}}'),
        "shape_overflow": st({"a": t("F32", [2**62, 4], [0, 0])}),
        "zero_dim_first": st({"a": t("F32", [0, 2**32, 2**32], [0, 0])}),
        "zero_dim_last": st({"a": t("F32", [2**32, 2**32, 0], [0, 0])}),
        "elements_2_63_then_0": st({"a": t("BOOL", [2**63, 0], [0, 0])}),
        "bits_overflow_only": st({"a": t("F64", [2**61], [0, 0])}),
        "empty_name": st({"": t("F32", [0], [0, 0])}),
        "name___metadata___like": st({"__metadata": t("F32", [0], [0, 0])}),
        "nested_127": st(nest(125)),
        "nested_128": st(nest(126)),
        "nested_deep": st(nest(5000)),
        "unterminated": st(b'{"a":'),
    }
    for name, bits in [("BOOL", 8), ("U8", 8), ("I8", 8), ("F8_E5M2", 8), ("F8_E4M3", 8), ("F8_E8M0", 8),
                       ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8), ("I16", 16), ("U16", 16), ("F16", 16),
                       ("BF16", 16), ("I32", 32), ("U32", 32), ("F32", 32), ("C64", 64), ("F64", 64),
                       ("I64", 64), ("U64", 64), ("F6_E2M3", 6), ("F4", 4)]:
        n = 8 * bits // 8  # 8 elements
        c["dtype_" + name] = st({"a": t(name, [8], [0, n])}, b"\0" * n)
    return c


def random_cases(rng, count):
    """Corruptions of valid multi-tensor files: the header edited byte-wise, or the file resized."""
    bases = []
    for k in range(4):
        header, data, off = {"__metadata__": {"format": "pt"}} if k % 2 else {}, b"", 0
        for i in range(1 + k):
            shape = [rng.randint(0, 3), rng.randint(1, 4)]
            size = 4 * shape[0] * shape[1]
            header[f"t{i}"] = t("F32", shape, [off, off + size])
            off += size
            data += bytes(rng.randrange(256) for _ in range(size))
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        bases.append((h, data))
    out = {}
    alphabet = b'{}[]",:0123456789-.eE tfnul\\' + bytes(range(0, 256, 37))
    for i in range(count):
        h, data = rng.choice(bases)
        h = bytearray(h)
        kind = rng.randrange(5)
        if kind == 0:
            p = rng.randrange(len(h))
            h[p] = rng.choice(alphabet)
        elif kind == 1:
            h.insert(rng.randrange(len(h) + 1), rng.choice(alphabet))
        elif kind == 2:
            del h[rng.randrange(len(h))]
        elif kind == 3:  # a digit changed: offsets and shapes that no longer tile
            digits = [j for j, b in enumerate(h) if chr(b).isdigit()]
            if digits:
                h[rng.choice(digits)] = ord(str(rng.randrange(10)))
        f = st(bytes(h), data)
        if kind == 4:
            f = f[:rng.randrange(len(f) + 1)] if rng.randrange(2) else f + b"\0" * rng.randint(1, 8)
        out[f"random_{i:04d}"] = f
    return out


def reference_accepts(path):
    try:
        with safetensors.safe_open(path, framework="np") as f:
            f.keys()
        return True, ""
    except Exception as e:  # the package raises SafetensorError (and others) for bad files
        return False, f"{type(e).__name__}: {e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verdict", required=True, help="the safetensors_verdict executable")
    ap.add_argument("--keep", help="write the files here and keep them")
    ap.add_argument("--random", type=int, default=400, help="random corruptions")
    a = ap.parse_args()
    d = a.keep or tempfile.mkdtemp(prefix="kiln_st_check_")
    os.makedirs(d, exist_ok=True)
    cases = rule_cases()
    cases.update(random_cases(random.Random(26), a.random))
    paths = []
    for name, b in cases.items():
        p = os.path.join(d, name + ".safetensors")
        with open(p, "wb") as f:
            f.write(b)
        paths.append(p)
    out = subprocess.run([a.verdict] + paths, capture_output=True, text=True, errors="replace", check=True).stdout
    kiln = out.splitlines()
    assert len(kiln) == len(paths), f"{len(kiln)} verdicts for {len(paths)} files"
    bad, accepted = 0, 0
    for name, p, line in zip(cases, paths, kiln):
        ref_ok, why = reference_accepts(p)
        kiln_ok = line.startswith("ACCEPT")
        accepted += ref_ok
        if ref_ok != kiln_ok:
            bad += 1
            print(f"MISMATCH {name}: safetensors {'accepts' if ref_ok else 'rejects (' + why[:120] + ')'}; "
                  f"kiln {line[:160]}")
    print(f"{len(paths)} files ({len(rule_cases())} by rule, {a.random} random): safetensors "
          f"{safetensors.__version__} accepts {accepted}; kiln disagrees on {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
