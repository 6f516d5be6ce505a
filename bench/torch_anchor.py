#!/usr/bin/env python3
"""PyTorch anchors for the CUDA engine's bench, timed on the same GPU in the same call (scripts/gpu_bench.sh runs it
and prints our time beside each as a ratio). bf16, CUDA events, median of --repeats after --warmup:

  decode B, L       the absorbed decode attention unfused: scores = einsum(q [B, H, 576], cache [B, L, 576]) · scale,
                    softmax in fp32, out = einsum(p, cache[..., :512]) — what attention_mqa computes
  prefill T         torch's scaled_dot_product_attention, causal, q/k [1, H, T, 192], v [1, H, T, 128] (DeepSeek-V3's
                    attention_mha), and HF transformers' DeepseekV3Attention layer (sdpa) on [1, T, 7168]: our layer
                    from x to o against it

    bench/torch_anchor.py --json anchors.json [--decode 64x4096 128x8192] [--prefill 512 4096] [--heads 128]

Exit 77 (skipped) without torch or a CUDA device.
"""
import argparse
import json
import sys


def timed(fn, warmup, repeats):
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    times.sort()
    return times[len(times) // 2]


def decode_anchor(B, L, H, warmup, repeats):
    import torch
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(B, H, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    cache = torch.randn(B, L, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = 192 ** -0.5

    def run():
        s = torch.einsum("bhd,bld->bhl", q, cache).float() * scale
        p = torch.softmax(s, dim=-1).to(torch.bfloat16)
        return torch.einsum("bhl,bld->bhd", p, cache[..., :512])

    return {"attention_s": timed(run, warmup, repeats)}


def hf_layer(T, H):
    """HF's DeepseekV3Attention with DeepSeek-V3's dims (random weights) and a closure running it on [1, T, 7168]."""
    import torch
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m
    cfg = DeepseekV3Config(hidden_size=7168, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=1536,
                           kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                           rms_norm_eps=1e-6, max_position_embeddings=163840, num_hidden_layers=1,
                           vocab_size=256, intermediate_size=256, moe_intermediate_size=64, n_routed_experts=8,
                           num_experts_per_tok=2, first_k_dense_replace=1,
                           rope_scaling={"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(2)
    attn = m.DeepseekV3Attention(cfg, layer_idx=0).to("cuda", torch.bfloat16).eval()
    rope = m.DeepseekV3RotaryEmbedding(config=cfg).to("cuda")
    x = torch.randn(1, T, 7168, device="cuda", dtype=torch.bfloat16) * 0.5
    pos = torch.arange(T, device="cuda")[None]
    cos, sin = rope(x, pos)

    @torch.no_grad()
    def run():
        return attn(hidden_states=x, position_embeddings=(cos, sin), attention_mask=None)[0]

    return run


def prefill_anchor(T, H, warmup, repeats):
    import torch
    import torch.nn.functional as F
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(1, H, T, 192, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, H, T, 192, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, H, T, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    out = {"attention_s": timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), warmup, repeats)}
    try:
        out["layer_s"] = timed(hf_layer(T, H), warmup, repeats)
    except Exception as e:  # an HF version without DeepseekV3 or with another signature: the layer anchor is left out
        out["layer_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--decode", nargs="*", default=["64x4096", "128x8192"], help="BxL shapes")
    ap.add_argument("--prefill", nargs="*", type=int, default=[512, 4096], help="token counts")
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_anchor: no torch: skipped")
        return 77
    if not torch.cuda.is_available():
        print("torch_anchor: no CUDA device: skipped")
        return 77
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "heads": a.heads, "decode": {},
           "prefill": {}}
    for shape in a.decode:
        B, L = (int(v) for v in shape.split("x"))
        res["decode"][shape] = decode_anchor(B, L, a.heads, a.warmup, a.repeats)
        print(f"torch_anchor: decode B {B} L {L}: {res['decode'][shape]['attention_s'] * 1e3:.3f} ms", flush=True)
    for T in a.prefill:
        res["prefill"][str(T)] = r = prefill_anchor(T, a.heads, a.warmup, a.repeats)
        layer = f", HF layer {r['layer_s'] * 1e3:.3f} ms" if "layer_s" in r else f" ({r.get('layer_error')})"
        print(f"torch_anchor: prefill T {T}: sdpa {r['attention_s'] * 1e3:.3f} ms{layer}", flush=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
