#!/usr/bin/env python3
"""One DeepSeek-V3-dims MLA layer run by HF transformers (CPU or CUDA, bf16 by default), captured with
mla_bisect.hf.capture_layer, then replayed by `mla-bisect replay`: how long each part takes, and whether the
replay is clean (exit 0). The checkpoint is random (seeded) with DeepSeek-V3's attention dims and YaRN; the
vocabulary and MLP are tiny, since replay reads only the layer's attention weights.

    bench/replay_bench.py [--device cpu|cuda] [--tokens 512] [--dtype bf16|fp32] [--binary build/mla-bisect]
                          [--workdir DIR] [--json OUT.json]

Exit: replay's exit code (0 clean); 77 (CTest: skipped) without torch/transformers, or without a CUDA device when
--device cuda is asked.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

V3_ATTENTION = dict(hidden_size=7168, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
                    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                    rms_norm_eps=1e-6, max_position_embeddings=163840,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                     "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})
# Everything but attention as small as the config allows: one dense layer.
SMALL_REST = dict(vocab_size=256, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=1,
                  first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                  n_group=1, topk_group=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--binary", default=os.path.join(HERE, "..", "build", "mla-bisect"))
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    try:
        import torch
        import transformers
        from mla_bisect.hf import capture_layer
    except ImportError as e:
        print(f"replay_bench: {e}: skipped (scripts/setup.sh installs torch and transformers)")
        return 77

    if a.device == "cuda" and not torch.cuda.is_available():
        print("replay_bench: no CUDA device: skipped")
        return 77
    work = a.workdir or tempfile.mkdtemp(prefix="mla_replay_bench_")
    os.makedirs(work, exist_ok=True)
    ckpt = os.path.join(work, "v3_layer")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    fig = {"tokens": a.tokens, "dtype": a.dtype, "device": a.device, "torch": torch.__version__,
           "transformers": transformers.__version__}

    t0 = time.time()
    cfg = transformers.DeepseekV3Config(**V3_ATTENTION, **SMALL_REST)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = transformers.DeepseekV3ForCausalLM(cfg)
    model = model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():  # N(0, 1/fan_in) projections, norm gains near 1
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else p.shape[-1] ** -0.5))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    model = model.to(dtype)
    model.save_pretrained(ckpt, safe_serialization=True)
    fig["checkpoint_s"] = time.time() - t0

    # Buffers (rope's inv_freq) were left uninitialized on the meta device: reload from the checkpoint.
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).to(a.device).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, a.tokens), generator=torch.Generator().manual_seed(7))
    capture = os.path.join(work, "capture.h5")
    t0 = time.time()
    with torch.no_grad(), capture_layer(model, 0, capture) as cap:
        model(ids.to(a.device))
    if a.device == "cuda":
        torch.cuda.synchronize()
    fig["capture_s"] = time.time() - t0
    fig["probes"] = sorted(cap.probes)

    report = os.path.join(work, "replay.json")
    t0 = time.time()
    proc = subprocess.run([a.binary, "replay", capture, "--weights", ckpt, "--json", report, "--brief"],
                          capture_output=True, text=True)
    fig["replay_s"] = time.time() - t0
    fig["replay_exit"] = proc.returncode
    print(proc.stdout, end="")
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
    if os.path.exists(report):
        rep = json.load(open(report))
        fig["first_divergence"] = rep.get("first_divergence")
        fig["worst_rel_l2"] = max((r.get("metrics") or {}).get("rel_l2", 0) or 0
                                  for r in rep.get("compare", {}).get("probes", []))
    print("replay_bench: " + json.dumps(fig))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(fig, f, indent=2)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
