#!/usr/bin/env python3
"""Benchmark of the whole-model path: a DeepSeek-V3-dims HF transformers model (random weights; attention at the
real dims, a small MLP/MoE and vocabulary so that the checkpoint stays a few GB) captured in one forward with
mla_bisect.hf.capture_model, then `mla-bisect replay` of every layer. Prints the forward's time, the capture's
(the forward with the capture), the replay's, and the replay's verdict.

    bench/model_capture.py [--layers 8] [--tokens 128] [--dir /tmp/mla_model_bench] [--binary build/mla-bisect]
                           [--device cpu|cuda] [--dtype bf16|fp32]

The checkpoint is written once into --dir and reused by later runs with the same --layers."""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--dir", default="/tmp/mla_model_bench")
    ap.add_argument("--binary", default=os.path.join(HERE, "..", "build", "mla-bisect"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    a = ap.parse_args()

    import torch
    import transformers

    from mla_bisect.hf import capture_model

    ckpt = os.path.join(a.dir, f"dsv3_{a.layers}l")
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        t0 = time.perf_counter()
        cfg = transformers.DeepseekV3Config(
            vocab_size=256, hidden_size=7168, intermediate_size=256, moe_intermediate_size=64,
            num_hidden_layers=a.layers, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
            n_routed_experts=2, num_experts_per_tok=1, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
            v_head_dim=128, qk_nope_head_dim=128, first_k_dense_replace=1, max_position_embeddings=4096, n_group=1,
            topk_group=1)
        torch.manual_seed(0)
        with torch.device("cpu"):
            model = transformers.DeepseekV3ForCausalLM(cfg).to(torch.bfloat16)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    scale = 1.0 if "embed" in name else 1.5 / p.shape[-1] ** 0.5
                    p.copy_((torch.randn(p.shape, generator=g) * scale).to(p.dtype))
                else:
                    p.copy_((1.0 + 0.1 * torch.randn(p.shape, generator=g)).to(p.dtype))
        model.save_pretrained(ckpt, safe_serialization=True)
        del model
        print(f"checkpoint {ckpt} written ({time.perf_counter() - t0:.1f} s)", flush=True)

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).to(a.device).eval()
    ids = torch.randint(0, 256, (1, a.tokens), generator=torch.Generator().manual_seed(7)).to(a.device)

    def sync():
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    with torch.no_grad():
        model(ids)  # warm-up
        sync()
        t0 = time.perf_counter()
        model(ids)
        sync()
        forward = time.perf_counter() - t0
        cap = os.path.join(a.dir, "cap.h5")
        t0 = time.perf_counter()
        with capture_model(model, cap, tokens=a.tokens) as run:
            model(ids)
        sync()
        captured = time.perf_counter() - t0
    assert run.captured == list(range(a.layers)), run.errors
    t0 = time.perf_counter()
    proc = subprocess.run([a.binary, "replay", cap, "--weights", ckpt, "--quiet", "--brief"], capture_output=True,
                          text=True)
    replay = time.perf_counter() - t0
    print(f"DeepSeek-V3 dims, {a.layers} layers, T {a.tokens}, {a.dtype} on {a.device}: forward {forward:.2f} s, "
          f"forward with capture_model {captured:.2f} s, replay of every layer {replay:.1f} s (exit {proc.returncode})")
    print(proc.stdout.strip() or proc.stderr.strip()[-2000:])


if __name__ == "__main__":
    main()
