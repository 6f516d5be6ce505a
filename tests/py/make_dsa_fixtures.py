"""Writes what HF transformers' own DSA indexers compute (GlmMoeDsaIndexer: interleaved RoPE on the indexer's rope
lanes; DeepseekV32Indexer: half-split RoPE) on small random weights and inputs, for tests/test_dsa_indexer.cpp.

    python make_dsa_fixtures.py OUT.h5

Per model (group glm_moe_dsa, deepseek_v32): the inputs x [T, H] and q_c [T, Lq], the indexer's weights (wq_b,
wk, k_norm weight and bias, weights_proj), the RoPE base and rope lanes, index_topk, and HF's outputs: index_scores
[T, T] (the tensor HF takes its top-k of, causal -inf included, captured on its way into topk) and topk [T, k]
(int32). The prompt is longer than index_topk, so selection is sparse.

Per model also (group <model>_attention) what HF's whole attention module (GlmMoeDsaAttention, DeepseekV32Attention,
eager) attends with: the query, key and value states [T, heads, D] that reach its attention function, the softmax
scale, the indexer's top-k [T, k] (int32) and the attention's output [T, heads * v_head_dim] on its way into o_proj.
"""
import sys

import h5py
import numpy as np
import torch

T, HIDDEN, Q_LORA, N_IDX, D_IDX, ROPE, TOPK, THETA = 40, 96, 48, 4, 64, 32, 12, 10000.0


def model_classes(model_type):
    if model_type == "glm_moe_dsa":
        from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as m
        from transformers.models.glm_moe_dsa.configuration_glm_moe_dsa import GlmMoeDsaConfig as Config
        return m, Config, m.GlmMoeDsaIndexer, m.GlmMoeDsaRotaryEmbedding, m.GlmMoeDsaAttention
    else:
        from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m
        from transformers.models.deepseek_v32.configuration_deepseek_v32 import DeepseekV32Config as Config
        return m, Config, m.DeepseekV32Indexer, m.DeepseekV32RotaryEmbedding, m.DeepseekV32Attention


def small_config(Config):
    return Config(hidden_size=HIDDEN, q_lora_rank=Q_LORA, kv_lora_rank=32, qk_rope_head_dim=ROPE,
                 qk_nope_head_dim=32, v_head_dim=32, num_attention_heads=4, num_key_value_heads=4,
                 index_n_heads=N_IDX, index_head_dim=D_IDX, index_topk=TOPK, num_hidden_layers=1,
                 rope_parameters={"rope_type": "default", "rope_theta": THETA}, max_position_embeddings=4096)


def run(model_type, seed):
    torch.manual_seed(seed)
    _, Config, Indexer, Rotary, _ = model_classes(model_type)
    cfg = small_config(Config)
    idx = Indexer(cfg, 0).float().eval()
    with torch.no_grad():
        for p in idx.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        idx.k_norm.weight.add_(1.0)  # a LayerNorm weight near 1 and a bias that is not zero
    rot = Rotary(cfg)
    x = torch.randn(1, T, HIDDEN)
    q_c = torch.randn(1, T, Q_LORA)
    pos = torch.arange(T).unsqueeze(0)
    cos, sin = rot(x, pos)
    mask = torch.ones(T, T, dtype=torch.bool).tril().unsqueeze(0)  # [B, S, T]: key t visible to query s <= s
    captured = {}
    original = torch.Tensor.topk

    def capture(self, *args, **kwargs):
        captured["scores"] = self.detach().clone()
        return original(self, *args, **kwargs)

    torch.Tensor.topk = capture
    try:
        with torch.no_grad():
            topk = idx(x, q_c, (cos, sin), mask, pos)
    finally:
        torch.Tensor.topk = original
    return {
        "x": x[0].numpy(), "q_c": q_c[0].numpy(),
        "wq_b": idx.wq_b.weight.detach().numpy(), "wk": idx.wk.weight.detach().numpy(),
        "k_norm_weight": idx.k_norm.weight.detach().numpy(), "k_norm_bias": idx.k_norm.bias.detach().numpy(),
        "weights_proj": idx.weights_proj.weight.detach().numpy(),
        "index_scores": captured["scores"][0].numpy().astype(np.float32),
        "topk": topk[0].numpy().astype(np.int32),
    }


def run_attention(model_type, seed):
    """HF's whole attention module, eager: what its attention function is given and returns."""
    torch.manual_seed(seed)
    m, Config, _, Rotary, Attention = model_classes(model_type)
    cfg = small_config(Config)
    cfg._attn_implementation = "eager"
    attn = Attention(cfg, 0).float().eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "norm.weight" in name else 0.0))
    x = torch.randn(1, T, HIDDEN)
    pos = torch.arange(T).unsqueeze(0)
    cos, sin = Rotary(cfg)(x, pos)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, T, T).masked_fill(~causal, torch.finfo(torch.float32).min)
    captured = {}
    original_eager, original_indexer = m.eager_attention_forward, attn.indexer.forward

    def eager(module, query, key, value, attention_mask, scaling, **kwargs):
        captured.update(query=query, key=key, value=value, scaling=scaling)
        return original_eager(module, query, key, value, attention_mask, scaling, **kwargs)

    def indexer(*args, **kwargs):
        captured["topk"] = original_indexer(*args, **kwargs)
        return captured["topk"]

    attn.o_proj.register_forward_pre_hook(lambda module, args: captured.update(out=args[0]))
    m.eager_attention_forward, attn.indexer.forward = eager, indexer
    try:
        with torch.no_grad():
            attn(x, (cos, sin), mask, position_ids=pos)
    finally:
        m.eager_attention_forward = original_eager
    heads = lambda t: t[0].transpose(0, 1).numpy()  # [B, heads, T, D] -> [T, heads, D]
    return {
        "query": heads(captured["query"]), "key": heads(captured["key"]), "value": heads(captured["value"]),
        "topk": captured["topk"][0].numpy().astype(np.int32), "out": captured["out"][0].numpy(),
    }, float(captured["scaling"])


def main():
    with h5py.File(sys.argv[1], "w") as f:
        for i, model_type in enumerate(["glm_moe_dsa", "deepseek_v32"]):
            g = f.create_group(model_type)
            for k, v in run(model_type, 1234 + i).items():
                g.create_dataset(k, data=np.ascontiguousarray(v))
            g.attrs["n_heads"], g.attrs["head_dim"], g.attrs["rope"] = N_IDX, D_IDX, ROPE
            g.attrs["topk"], g.attrs["theta"] = TOPK, THETA
            data, scaling = run_attention(model_type, 4321 + i)
            a = f.create_group(model_type + "_attention")
            for k, v in data.items():
                a.create_dataset(k, data=np.ascontiguousarray(v))
            a.attrs["scaling"], a.attrs["topk"] = scaling, TOPK


if __name__ == "__main__":
    main()
