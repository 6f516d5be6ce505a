"""Tiny HF-style checkpoints (config.json + model.safetensors, HF tensor names, one decoder layer's attention) that
`mla-bisect replay --weights DIR` reads, with random weights sharp enough for a bug to show: projections
N(0, (1.5 / sqrt(fan_in))^2), norm gains 1 + N(0, 0.1^2), every value exact in bf16 so one checkpoint serves fp32
and bf16 runs."""
from __future__ import annotations

import json
import os

import numpy as np

from .mla_numpy import to_bf16

BASE = dict(hidden_size=64, num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=12, rms_norm_eps=1e-6, rope_theta=10000.0, num_hidden_layers=1,
            num_key_value_heads=4, max_position_embeddings=4096, vocab_size=64, intermediate_size=96)


def yarn(factor, mscale, mscale_all_dim, theta=10000.0, beta_fast=32.0, beta_slow=1.0, original=64):
    return {"rope_theta": theta,
            "rope_scaling": {"type": "yarn", "factor": factor, "original_max_position_embeddings": original,
                             "beta_fast": beta_fast, "beta_slow": beta_slow, "mscale": mscale,
                             "mscale_all_dim": mscale_all_dim},
            "max_position_embeddings": int(original * factor)}


# name -> config. Every config the faults use; each must replay clean from a clean numpy run.
CONFIGS = {
    # DeepSeek-V3 / R1 shaped: interleaved rope lanes, YaRN s 40 with mscale 1 / 1 (softmax scale times mscale^2).
    "v3_yarn": dict(BASE, model_type="deepseek_v3", **yarn(40, 1.0, 1.0)),
    # A DeepSeek-V3 checkpoint converted to rotate-half rope (rope_interleave false), no scaling.
    "v3_neox": dict(BASE, model_type="deepseek_v3", rope_interleave=False),
    # DeepSeek-V2-Lite shaped: no q LoRA (q_proj), YaRN with mscale 0.707 / 0.707.
    "v2_lite": dict(BASE, model_type="deepseek_v2", q_lora_rank=None, **yarn(40, 0.707, 0.707)),
    # Kimi-K2 shaped YaRN: theta 5e4, s 32, beta_fast 1.
    "kimi_k2": dict(BASE, model_type="kimi_k2", **yarn(32, 1.0, 1.0, theta=50000.0, beta_fast=1.0)),
    # GLM-5 shaped DSA (glm_moe_dsa): 8 indexer heads of 16 lanes, 8 keys a token; eps 1e-5, no YaRN.
    "glm5_dsa": dict(BASE, model_type="glm_moe_dsa", rms_norm_eps=1e-5, rope_theta=1e6, index_topk=8,
                     index_n_heads=8, index_head_dim=16),
}
CONFIGS["v3_yarn"]["rope_interleave"] = True
# Wider DeepSeek-V3 shaped dims (no YaRN) where projections span several 128 x 128 blocks: q_b_proj [384, 256] (3 x 2
# blocks), kv_a_proj_with_mqa [288, 256] (a partial last row block), o_proj [256, 256].
CONFIGS["v3_wide"] = dict(BASE, model_type="deepseek_v3", hidden_size=256, q_lora_rank=256, kv_lora_rank=256,
                          qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, rope_interleave=True)
# A rotate-half DeepSeek-V3 whose q_a_layernorm and kv_a_layernorm gains are 64x larger (q and k entries near 100):
# raw scores q.k reach past fp16's 65504.
CONFIGS["v3_hot"] = dict(BASE, model_type="deepseek_v3", rope_interleave=False)

# name -> {weight name: factor} applied after the random draw (powers of two, so the weights stay bf16-exact).
WEIGHT_SCALE = {
    "v3_hot": {"self_attn.q_a_layernorm.weight": 64.0, "self_attn.kv_a_layernorm.weight": 64.0},
}


def make_weights(cfg, seed):
    """HF names below model.layers.0. -> float32 arrays (bf16-exact)."""
    rng = np.random.default_rng(seed)
    H, N = cfg["hidden_size"], cfg["num_attention_heads"]
    Lq, L = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    P, R, V = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]

    def proj(out, inp):
        return to_bf16(rng.standard_normal((out, inp)) * (1.5 / inp ** 0.5))

    def gain(n):
        return to_bf16(1.0 + 0.1 * rng.standard_normal(n))

    a = "self_attn."
    w = {"input_layernorm.weight": gain(H)}
    if Lq:
        w[a + "q_a_proj.weight"] = proj(Lq, H)
        w[a + "q_a_layernorm.weight"] = gain(Lq)
        w[a + "q_b_proj.weight"] = proj(N * (P + R), Lq)
    else:
        w[a + "q_proj.weight"] = proj(N * (P + R), H)
    w[a + "kv_a_proj_with_mqa.weight"] = proj(L + R, H)
    w[a + "kv_a_layernorm.weight"] = gain(L)
    w[a + "kv_b_proj.weight"] = proj(N * (P + V), L)
    w[a + "o_proj.weight"] = proj(H, N * V)
    if cfg.get("index_topk") is not None:
        Hi, Di = cfg["index_n_heads"], cfg["index_head_dim"]
        w[a + "indexer.wq_b.weight"] = proj(Hi * Di, Lq)
        w[a + "indexer.wk.weight"] = proj(Di, H)
        w[a + "indexer.k_norm.weight"] = gain(Di)
        w[a + "indexer.k_norm.bias"] = to_bf16(0.1 * rng.standard_normal(Di))
        w[a + "indexer.weights_proj.weight"] = proj(Hi, H)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()}


def save_checkpoint(root, name):
    """Writes CONFIGS[name] and its weights under root/name; returns (dir, config, weights)."""
    from safetensors.numpy import save_file

    cfg = CONFIGS[name]
    weights = make_weights(cfg, seed=sum(map(ord, name)))
    for k, f in WEIGHT_SCALE.get(name, {}).items():
        weights[k] = (weights[k] * np.float32(f)).astype(np.float32)
    path = os.path.join(str(root), name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file({"model.layers.0." + k: v for k, v in weights.items()}, os.path.join(path, "model.safetensors"))
    return path, cfg, weights
