#!/usr/bin/env python3
"""Writing a capture against the forward it captures: one MLA layer of a random-weight HF transformers DeepseekV3
model (bf16, CPU, `--threads` torch threads) run alone and inside mla_bisect.hf.capture_layer, N times each,
interleaved. Prints the median of each:

    forward      the model's forward alone
    capture      the forward inside capture_layer
    write        the time spent writing the capture (mla_bisect.hf._write: tensors to records, the journal, the
                 HDF5 file, the fsyncs), measured around the call itself
    ratio        write / forward (and the same of the fastest run of each: the least disturbed on a shared machine)

Default dims are DeepSeek-V3's attention (hidden 7168, 128 heads, q_lora 1536, kv_lora 512, rope 64, nope 128,
v 128), T 512 tokens; the rest of the model is as small as the config allows.

    PYTHONPATH=python python bench/capture_write.py [--tokens 512] [--repeat 5] [--threads 2] [--dir DIR]
    PYTHONPATH=python python bench/capture_write.py --profile [--profile-out FILE] [--profile-top 30]
    MLA_BISECT_NO_EXT=1 ...                                 # probe records in numpy instead of the C extension

--profile runs cProfile around one more capture's writing (main thread only: the records' worker threads show as
waits) and prints the functions by internal time. Exit 77 without torch/transformers.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.join(HERE, "..", "python"))  # after PYTHONPATH: another checkout's package can be timed

V3 = dict(hidden=7168, heads=128, q_lora=1536, kv_lora=512, rope=64, nope=128, v=128)


def build(tokens, dims, threads, seed=0):
    """(model, input_ids): a one-layer DeepseekV3ForCausalLM in bf16 with the given attention dims."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    cfg = transformers.DeepseekV3Config(
        vocab_size=256, hidden_size=dims["hidden"], intermediate_size=256, moe_intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=dims["heads"], num_key_value_heads=dims["heads"],
        n_shared_experts=1, n_routed_experts=2, num_experts_per_tok=1, kv_lora_rank=dims["kv_lora"],
        q_lora_rank=dims["q_lora"], qk_rope_head_dim=dims["rope"], v_head_dim=dims["v"],
        qk_nope_head_dim=dims["nope"], first_k_dense_replace=1, n_group=1, topk_group=1,
        max_position_embeddings=max(4096, tokens))
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).eval()
    return model, torch.randint(0, 256, (1, tokens))


def measure(model, x, out_dir, repeat, profile=None):
    """Lists of seconds: forward, capture (forward inside capture_layer), write (inside hf._write). With `profile`
    (a cProfile.Profile), one more capture whose writing it profiles."""
    import torch

    from mla_bisect import hashing, hf

    hashing._ext()  # a first use compiles the C extension: not part of any timing
    inner = hf._write
    spent = []
    prof = [None]

    def timed_write(*a, **k):
        t0 = time.perf_counter()
        if prof[0] is not None:
            prof[0].enable()
        try:
            return inner(*a, **k)
        finally:
            if prof[0] is not None:
                prof[0].disable()
            spent.append(time.perf_counter() - t0)

    path = os.path.join(out_dir, "capture.h5")
    forward, capture = [], []
    hf._write = timed_write
    try:
        with torch.no_grad():
            model(x)  # warm-up
            for _ in range(repeat):
                t0 = time.perf_counter()
                model(x)
                forward.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                with hf.capture_layer(model, 0, path) as h:
                    model(x)
                capture.append(time.perf_counter() - t0)
                if not h.captured:
                    raise RuntimeError(f"nothing captured: {h.error}")
            if profile is not None:
                prof[0] = profile
                with hf.capture_layer(model, 0, path):
                    model(x)
    finally:
        hf._write = inner
    return forward, capture, spent[:repeat]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=512, help="T, tokens of the one sequence (default 512)")
    ap.add_argument("--repeat", type=int, default=5, help="N: forwards and captures timed, each (default 5)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--dir", default=None, help="where the capture is written (default: a temporary directory)")
    for k, v in V3.items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=v, help=f"attention dim (default {v})")
    ap.add_argument("--profile", action="store_true", help="cProfile one more capture's writing")
    ap.add_argument("--profile-out", default=None, help="also save the profile (pstats file)")
    ap.add_argument("--profile-top", type=int, default=30, help="functions listed (default 30)")
    a = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"capture_write: {e}: skipped (needs torch and transformers)")
        return 77
    from mla_bisect import hashing

    dims = {k: getattr(a, k) for k in V3}
    model, x = build(a.tokens, dims, a.threads)
    prof = None
    if a.profile:
        import cProfile
        prof = cProfile.Profile()
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        fwd, cap, wr = measure(model, x, d, a.repeat, prof)
        size = os.path.getsize(os.path.join(d, "capture.h5"))
    f, c, w = (statistics.median(v) for v in (fwd, cap, wr))
    where = "C extension" if hashing._ext() is not None else "numpy"
    import mla_bisect
    print(f"T {a.tokens}, dims {dims}, {a.threads} threads, records in {where}, {size / 1e6:.0f} MB file, "
          f"median of {a.repeat} ({os.path.dirname(mla_bisect.__file__)}):")
    print(f"  forward {f:.3f} s  capture {c:.3f} s  write {w:.3f} s  ratio {w / f:.2f}x  "
          f"(capture - forward {c - f:.3f} s)")
    print(f"  fastest: forward {min(fwd):.3f} s  write {min(wr):.3f} s  ratio {min(wr) / min(fwd):.2f}x")
    print("  forward runs: " + " ".join(f"{v:.3f}" for v in fwd))
    print("  write runs:   " + " ".join(f"{v:.3f}" for v in wr))
    if prof is not None:
        import pstats
        if a.profile_out:
            prof.dump_stats(a.profile_out)
        pstats.Stats(prof).sort_stats("tottime").print_stats(a.profile_top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
