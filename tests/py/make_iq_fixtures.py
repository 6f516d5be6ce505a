#!/usr/bin/env python3
"""GGUF files with the IQ and TQ quant types, written by gguf.GGUFWriter, for tests/test_weights_iq.cpp.

gguf-py cannot quantize into these types, so every block is random bytes with its fp16 scale set to a finite
random value (any other bytes are valid: every grid index a block can hold exists). The expected FP32 values are
gguf.quants.dequantize's of the same bytes. Written:

    iq_quants.gguf      one [3, C] tensor per type, C several blocks (3), a zero and a negative scale among them
    models/gguf_iq.gguf a 2-layer deepseek2 checkpoint whose projections and norms use every type, rows of 1 to 24
                        blocks, to be read by the loader and `mla-bisect inspect`
    expected/*.f32      gguf-py's dequantization (raw little-endian float32) and its decoded IQ grid tables
    manifest.json       what each file is

    make_iq_fixtures.py OUTDIR      exit 0: written; exit 3: a module is missing (message on stderr)
"""
import json
import os
import sys

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError as e:  # the C++ test turns this into a visible skip
    print(f"missing python module: {e.name}", file=sys.stderr)
    sys.exit(3)

OUT = sys.argv[1]
RNG = np.random.default_rng(20250301)
SIZES = gguf.constants.GGML_QUANT_SIZES
MANIFEST = {"iq_quants": {}, "tables": {}, "models": {}}

# Byte offsets of each type's fp16 scale in its block (IQ1_M spreads its scale over four words: see iq1m_scale).
SCALE_AT = {QT.IQ2_XXS: 0, QT.IQ2_XS: 0, QT.IQ2_S: 0, QT.IQ3_XXS: 0, QT.IQ3_S: 0, QT.IQ1_S: 0, QT.IQ1_M: None,
            QT.IQ4_NL: 0, QT.IQ4_XS: 0, QT.TQ1_0: 52, QT.TQ2_0: 64}


def out(*parts):
    p = os.path.join(OUT, *parts)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    return p


def save_f32(rel, arr):
    arr = np.ascontiguousarray(np.asarray(arr, dtype=np.float32))
    arr.tofile(out(rel))
    return {"file": rel, "shape": list(arr.shape)}


def set_scale(blocks, qt, d):
    """blocks [nb, type_size] uint8; d [nb] float16: the block scales."""
    bits = d.view(np.uint16)
    if qt == QT.IQ1_M:  # the fp16 bits are the top nibbles of the u16 scale words at 48, 50, 52, 54
        words = blocks[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            words[:, k] = (words[:, k] & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12)
        blocks[:, 48:56] = words.view(np.uint8)
    else:
        off = SCALE_AT[qt]
        blocks[:, off:off + 2] = bits.view(np.uint8).reshape(-1, 2)


def random_blocks(qt, rows, cols, d_range):
    """[rows, cols / block * type_size] random blocks with finite fp16 scales in +-d_range (both signs)."""
    block, tsize = SIZES[qt]
    nb = rows * cols // block
    b = RNG.integers(0, 256, size=(nb, tsize), dtype=np.uint8)
    d = (RNG.uniform(*d_range, size=nb) * RNG.choice([-1.0, 1.0], size=nb)).astype(np.float16)
    set_scale(b, qt, d)
    return b, d


IQ_TYPES = [QT.IQ1_S, QT.IQ1_M, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.IQ4_NL, QT.IQ4_XS,
            QT.TQ1_0, QT.TQ2_0]


def iq_quants():
    w = gguf.GGUFWriter(out("iq_quants.gguf"), "testarch")
    rows = 3
    for qt in IQ_TYPES:
        block, tsize = SIZES[qt]
        cols = 3 * block
        b, d = random_blocks(qt, rows, cols, (0.01, 2.0))
        d[1], d[2] = 0.0, -0.0  # zero scales: row 0's second and third blocks (signed zeros out)
        set_scale(b, qt, d)
        q = b.reshape(rows, cols // block * tsize)
        name = qt.name.lower()
        w.add_tensor(name, q, raw_dtype=qt)
        MANIFEST["iq_quants"][name] = {"type": int(qt), "cols": cols,
                                       "expected": save_f32(f"expected/{name}.f32", gguf.quants.dequantize(q, qt))}
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # gguf-py's decoded grids and small tables, for the header check.
    for cls in [gguf.quants.IQ2_XXS, gguf.quants.IQ2_XS, gguf.quants.IQ2_S, gguf.quants.IQ3_XXS, gguf.quants.IQ3_S,
                gguf.quants.IQ1_S]:
        cls.init_grid()
        MANIFEST["tables"][cls.__name__] = save_f32(f"expected/grid_{cls.__name__}.f32",
                                                    np.asarray(cls.grid).reshape(cls.grid_shape))
    MANIFEST["tables"]["ksigns"] = save_f32("expected/ksigns.f32", np.frombuffer(gguf.quants.IQ2_XXS.ksigns, np.uint8))
    MANIFEST["tables"]["kvalues_iq4nl"] = save_f32("expected/kvalues_iq4nl.f32", np.array(gguf.quants.IQ4_NL.kvalues))
    MANIFEST["tables"]["iq1s_delta"] = float(gguf.quants.IQ1_S.delta)


# A deepseek2 checkpoint with wider dims than tests/py/make_weight_fixtures.py's, so that rows span several blocks.
DIMS = dict(hidden=768, heads=4, q_lora=512, kv_lora=512, nope=32, rope=16, v=64, layers=2)

# Per layer: field -> type. Every IQ/TQ type appears; the rest is F32.
LAYER_TYPES = [
    {"q_a_proj": QT.IQ2_XXS, "q_b_proj": QT.IQ2_XS, "kv_a_proj": QT.IQ2_S, "kv_b_proj": QT.IQ3_XXS,
     "o_proj": QT.IQ3_S, "input_norm": QT.IQ4_NL, "q_a_norm": QT.TQ2_0},
    {"q_a_proj": QT.IQ1_S, "q_b_proj": QT.IQ1_M, "kv_a_proj": QT.IQ4_XS, "kv_b_proj": QT.TQ1_0,
     "o_proj": QT.IQ4_NL, "input_norm": QT.TQ1_0, "kv_a_norm": QT.IQ4_XS},
]


# 1 / (the typical |value| a unit scale gives): the grid value times the sub-block scale factor.
GAIN = {QT.IQ2_XXS: 1 / 50, QT.IQ2_XS: 1 / 50, QT.IQ2_S: 1 / 50, QT.IQ3_XXS: 1 / 120, QT.IQ3_S: 1 / 64,
        QT.IQ1_S: 1 / 8, QT.IQ1_M: 1 / 8, QT.IQ4_NL: 1 / 60, QT.IQ4_XS: 1 / 1000, QT.TQ1_0: 1.0, QT.TQ2_0: 1.0}


def gguf_iq_model():
    m = DIMS
    H, N, Lq, L, P, R, V = m["hidden"], m["heads"], m["q_lora"], m["kv_lora"], m["nope"], m["rope"], m["v"]
    path = "models/gguf_iq.gguf"
    w = gguf.GGUFWriter(out(path), "deepseek2")
    w.add_block_count(m["layers"])
    w.add_embedding_length(H)
    w.add_head_count(N)
    w.add_head_count_kv(N)
    w.add_uint32("deepseek2.attention.q_lora_rank", Lq)
    w.add_uint32("deepseek2.attention.kv_lora_rank", L)
    w.add_rope_dimension_count(R)
    w.add_key_length(P + R)
    w.add_value_length(V)
    w.add_float32("deepseek2.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_rope_freq_base(10000.0)
    shapes = {"q_a_proj": (Lq, H), "q_b_proj": (N * (P + R), Lq), "kv_a_proj": (L + R, H),
              "kv_b_proj": (N * (P + V), L), "o_proj": (H, N * V)}
    norms = {"input_norm": ("attn_norm", H), "q_a_norm": ("attn_q_a_norm", Lq), "kv_a_norm": ("attn_kv_a_norm", L)}
    names = {"q_a_proj": "attn_q_a", "q_b_proj": "attn_q_b", "kv_a_proj": "attn_kv_a_mqa", "kv_b_proj": "attn_kv_b",
             "o_proj": "attn_output"}
    expected_layers = []
    for layer, types in enumerate(LAYER_TYPES):
        exp = {}
        b = f"blk.{layer}."
        for field, (tname, n) in norms.items():
            qt = types.get(field, QT.F32)
            if qt == QT.F32:
                a = (1 + 0.1 * RNG.standard_normal(n)).astype(np.float32)
                w.add_tensor(b + tname + ".weight", a)
                exp[field] = a
                continue
            q, _ = random_blocks(qt, 1, n, (0.7 * GAIN[qt], 1.4 * GAIN[qt]))
            q = q.reshape(-1)
            w.add_tensor(b + tname + ".weight", q, raw_dtype=qt)
            exp[field] = gguf.quants.dequantize(q, qt)
        for field, shape in shapes.items():
            qt = types[field]
            d = GAIN[qt] / np.sqrt(shape[1])  # weights of about 1/sqrt(fan_in): a run on them stays in range
            q, _ = random_blocks(qt, shape[0], shape[1], (0.5 * d, 1.5 * d))
            q = q.reshape(shape[0], -1)  # [rows, bytes per row]: the writer takes the shape from it
            w.add_tensor(b + names[field] + ".weight", q, raw_dtype=qt)
            exp[field] = gguf.quants.dequantize(q, qt).reshape(shape)
        expected_layers.append(exp)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    entry = {"path": path, "layers": m["layers"], "dims": m, "expected": [],
             "types": [{f: qt.name for f, qt in t.items()} for t in LAYER_TYPES]}
    for l, exp in enumerate(expected_layers):
        entry["expected"].append({f: save_f32(f"expected/gguf_iq.l{l}.{f}.f32", a) for f, a in exp.items()})
    MANIFEST["models"]["gguf_iq"] = entry


def main():
    os.makedirs(OUT, exist_ok=True)
    iq_quants()
    gguf_iq_model()
    json.dump(MANIFEST, open(out("manifest.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
