#!/usr/bin/env python3
# Writes the seed corpora of the fuzz targets (fuzz/corpus/<parser>/): small valid inputs of each
# format, so the fuzzer starts from the accepted shapes. Needs numpy and gguf (llama.cpp's
# package); run once, the output is committed: /work/V/bin/python fuzz/make_seeds.py
import json
import os

import numpy as np
import gguf

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)


def out(parser, name, data):
    d = os.path.join(here, "corpus", parser)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- gguf: a tiny Llama (d 8, 2 heads, 1 KV head, 1 layer, vocab 32) in F32 and F16 -----------
def tiny_llama(path, dtype, tokenizer):
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny")
    w.add_vocab_size(32)
    w.add_context_length(16)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_dimension_count(4)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([bytes([i]).decode("latin-1") for i in range(31)] + ["<|endoftext|>"])
        w.add_token_types([1] * 31 + [3])
        w.add_token_merges(["a b", "ab c"])
        w.add_eos_token_id(31)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (32, 8), "blk.0.attn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8),
              "blk.0.attn_k.weight": (4, 8), "blk.0.attn_v.weight": (4, 8), "blk.0.attn_output.weight": (8, 8),
              "blk.0.ffn_norm.weight": (8,), "blk.0.ffn_gate.weight": (16, 8), "blk.0.ffn_up.weight": (16, 8),
              "blk.0.ffn_down.weight": (8, 16), "output_norm.weight": (8,)}
    for name, shape in shapes.items():
        a = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(name, a if len(shape) == 1 else a.astype(dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


for name, dtype, tok in [("llama_f32.gguf", np.float32, True), ("llama_f16.gguf", np.float16, False)]:
    tmp = os.path.join("/tmp", name)
    tiny_llama(tmp, dtype, tok)
    out("gguf", name, open(tmp, "rb").read())
# Metadata of every value type, no tensors.
tmp = "/tmp/kv.gguf"
w = gguf.GGUFWriter(tmp, "other")
w.add_uint8("a.u8", 1); w.add_int16("a.i16", -2); w.add_uint32("a.u32", 3); w.add_int64("a.i64", -4)
w.add_float32("a.f32", 0.5); w.add_float64("a.f64", 0.25); w.add_bool("a.b", True); w.add_string("a.s", "x")
w.add_array("a.arr", [1, 2, 3]); w.add_array("a.sarr", ["p", "q"])
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
out("gguf", "kv_types.gguf", open(tmp, "rb").read())

# ---- tokenizer.json: kiln's reference tokenizer cut to its first 24 merges ------------------
full = json.load(open(os.path.join(root, "tests/reference/kiln_tokenizer.json")))
vocab = sorted(full["model"]["vocab"].items(), key=lambda kv: kv[1])
merges = full["model"]["merges"][:24]
keep = {t: i for t, i in vocab if i < 256 + len(merges)}
small = dict(full)
small["model"] = dict(full["model"], vocab=keep, merges=merges)
small["added_tokens"] = [dict(full["added_tokens"][0], id=len(keep))]
out("tokenizer", "kiln_small.json", json.dumps(small))
small2 = dict(small)
small2["model"] = dict(small["model"], merges=[m.split(" ", 1) for m in merges])  # merges as pairs
out("tokenizer", "kiln_small_pairs.json", json.dumps(small2))

# ---- config.json: Llama and GPT-2 as transformers writes them --------------------------------
out("hf_config", "llama.json", json.dumps({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32, "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
    "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float32"}, indent=2))
out("hf_config", "llama_rope_parameters.json", json.dumps({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32, "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}, indent=2))
out("hf_config", "gpt2.json", json.dumps({
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50, "n_embd": 8, "n_layer": 1,
    "n_head": 2, "n_positions": 16, "n_inner": None, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
    "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True}, indent=2))

# ---- chat_template.json ---------------------------------------------------------------------
out("chat_template", "default.json", json.dumps({
    "format": "kiln-chat-v1", "system": "{content}\n\n", "user": "User: {content}\n",
    "assistant": "Assistant: {content}\n", "generation_prompt": "Assistant:", "stop": ["\nUser:"]}, indent=2))
out("chat_template", "chatml.json", json.dumps({
    "format": "kiln-chat-v1", "system": "<|im_start|>system\n{content}<|im_end|>\n",
    "user": "<|im_start|>user\n{content}{content}<|im_end|>\n", "assistant": "<|im_start|>assistant\n{content}<|im_end|>\n",
    "generation_prompt": "<|im_start|>assistant\n", "stop": ["<|im_end|>", "<|im_start|>"]}))

# ---- safetensors: two small F32/F16 tensors, with __metadata__ --------------------------------
def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return len(h).to_bytes(8, "little") + h + data


out("safetensors", "two_tensors.safetensors", safetensors(
    {"a.weight": ("F32", [2, 3], np.arange(6, dtype=np.float32).tobytes()),
     "b.bias": ("F16", [4], np.ones(4, dtype=np.float16).tobytes())}, {"format": "pt"}))
out("safetensors", "empty.safetensors", safetensors({}))
out("safetensors", "scalar_bf16.safetensors", safetensors({"s": ("BF16", [], b"\x80\x3f")}))

# ---- request bodies: first byte '0' (even) completions, '1' (odd) chat -------------------------
out("request", "completion.txt", "0" + json.dumps({
    "model": "kiln", "prompt": "the quick", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "stop": ["."],
    "logprobs": 2, "echo": True, "frequency_penalty": 0.5, "presence_penalty": -0.5, "logit_bias": {"5": -100},
    "seed": 3, "n": 1, "stream": False}))
out("request", "completion_ids.txt", "0" + json.dumps({"prompt": [1, 2, 3], "max_tokens": 1, "stream": True,
                                                        "stream_options": {"include_usage": True}}))
out("request", "chat.txt", "1" + json.dumps({
    "model": "kiln", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the fox"}],
    "max_tokens": 4, "logprobs": True, "top_logprobs": 2, "stop": "end"}))
out("request", "chat_parts.txt", "1" + json.dumps({
    "messages": [{"role": "user", "content": [{"type": "text", "text": "the dog"}]}], "max_completion_tokens": 3}))

# ---- checkpoint (kiln-checkpoint-2): 3 params; sections params, m, v ---------------------------
def crc32c(b, crc=0):
    crc ^= 0xFFFFFFFF
    for x in b:
        crc ^= x
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def checkpoint(num_params, time_budget=None):
    secs = [np.arange(num_params, dtype=np.float32).tobytes(), np.zeros(num_params, np.float32).tobytes(),
            np.ones(num_params, np.float32).tobytes()]
    h = {"format": "kiln-checkpoint-2", "step": 7, "num_params": num_params, "model": "llama tiny",
         "options": {"batch": 2, "lr": 0.001}, "loss_scale": 1.0, "loss_scale_good_steps": 0}
    if time_budget is not None:
        h["time_budget_steps"] = time_budget
    h["sections"] = [{"name": n, "bytes": len(s), "crc32c": crc32c(s)} for n, s in zip(["params", "m", "v"], secs)]
    text = json.dumps(h, separators=(",", ":")).encode()
    prefix = b"KILNCKPT" + len(text).to_bytes(8, "little") + text
    return prefix + crc32c(prefix).to_bytes(4, "little") + b"".join(secs)


out("checkpoint", "three_params.bin", checkpoint(3))
out("checkpoint", "time_budget.bin", checkpoint(1, 40))
