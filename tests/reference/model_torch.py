#!/usr/bin/env python3
"""Whole-model PyTorch reference for kiln's transformer (GPT-2, Llama, Mixtral, DeepSeek-V3 MLA), forward and backward.

For each family this builds a small model (GPT-2 and Llama at W1a width: d 384, 6 heads; Mixtral d 128,
4 heads, 4 experts, top-2; DeepSeek-V3 d 128, 4 heads, dense blocks; 2 layers, B 2, T 32) whose weights come
from a counter-based hash that tests/model/test_torch_model.cpp computes identically (so no weights are stored),
runs one forward/backward in float64 on fixed tokens and targets (two targets are -1, ignored) and writes
tests/reference/model_torch_<family>.safetensors:

  tokens, targets            I32 (B, T)
  loss                       F64 (1,)    mean cross-entropy over the valid targets
  logits                     F32 (B, T, V)
  param_sum.<name>           F64 (1,)    sum of the weights (catches a weight-formula mismatch)
  grad.<name>                F32         full gradient, kiln layout, when numel <= 65536 (Mixtral 16384)
  grad_rows.<name>           F32 (R, in) evenly spaced rows of a larger matrix's gradient (16384 elements,
  grad_row_idx.<name>        I64 (R,)    Mixtral 4096: under 1 MiB), with their indices
  grad_norm.<name>           F64 (1,)    Frobenius norm of the full gradient
  grad_sketch.<name>         F64 (32,)   projections of the full gradient on 32 hashed +-1
                                         vectors: ||S(a-b)|| / ||S b|| estimates ||a-b|| / ||b||,
                                         an error anywhere in the tensor shows
and for DeepSeek-V3 (Rkv = kv_lora_rank, Dr = qk_rope_head_dim):
  mla_latent.<layer>         F32 (B, T, Rkv + Dr) what kiln's compressed KV cache holds per token: [c_kv, k_pe],
                                         c_kv after kv_a_layernorm, then k_pe after RoPE (in the de-interleaved
                                         order below when rope_interleave); transformers' cache entry for the layer
and for Mixtral (L MoE layers, N = B*T tokens, k experts per token):
  aux_loss, z_loss           F64 (1,)    mean_l aux_l, mean_l z_l (below)
  objective                  F64 (1,)    J = loss + router_aux_loss_coef aux_loss + router_z_loss_coef z_loss
  route_experts              I32 (L, N, k) each token's experts, by descending router probability
  route_gates                F32 (L, N, k) their probabilities renormalized to sum 1 (Mixtral's gates)
  route_margin               F64 (1,)    min over layers and tokens of p_(k) - p_(k+1), the gap at the top-k
                                         boundary (kiln's fp32 routing could differ only where it is ~1e-5)
Names are Hugging Face's (Mixtral's the Hub checkpoint's: block_sparse_moe.gate, experts.{j}.w1/w2/w3);
"kiln layout" is nn.Linear's (out, in), so GPT-2's Conv1D gradients are the transpose of HF's storage.
The metadata holds the HF config.json that kiln parses (Mixtral's adds kiln's router_z_loss_coef; DeepSeek-V3's
is in the Hub checkpoints' style, rope_theta and rope_scaling, not the rope_parameters that transformers 5 writes).

Mixtral's grad.* are of kiln's training objective J, not of the loss. For layer l with router logits
z (N, E) over all N tokens (ignored targets included), p = softmax(z), S_t the top-k experts of token t:
  f_i = |{t : i in S_t}| / (N k)  (a constant),  P_i = (1/N) sum_t p_ti,  aux_l = E sum_i f_i P_i  (1 when balanced),
  z_l = (1/N) sum_t (logsumexp_i z_ti)^2.
transformers' load_balancing_loss_func differs: it pools all layers' tokens into one f and one P (not
a mean of per-layer losses) and its f sums to k (2 at perfect balance, not 1). So the script passes
transformers no labels (it then adds nothing to the loss) and computes J from the router logits that
transformers returns (output_router_logits). The tokens and targets use seed 20264, the first from
20242 whose route_margin is >= 2e-3 (20242's: 1.4e-4); the router weights keep make_weight's
projection scale.

DeepSeek-V3 (deepseek_v3: q_lora_rank 48, rope_interleave true, transformers' default; deepseek_v3_noq: no query
compression, rope_interleave false) has first_k_dense_replace = num_hidden_layers, so every block is Llama's with
multi-head latent attention (MLA) in place of GQA and the loss is the plain cross-entropy. Per layer, on n (B, T, C),
H heads, Dn = qk_nope_head_dim, Dr = qk_rope_head_dim, Dv = v_head_dim:
  q = q_b_proj(rmsnorm(q_a_proj(n), q_a_layernorm))  or  q_proj(n)     (B, T, H·(Dn+Dr)); per head [q_nope | q_pe]
  [c_kv | k_pe] = kv_a_proj_with_mqa(n)                                (B, T, Rkv + Dr); k_pe is ONE head for all
  c_kv = rmsnorm(c_kv, kv_a_layernorm);  kv_b_proj(c_kv)               (B, T, H·(Dn+Dv)); per head [k_nope | v]
  q_pe, k_pe = rope(q_pe), rope(k_pe);  q = [q_nope | q_pe], k = [k_nope | k_pe]   per head, width Dn+Dr
  o_proj(causal softmax(q k^T / sqrt(Dn+Dr)) v)                        (B, T, H·Dv) -> (B, T, C)
q_a_layernorm and kv_a_layernorm use eps 1e-6 (DeepseekV3RMSNorm's default; transformers does not pass rms_norm_eps).
rope is rotate-half over Dr dims with frequency theta^(-2j/Dr) on dims j and j + Dr/2. With rope_interleave,
transformers' apply_rotary_pos_emb_interleave takes x1 = x[0::2], x2 = x[1::2] and returns
[x1 cos - x2 sin | x2 cos + x1 sin]: rotate-half of the de-interleaved [x0, x2, ..., x1, x3, ...], left in that
order (q and k alike, so the scores are those of rotating pairs (x_2j, x_2j+1) in place). Without it,
apply_rotary_pos_emb is plain rotate-half. Loading permutes no rows of q_b_proj or kv_a_proj_with_mqa: rope_interleave
acts only at run time. The softmax scale is yarn_apply_mscale(rope_parameters, (Dn+Dr)^-0.5), which multiplies by
mscale^2 only for a scaled rope_type with mscale_all_dim; with rope_scaling null it is 1/sqrt(Dn+Dr) (checked).

The reference is Hugging Face `transformers` (GPT2LMHeadModel / LlamaForCausalLM / MixtralForCausalLM /
DeepseekV3ForCausalLM, float64, eager attention and experts) when installed, checked against the plain-torch model
below; without transformers the plain model is the reference. transformers 5 stores Mixtral's experts fused
(mlp.experts.gate_up_proj = [w1; w3], down_proj = w2), mapped by fused_moe and tested by
check_fused_experts; 4.x keeps the Hub names, and fused_moe maps nothing.
Run:  /usr/bin/python3 tests/reference/model_torch.py [family ...]   (default: all five)
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
MOE_LIMITS = (16384, 4096)     # mixtral's FULL_LIMIT, ROW_BUDGET: its 24 expert matrices whole would be 2.4 MB
IGNORED = [(0, 5), (1, T - 1)]  # (batch, position) targets set to -1
SEED = {"gpt2": 20240, "llama": 20241, "mixtral": 20264,  # tokens and targets; mixtral: see the docstring
        "deepseek_v3": 20265, "deepseek_v3_noq": 20266}
MLA_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: transformers builds them with DeepseekV3RMSNorm's default
                     # eps, not rms_norm_eps (as DeepSeek's own modeling code does)

GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 65, "n_embd": 384,
        "n_layer": 2, "n_head": 6, "n_inner": 1536, "n_positions": T, "n_ctx": T,
        "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "tie_word_embeddings": True,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "torch_dtype": "float32"}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96, "hidden_size": 384,
         "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
         "intermediate_size": 1024, "max_position_embeddings": T, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
         "attention_bias": False, "torch_dtype": "float32"}
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 96, "hidden_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 192,
           "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": T, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False, "router_aux_loss_coef": 0.02,
           "router_jitter_noise": 0.0, "sliding_window": None,
           "router_z_loss_coef": 0.001,  # kiln's key: MixtralConfig keeps it as an unused attribute
           "torch_dtype": "float32"}
# DeepSeek-V3 with every block dense (first_k_dense_replace = num_hidden_layers): only MLA differs from Llama.
# The MoE fields are small valid values that create no MoE layer; num_nextn_predict_layers 0: no MTP module.
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 96,
               "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 4,  # = heads; DeepseekV3Config's default 128 would make H // KV zero
               "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
               "v_head_dim": 16, "intermediate_size": 192, "first_k_dense_replace": 2, "moe_intermediate_size": 64,
               "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
               "num_nextn_predict_layers": 0, "max_position_embeddings": T, "rms_norm_eps": 1e-5,
               "rope_theta": 10000.0, "rope_scaling": None, "rope_interleave": True, "hidden_act": "silu",
               "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "float32"}
DEEPSEEK_V3_NOQ = {**DEEPSEEK_V3, "q_lora_rank": None, "rope_interleave": False}  # plain q_proj, rotate-half RoPE

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
    """Llama's, or Mixtral's when c has num_local_experts: the MLP becomes the router (E, C) and each expert's
    w1 (gate, (F, C)), w2 (down, (C, F)), w3 (up, (F, C)) under block_sparse_moe (the Hub checkpoint names)."""
    C, V, F_, L = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["num_hidden_layers"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = C // H
    p = [("model.embed_tokens.weight", (V, C))]
    for i in range(L):
        h = f"model.layers.{i}."
        p += [(h + "input_layernorm.weight", (C,)), (h + "self_attn.q_proj.weight", (H * D, C)),
              (h + "self_attn.k_proj.weight", (KV * D, C)), (h + "self_attn.v_proj.weight", (KV * D, C)),
              (h + "self_attn.o_proj.weight", (C, H * D)), (h + "post_attention_layernorm.weight", (C,))]
        if "num_local_experts" in c:
            m = h + "block_sparse_moe."
            p.append((m + "gate.weight", (c["num_local_experts"], C)))
            for j in range(c["num_local_experts"]):
                e = f"{m}experts.{j}."
                p += [(e + "w1.weight", (F_, C)), (e + "w2.weight", (C, F_)), (e + "w3.weight", (F_, C))]
        else:
            p += [(h + "mlp.gate_proj.weight", (F_, C)), (h + "mlp.up_proj.weight", (F_, C)),
                  (h + "mlp.down_proj.weight", (C, F_))]
    p.append(("model.norm.weight", (C,)))
    if not c["tie_word_embeddings"]:
        p.append(("lm_head.weight", (V, C)))
    return p


def deepseek_params(c):
    """DeepSeek-V3 with dense blocks: Llama's list with MLA's projections in place of q/k/v_proj (the HF checkpoint's
    names). Dn + Dr (nope + rope) is the query/key head width, Dv the value head width."""
    C, V, F_, L = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["num_hidden_layers"]
    H, Rq, Rkv = c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    Dn, Dr, Dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    p = [("model.embed_tokens.weight", (V, C))]
    for i in range(L):
        a = f"model.layers.{i}.self_attn."
        p.append((f"model.layers.{i}.input_layernorm.weight", (C,)))
        if Rq is None:
            p.append((a + "q_proj.weight", (H * (Dn + Dr), C)))
        else:
            p += [(a + "q_a_proj.weight", (Rq, C)), (a + "q_a_layernorm.weight", (Rq,)),
                  (a + "q_b_proj.weight", (H * (Dn + Dr), Rq))]
        p += [(a + "kv_a_proj_with_mqa.weight", (Rkv + Dr, C)), (a + "kv_a_layernorm.weight", (Rkv,)),
              (a + "kv_b_proj.weight", (H * (Dn + Dv), Rkv)), (a + "o_proj.weight", (C, H * Dv))]
        h = f"model.layers.{i}."
        p += [(h + "post_attention_layernorm.weight", (C,)), (h + "mlp.gate_proj.weight", (F_, C)),
              (h + "mlp.up_proj.weight", (F_, C)), (h + "mlp.down_proj.weight", (C, F_))]
    return p + [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]


# ---- plain-torch models (float64), weights in kiln layout ----
def causal_attention(q, k, v):
    """q and k (B, H, T, D), v (B, H, T, Dv) -> (B, T, H·Dv), scores scaled by 1/sqrt(D)."""
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


def moe_block(c, W, h, x):
    """Mixtral's sparse MoE on x (N, C) -> (y (N, C), router logits z (N, E)): p = softmax(z), each token's
    top-k experts with their probabilities renormalized to sum 1 as gates,
    y = sum_j gate_j w2_j(silu(w1_j x) * w3_j x)."""
    z = x @ W[h + "block_sparse_moe.gate.weight"].T                                 # (N, E)
    top_p, top_i = torch.softmax(z, dim=-1).topk(c["num_experts_per_tok"], dim=-1)  # (N, k), descending
    gates = torch.zeros_like(z).scatter(1, top_i, top_p / top_p.sum(-1, keepdim=True))  # (N, E), 0 off the top-k
    y = torch.zeros_like(x)
    for j in range(c["num_local_experts"]):
        e = f"{h}block_sparse_moe.experts.{j}."
        a = F.silu(x @ W[e + "w1.weight"].T) * (x @ W[e + "w3.weight"].T)           # (N, F)
        y = y + gates[:, j:j + 1] * (a @ W[e + "w2.weight"].T)
    return y, z


def rms_norm(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope_tables(D, theta, Tn):
    """cos, sin (T, D) of rotate-half RoPE at positions 0..T-1: frequency theta^(-2j/D) on dims j and j + D/2."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.arange(Tn, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()


def rope(x, cos, sin, interleave):
    """x (..., T, D) rotated by position. interleave (DeepSeek's checkpoint layout, pairs (x0, x1), (x2, x3), ...):
    the dims are first de-interleaved to [x0, x2, ..., x1, x3, ...] and the result stays in that order."""
    if interleave:
        x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    return x * cos + rotate_half(x) * sin


def gqa_attention(c, W, a, n, cos, sin):
    """Llama's grouped-query attention on n (B, T, C) -> (B, T, C); a is the "model.layers.{i}.self_attn." prefix."""
    Bn, Tn, C = n.shape
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = C // H
    q = (n @ W[a + "q_proj.weight"].T).reshape(Bn, Tn, H, D).transpose(1, 2)
    k = (n @ W[a + "k_proj.weight"].T).reshape(Bn, Tn, KV, D).transpose(1, 2)
    v = (n @ W[a + "v_proj.weight"].T).reshape(Bn, Tn, KV, D).transpose(1, 2)
    q, k = rope(q, cos, sin, False), rope(k, cos, sin, False)
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)  # q head j uses kv head j // (H/KV)
    return causal_attention(q, k, v) @ W[a + "o_proj.weight"].T


def mla_attention(c, W, a, n, cos, sin, latents):
    """DeepSeek's multi-head latent attention on n (B, T, C) -> (B, T, C) (the math is in the module docstring);
    appends the layer's latent [c_kv, k_pe] (B, T, Rkv + Dr) to latents. cos, sin (T, Dr)."""
    Bn, Tn, _ = n.shape
    H, Rkv, Dn, Dr, Dv = (c[k] for k in ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                                         "qk_rope_head_dim", "v_head_dim"))
    if c["q_lora_rank"] is None:
        q = n @ W[a + "q_proj.weight"].T                                                   # (B, T, H·(Dn+Dr))
    else:
        cq = rms_norm(n @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"], MLA_NORM_EPS)  # (B, T, Rq)
        q = cq @ W[a + "q_b_proj.weight"].T                                                # (B, T, H·(Dn+Dr))
    q_nope, q_pe = q.reshape(Bn, Tn, H, Dn + Dr).transpose(1, 2).split([Dn, Dr], dim=-1)  # (B, H, T, Dn | Dr)
    c_kv, k_pe = (n @ W[a + "kv_a_proj_with_mqa.weight"].T).split([Rkv, Dr], dim=-1)      # (B, T, Rkv), (B, T, Dr)
    c_kv = rms_norm(c_kv, W[a + "kv_a_layernorm.weight"], MLA_NORM_EPS)
    kv = (c_kv @ W[a + "kv_b_proj.weight"].T).reshape(Bn, Tn, H, Dn + Dv).transpose(1, 2)  # (B, H, T, Dn+Dv)
    k_nope, v = kv.split([Dn, Dv], dim=-1)                                                # (B, H, T, Dn | Dv)
    q_pe, k_pe = rope(q_pe, cos, sin, c["rope_interleave"]), rope(k_pe, cos, sin, c["rope_interleave"])
    latents.append(torch.cat((c_kv, k_pe), dim=-1))                                       # (B, T, Rkv + Dr)
    q = torch.cat((q_nope, q_pe), dim=-1)                                                 # (B, H, T, Dn+Dr)
    k = torch.cat((k_nope, k_pe[:, None].expand(-1, H, -1, -1)), dim=-1)                  # k_pe: one head for all
    return causal_attention(q, k, v) @ W[a + "o_proj.weight"].T                           # scale 1/sqrt(Dn+Dr)


def llama_forward(c, W, tokens, routers, latents):
    """Llama; Mixtral (c has num_local_experts): each MoE layer's router logits (N, E) are appended to routers;
    DeepSeek-V3 (c has kv_lora_rank, every block dense): MLA, each layer's latent (B, T, Rkv + Dr) appended to
    latents."""
    C, H, eps = c["hidden_size"], c["num_attention_heads"], c["rms_norm_eps"]
    mla = "kv_lora_rank" in c
    Bn, Tn = tokens.shape
    cos, sin = rope_tables(c["qk_rope_head_dim"] if mla else C // H, c["rope_theta"], Tn)  # (T, D)
    x = W["model.embed_tokens.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        h = f"model.layers.{i}."
        n = rms_norm(x, W[h + "input_layernorm.weight"], eps)
        if mla:
            x = x + mla_attention(c, W, h + "self_attn.", n, cos, sin, latents)
        else:
            x = x + gqa_attention(c, W, h + "self_attn.", n, cos, sin)
        n = rms_norm(x, W[h + "post_attention_layernorm.weight"], eps)
        if "num_local_experts" in c:
            y, z = moe_block(c, W, h, n.reshape(-1, C))
            routers.append(z)
            x = x + y.reshape(Bn, Tn, C)
        else:
            a = F.silu(n @ W[h + "mlp.gate_proj.weight"].T) * (n @ W[h + "mlp.up_proj.weight"].T)
            x = x + a @ W[h + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


def objective(c, logits, targets, routers):
    """(CE, J, routing): the mean cross-entropy and kiln's training objective J = CE + alpha mean_l aux_l +
    beta mean_l z_l over the MoE layers' router logits (J = CE without any), with what they routed."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    if not routers:
        return ce, ce, {}
    E, k = c["num_local_experts"], c["num_experts_per_tok"]
    aux, zl, experts, gates, margin = [], [], [], [], []
    for z in routers:                                            # (N, E), all B*T tokens
        p = torch.softmax(z, dim=-1)
        sp, si = p.sort(dim=-1, descending=True)                 # (N, E)
        f = torch.bincount(si[:, :k].reshape(-1), minlength=E).to(p.dtype) / si[:, :k].numel()  # (E,), constant
        aux.append(E * (f * p.mean(0)).sum())                    # = 1 at perfect balance
        zl.append(torch.logsumexp(z, dim=-1).pow(2).mean())
        experts.append(si[:, :k])
        gates.append(sp[:, :k] / sp[:, :k].sum(-1, keepdim=True))
        margin.append((sp[:, k - 1] - sp[:, k]).min())
    aux, zl = torch.stack(aux).mean(), torch.stack(zl).mean()
    J = ce + c["router_aux_loss_coef"] * aux + c["router_z_loss_coef"] * zl
    experts = torch.stack(experts).numpy().astype(np.int32)     # (L, N, k)
    return ce, J, {"aux_loss": np.array([aux.item()]), "z_loss": np.array([zl.item()]),
                   "objective": np.array([J.item()]), "route_experts": experts,
                   "route_gates": torch.stack(gates).detach().numpy().astype(np.float32),
                   "route_margin": np.array([torch.stack(margin).min().item()]),
                   "counts": np.stack([np.bincount(e.reshape(-1), minlength=E) for e in experts])}  # (L, E) tokens


def latent_entries(latents):
    """Each MLA layer's latent (B, T, Rkv + Dr) as the dump's float64 mla_latent.<layer> (cast to F32 when written)."""
    return {f"mla_latent.{l}": z.detach().numpy().astype(np.float64) for l, z in enumerate(latents)}


def run_plain(family, c, weights, tokens, targets):
    """(loss, logits, grads, extras): extras holds Mixtral's routing entries and DeepSeek's MLA latents."""
    W = {n: torch.tensor(w, dtype=torch.float64, requires_grad=True) for n, w in weights.items()}
    routers, latents = [], []
    logits = gpt2_forward(c, W, tokens) if family == "gpt2" else llama_forward(c, W, tokens, routers, latents)
    loss, J, routing = objective(c, logits, targets, routers)
    J.backward()
    grads = {n: t.grad.detach() for n, t in W.items()}
    return loss.item(), logits.detach(), grads, {**routing, **latent_entries(latents)}


# ---- Hugging Face transformers (float64) ----
def gpt2_conv1d(name):
    return name.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"))


def fused_moe(c):
    """kiln name -> (transformers 5 parameter, index into it) for the MoE tensors, which 5.x stores fused:
    mlp.gate.weight (E, C), mlp.experts.gate_up_proj (E, 2F, C) = [w1_j; w3_j], mlp.experts.down_proj (E, C, F)."""
    F_, out = c["intermediate_size"], {}
    for i in range(c["num_hidden_layers"]):
        h = f"model.layers.{i}."
        out[h + "block_sparse_moe.gate.weight"] = (h + "mlp.gate.weight", ())
        for j in range(c["num_local_experts"]):
            e = f"{h}block_sparse_moe.experts.{j}."
            out[e + "w1.weight"] = (h + "mlp.experts.gate_up_proj", (j, slice(0, F_)))
            out[e + "w3.weight"] = (h + "mlp.experts.gate_up_proj", (j, slice(F_, 2 * F_)))
            out[e + "w2.weight"] = (h + "mlp.experts.down_proj", (j,))
    return out


def check_fused_experts(model, c, weights):
    """One layer-0 expert of the loaded model on a few rows against w2(silu(w1 x) * w3 x): tests fused_moe's order."""
    x = torch.tensor(weights["model.embed_tokens.weight"][:8], dtype=torch.float64)  # (8, C)
    W = {n: torch.tensor(w, dtype=torch.float64) for n, w in weights.items()}
    for j in range(c["num_local_experts"]):
        e = f"model.layers.0.block_sparse_moe.experts.{j}."
        want = (F.silu(x @ W[e + "w1.weight"].T) * (x @ W[e + "w3.weight"].T)) @ W[e + "w2.weight"].T
        got = model.model.layers[0].mlp.experts(x, torch.full((8, 1), j), torch.ones(8, 1, dtype=torch.float64))
        if rel(got.detach().numpy(), want.numpy()) > 1e-12:
            raise RuntimeError(f"expert {j} of transformers' fused layout is not w2(silu(w1 x) * w3 x): "
                               "fused_moe's order is wrong")


def run_hf(family, c, weights, tokens, targets):
    import transformers
    kw = {k: v for k, v in c.items() if k not in ("architectures", "torch_dtype")}
    if family == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw))
    elif family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw, attn_implementation="eager"))
    elif "kv_lora_rank" in c:
        model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**kw, attn_implementation="eager"))
        scale, want = model.model.layers[0].self_attn.scaling, (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) ** -0.5
        if scale != want:  # yarn_apply_mscale changes it only for a scaled rope_type with mscale_all_dim
            raise RuntimeError(f"transformers' MLA softmax scale {scale} is not 1/sqrt(nope + rope) = {want}")
    else:
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            **kw, attn_implementation="eager", experts_implementation="eager"))
    model = model.double().eval()  # eval: no dropout (all zero anyway); gradients still flow
    shapes = {n: p.shape for n, p in model.named_parameters()}
    fused = {n: s for n, s in fused_moe(c).items() if s[0] in shapes} if family == "mixtral" else {}
    state = {}
    for n, w in weights.items():
        t = torch.tensor(w, dtype=torch.float64)
        if n in fused:
            hf_name, idx = fused[n]
            state.setdefault(hf_name, torch.zeros(shapes[hf_name], dtype=torch.float64))[idx] = t
        else:
            state[n] = t.T.contiguous() if family == "gpt2" and gpt2_conv1d(n) else t
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith(("attn.bias", "attn.masked_bias")) and m != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if c["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    if fused:
        check_fused_experts(model, c, weights)
    if family == "mixtral":  # router logits, and no labels: transformers adds no aux loss of its own
        out = model(input_ids=tokens, output_router_logits=True)
        logits, routers = out.logits, list(out.router_logits)
    else:
        logits, routers = model(input_ids=tokens).logits, []
    loss, J, routing = objective(c, logits, targets, routers)
    J.backward()
    if "kv_lora_rank" in c:
        routing.update(latent_entries(hf_latents(model, c, tokens)))
    grads = {n: p.grad.detach() for n, p in model.named_parameters()}
    for n, (hf_name, idx) in fused.items():
        grads[n] = grads[hf_name][idx]
    for n in grads:
        if family == "gpt2" and gpt2_conv1d(n):
            grads[n] = grads[n].T.contiguous()
    return loss.item(), logits.detach(), grads, routing, transformers.__version__


def hf_latents(model, c, tokens):
    """Each layer's MLA latent (B, T, Rkv + Dr) from transformers' cache after a forward over tokens: 5.x caches the
    latent, not the expanded keys (keys = kv_a_layernorm's output (B, 1, T, Rkv), values = k_pe after RoPE
    (B, 1, T, Dr))."""
    with torch.no_grad():
        out = model(input_ids=tokens, use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    layers = [(l.keys, l.values) for l in cache.layers]
    if any(k.shape[-1] != c["kv_lora_rank"] or v.shape[-1] != c["qk_rope_head_dim"] for k, v in layers):
        shapes = [tuple(t.shape) for t in layers[0]]
        raise RuntimeError(f"transformers' DeepSeek-V3 cache holds {shapes}, not the latent (c_kv, k_pe)")
    return [torch.cat((k[:, 0], v[:, 0]), dim=-1) for k, v in layers]


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
    rng = np.random.RandomState(SEED[family])
    tokens = rng.randint(0, c["vocab_size"], size=(B, T)).astype(np.int32)
    targets = rng.randint(0, c["vocab_size"], size=(B, T)).astype(np.int32)
    for b, t in IGNORED:
        targets[b, t] = -1
    weights = {n: make_weight(n, s) for n, s in params}
    tok, tgt = torch.tensor(tokens, dtype=torch.long), torch.tensor(targets, dtype=torch.long)

    loss, logits, grads, extras = run_plain(family, c, weights, tok, tgt)
    routed, latents = "route_experts" in extras, [k for k in extras if k.startswith("mla_latent.")]
    reference = f"plain torch {torch.__version__} (float64)"
    try:
        hf_loss, hf_logits, hf_grads, hf_extras, hf_version = run_hf(family, c, weights, tok, tgt)
    except ImportError:
        print(f"{family}: transformers not installed; the plain-torch model is the reference")
    else:
        figures = {"loss": abs(hf_loss - loss) / abs(loss), "logits": rel(hf_logits.numpy(), logits.numpy()),
                   "worst gradient": max(rel(hf_grads[n].numpy(), grads[n].numpy()) for n, _ in params)}
        figures.update({k: rel(hf_extras[k], extras[k]) for k in ("aux_loss", "z_loss") if routed})
        if latents:
            figures["worst mla_latent"] = max(rel(hf_extras[k], extras[k]) for k in latents)
        same_routes = not routed or np.array_equal(hf_extras["route_experts"], extras["route_experts"])
        print(f"{family}: transformers {hf_version} vs plain torch: "
              + ", ".join(f"{k} {v:.2e}" for k, v in figures.items())
              + (f", routes {'equal' if same_routes else 'DIFFER'}" if routed else ""))
        if max(v for k, v in figures.items() if k != "loss") > 1e-6 or not same_routes:
            raise SystemExit(f"{family}: transformers and the plain-torch model disagree")
        loss, logits, grads, extras = hf_loss, hf_logits, hf_grads, hf_extras
        reference = f"transformers {hf_version} {c['architectures'][0]} on torch {torch.__version__} (float64)"

    out = {"tokens": tokens, "targets": targets, "loss": np.array([loss]),
           "logits": logits.numpy().astype(np.float32)}
    out.update({k: v.astype(np.float32) if k in latents else v for k, v in extras.items() if k != "counts"})
    full_limit, row_budget = MOE_LIMITS if "num_local_experts" in c else (FULL_LIMIT, ROW_BUDGET)
    for name, shape in params:
        g = grads[name].numpy().astype(np.float64)
        assert g.shape == tuple(shape), (name, g.shape, shape)
        out["param_sum." + name] = np.array([weights[name].astype(np.float64).sum()])
        if g.size <= full_limit:
            out["grad." + name] = g.astype(np.float32)
            continue
        rows_n = min(shape[0], max(8, row_budget // shape[1]))
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
    if routed:
        print(f"{family}: aux {extras['aux_loss'][0]:.6f}, z {extras['z_loss'][0]:.6f}, "
              f"objective {extras['objective'][0]:.6f}, route_margin {extras['route_margin'][0]:.3e}, "
              f"tokens per expert (layer: expert 0..E-1) " + "; ".join(
                  f"{l}: {' '.join(map(str, n))}" for l, n in enumerate(extras["counts"])))


def main():
    torch.manual_seed(0)
    families = {"gpt2": (GPT2, gpt2_params), "llama": (LLAMA, llama_params), "mixtral": (MIXTRAL, llama_params),
                "deepseek_v3": (DEEPSEEK_V3, deepseek_params), "deepseek_v3_noq": (DEEPSEEK_V3_NOQ, deepseek_params)}
    for family in sys.argv[1:] or families:
        if family not in families:
            raise SystemExit(f"model_torch.py: unknown family '{family}' (known: {', '.join(families)})")
        c, params = families[family]
        dump(family, c, params(c))


if __name__ == "__main__":
    main()
