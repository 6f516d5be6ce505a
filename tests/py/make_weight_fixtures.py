#!/usr/bin/env python3
"""Weight files written by code nobody here wrote, for tests/test_weights_*.cpp.

GGUF files come from llama.cpp's own writer (gguf.GGUFWriter) with blocks from gguf.quants.quantize
(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, BF16) or random blocks with finite scales (K-quants, NVFP4); the
expected FP32 values are gguf.quants.dequantize's. safetensors files come from safetensors.numpy with
ml_dtypes arrays; the expected values are ml_dtypes' conversions (and numpy float32 arithmetic for the
scaled formats, in the order their reference implementations apply the scales). Expected arrays are raw
little-endian float32 files; manifest.json says what each one is.

    make_weight_fixtures.py OUTDIR      exit 0: written; exit 3: a module is missing (message on stderr)
"""
import json
import os
import sys

try:
    import numpy as np
    import ml_dtypes
    import gguf
    from gguf import GGMLQuantizationType as QT, GGUFValueType as VT
    from safetensors.numpy import save_file
except ImportError as e:  # the C++ test turns this into a visible skip
    print(f"missing python module: {e.name}", file=sys.stderr)
    sys.exit(3)

OUT = sys.argv[1]
RNG = np.random.default_rng(20240607)
MANIFEST = {"gguf_quants": {}, "st_dtypes": {}, "models": {}}


def out(*parts):
    p = os.path.join(OUT, *parts)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    return p


def save_f32(rel, arr):
    arr = np.ascontiguousarray(np.asarray(arr, dtype=np.float32))
    arr.tofile(out(rel))
    return {"file": rel, "shape": list(arr.shape)}


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8)


# ------------------------------------------------------------------ GGUF: every quant type + metadata

SIZES = gguf.constants.GGML_QUANT_SIZES


def random_blocks(qt, rows, cols, d_fields, d_range=(-2.0, 2.0)):
    """Random bytes for every block, with the fp16 scale fields set to finite random values."""
    block, tsize = SIZES[qt]
    nb = rows * cols // block
    b = RNG.integers(0, 256, size=(nb, tsize), dtype=np.uint8)
    for off in d_fields:
        d = RNG.uniform(*d_range, size=nb).astype(np.float16)
        b[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, cols // block * tsize)


def gguf_quants():
    w = gguf.GGUFWriter(out("gguf_quants.gguf"), "testarch")
    entries = MANIFEST["gguf_quants"]
    rows = 3
    # Quantized by gguf itself from float data (bit-exact with ggml's reference quantizers).
    for name, qt, cols in [("q8_0", QT.Q8_0, 64), ("q4_0", QT.Q4_0, 96), ("q4_1", QT.Q4_1, 64),
                           ("q5_0", QT.Q5_0, 64), ("q5_1", QT.Q5_1, 128), ("mxfp4", QT.MXFP4, 64),
                           ("bf16", QT.BF16, 40)]:
        src = (RNG.standard_normal((rows, cols)) * RNG.uniform(0.01, 3.0, size=(rows, 1))).astype(np.float32)
        src[0, :5] = [0.0, -0.0, 1e-8, -7.5, 7.5]  # zeros, a tiny value, ties
        if qt != QT.BF16:
            src[1, :32] = 0.0  # an all-zero block (d = 0)
        q = gguf.quants.quantize(src, qt)
        w.add_tensor(name, q, raw_dtype=qt)
        entries[name] = {"type": int(qt), "src": save_f32(f"expected/{name}.src.f32", src),
                         "expected": save_f32(f"expected/{name}.f32", gguf.quants.dequantize(q, qt))}
    # Random blocks with finite scales (gguf has no quantizer for these).
    for name, qt, cols, d_fields in [("q2_k", QT.Q2_K, 512, [80, 82]), ("q3_k", QT.Q3_K, 256, [108]),
                                     ("q4_k", QT.Q4_K, 512, [0, 2]), ("q5_k", QT.Q5_K, 256, [0, 2]),
                                     ("q6_k", QT.Q6_K, 512, [208]), ("nvfp4", QT.NVFP4, 128, [])]:
        q = random_blocks(qt, rows, cols, d_fields)
        w.add_tensor(name, q, raw_dtype=qt)
        entries[name] = {"type": int(qt), "expected": save_f32(f"expected/{name}.f32", gguf.quants.dequantize(q, qt))}
    f16 = np.array([[0.0, -0.0, 1.0, -2.5, 65504.0, 6e-8, np.inf, -np.inf]], dtype=np.float16)
    w.add_tensor("f16", f16)
    entries["f16"] = {"type": int(QT.F16), "expected": save_f32("expected/f16.f32", gguf.quants.dequantize(f16, QT.F16))}
    f32 = RNG.standard_normal((2, 3, 5)).astype(np.float32)  # 3-D: ne = [5, 3, 2]
    w.add_tensor("f32_3d", f32)
    entries["f32_3d"] = {"type": int(QT.F32), "expected": save_f32("expected/f32_3d.f32", f32)}

    meta = {}

    def add(key, val, vtype, sub=None, expect=None):
        w.add_key_value(key, val, vtype, sub_type=sub)
        meta[key] = {"type": vtype.name.lower(), "value": val if expect is None else expect}

    add("test.u8", 200, VT.UINT8)
    add("test.i8", -100, VT.INT8)
    add("test.u16", 60000, VT.UINT16)
    add("test.i16", -30000, VT.INT16)
    add("test.u32", 4000000000, VT.UINT32)
    add("test.i32", -2000000000, VT.INT32)
    add("test.u64", 18000000000000000000, VT.UINT64)
    add("test.i64", -9000000000000000000, VT.INT64)
    add("test.f32", 0.1, VT.FLOAT32, expect=float(np.float32(0.1)))
    add("test.f64", 0.1, VT.FLOAT64)
    add("test.bool_t", True, VT.BOOL)
    add("test.bool_f", False, VT.BOOL)
    add("test.string", "héllo \"wörld\"\n", VT.STRING)
    add("test.arr_u8", [1, 2, 255], VT.ARRAY, VT.UINT8)
    add("test.arr_i64", [-1, 2**40], VT.ARRAY, VT.INT64)
    add("test.arr_f32", [0.5, -1.25], VT.ARRAY, VT.FLOAT32)
    add("test.arr_str", ["a", "", "ccc"], VT.ARRAY, VT.STRING)
    add("test.arr_bool", [True, False, True], VT.ARRAY, VT.BOOL)
    add("test.nested", [[1, 2], [3], [4, 5, 6]], VT.ARRAY)  # inner arrays of i32
    add("test.nested2", [[["x", "y"]], [["z"]]], VT.ARRAY)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    MANIFEST["gguf_quants_meta"] = meta
    MANIFEST["gguf_quants_arch"] = "testarch"


# ------------------------------------------------------------------ safetensors dtypes (ml_dtypes)

def st_dtypes():
    every = np.arange(256, dtype=np.uint8)
    tensors = {
        "bf16": (RNG.standard_normal(37) * 10).astype(np.float32).astype(ml_dtypes.bfloat16),
        "f16": np.array([0, -0.0, 1, -2.5, 65504, 6e-8, np.inf, np.nan], dtype=np.float16),
        "f32": RNG.standard_normal((2, 3)).astype(np.float32),
        "f64": np.array([1e-300, 0.1, -3.0, 1e300], dtype=np.float64),
        "e4m3": every.view(ml_dtypes.float8_e4m3fn).reshape(16, 16),
        "e5m2": every.view(ml_dtypes.float8_e5m2),
        "e8m0": every.view(ml_dtypes.float8_e8m0fnu),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "u8": np.array([0, 255], dtype=np.uint8),
        "i16": np.array([-32768, 32767], dtype=np.int16),
        "i32": np.array([-5, 16777216], dtype=np.int32),
        "i64": np.array([-7, 1 << 20], dtype=np.int64),
        "bool": np.array([True, False, True]),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    save_file(tensors, out("st_dtypes.safetensors"), metadata={"format": "np", "k": "v"})
    for name, a in tensors.items():
        MANIFEST["st_dtypes"][name] = save_f32(f"expected/st_{name}.f32", a.astype(np.float32))
    # FP4 (E2M1): every code through ml_dtypes, packed low nibble first as checkpoints store it.
    codes = np.arange(16, dtype=np.uint8)
    MANIFEST["fp4_codes"] = save_f32("expected/fp4_codes.f32", codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32))


# ------------------------------------------------------------------ small MLA checkpoints

MINI = dict(hidden=256, heads=4, q_lora=256, kv_lora=256, nope=32, rope=16, v=64, layers=2)


def hf_config(extra=None):
    m = MINI
    c = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": m["hidden"],
         "num_attention_heads": m["heads"], "num_key_value_heads": m["heads"], "q_lora_rank": m["q_lora"],
         "kv_lora_rank": m["kv_lora"], "qk_nope_head_dim": m["nope"], "qk_rope_head_dim": m["rope"],
         "v_head_dim": m["v"], "num_hidden_layers": m["layers"], "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
                          "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
    c.update(extra or {})
    return c


def mla_shapes():
    m = MINI
    H, N, Lq, L, P, R, V = m["hidden"], m["heads"], m["q_lora"], m["kv_lora"], m["nope"], m["rope"], m["v"]
    return {"q_a_proj": (Lq, H), "q_b_proj": (N * (P + R), Lq), "kv_a_proj": (L + R, H),
            "kv_b_proj": (N * (P + V), L), "o_proj": (H, N * V)}


HF_NAMES = {"q_a_proj": "q_a_proj", "q_b_proj": "q_b_proj", "kv_a_proj": "kv_a_proj_with_mqa",
            "kv_b_proj": "kv_b_proj", "o_proj": "o_proj"}
NORMS = {"input_norm": ("input_layernorm", "hidden"), "q_a_norm": ("self_attn.q_a_layernorm", "q_lora"),
         "kv_a_norm": ("self_attn.kv_a_layernorm", "kv_lora")}


def weight(shape):
    return (RNG.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)


def hf_norms(tensors, expected, layer, dtype=ml_dtypes.bfloat16):
    for field, (name, dim) in NORMS.items():
        n = (1 + 0.1 * RNG.standard_normal(MINI[dim])).astype(np.float32).astype(dtype)
        key = f"model.layers.{layer}.{name}.weight"
        tensors[key] = n
        expected[field] = n.astype(np.float32)


def record_model(name, path, expected_layers, layers=MINI["layers"]):
    entry = {"path": path, "layers": layers, "expected": []}
    for l, exp in enumerate(expected_layers):
        entry["expected"].append({f: save_f32(f"expected/{name}.l{l}.{f}.f32", a) for f, a in exp.items()})
    MANIFEST["models"][name] = entry


def e2m1_of(nibbles):
    return (nibbles & 15).astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)


def unpack_fp4(packed):
    """U8 [N, K/2] -> float32 [N, K]; element 2i in the low nibble, 2i+1 in the high one."""
    lo, hi = e2m1_of(packed & 15), e2m1_of(packed >> 4)
    out = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.float32)
    out[:, 0::2], out[:, 1::2] = lo, hi
    return out


def pack_fp4_random(shape):
    return RNG.integers(0, 256, size=(shape[0], shape[1] // 2), dtype=np.uint8)


def hf_fp8():
    """DeepSeek FP8 block-scaled, sharded in two files with model.safetensors.index.json."""
    d = "models/hf_fp8"
    cfg = hf_config({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                             "activation_scheme": "dynamic"}})
    json.dump(cfg, open(out(d, "config.json"), "w"), indent=1)
    shards, weight_map, expected_layers = [{}, {}], {}, []
    for layer in range(MINI["layers"]):
        tensors, exp = shards[layer], {}
        hf_norms(tensors, exp, layer)
        for field, shape in mla_shapes().items():
            w8 = (weight(shape) * 448 / 4).astype(ml_dtypes.float8_e4m3fn)
            sr, sc = -(-shape[0] // 128), -(-shape[1] // 128)
            s = RNG.uniform(0.001, 0.05, size=(sr, sc)).astype(np.float32)
            base = f"model.layers.{layer}.self_attn.{HF_NAMES[field]}"
            tensors[base + ".weight"], tensors[base + ".weight_scale_inv"] = w8, s
            full = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:shape[0], :shape[1]]
            exp[field] = w8.astype(np.float32) * full
        expected_layers.append(exp)
    for i, t in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file(t, out(d, fn))
        weight_map.update({k: fn for k in t})
    json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, open(out(d, "model.safetensors.index.json"), "w"))
    record_model("hf_fp8", d, expected_layers)


def nvfp4(kind):
    """NVFP4: ModelOpt (weight_scale_2 multiplies) or compressed-tensors (weight_global_scale divides)."""
    d = f"models/{kind}"
    if kind == "modelopt_nvfp4":
        cfg = hf_config({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}})
        json.dump({"quantization": {"quant_algo": "NVFP4", "group_size": 16}}, open(out(d, "hf_quant_config.json"), "w"))
    else:
        cfg = hf_config({"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}})
    json.dump(cfg, open(out(d, "config.json"), "w"), indent=1)
    tensors, expected_layers = {}, []
    for layer in range(MINI["layers"]):
        exp = {}
        hf_norms(tensors, exp, layer)
        for field, shape in mla_shapes().items():
            packed = pack_fp4_random(shape)
            scale = RNG.uniform(0.5, 300, size=(shape[0], shape[1] // 16)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
            base = f"model.layers.{layer}.self_attn.{HF_NAMES[field]}"
            s8 = np.repeat(scale.astype(np.float32), 16, axis=1)
            if kind == "modelopt_nvfp4":
                g = np.array(RNG.uniform(1e-5, 1e-3), dtype=np.float32)
                tensors[base + ".weight"], tensors[base + ".weight_scale"] = packed, scale
                tensors[base + ".weight_scale_2"] = g.reshape(())
                tensors[base + ".input_scale"] = np.array(1.0, dtype=np.float32)
                exp[field] = unpack_fp4(packed) * (s8 * g)
            else:
                g = np.array([RNG.uniform(1e3, 1e5)], dtype=np.float32)
                tensors[base + ".weight_packed"], tensors[base + ".weight_scale"] = packed, scale
                tensors[base + ".weight_global_scale"] = g
                exp[field] = unpack_fp4(packed) * (s8 / g[0])
        expected_layers.append(exp)
    save_file(tensors, out(d, "model.safetensors"))
    record_model(kind, d, expected_layers)


def mxfp4():
    d = "models/mxfp4"
    json.dump(hf_config({"quantization_config": {"quant_method": "mxfp4"}}), open(out(d, "config.json"), "w"))
    tensors, expected_layers = {}, []
    for layer in range(MINI["layers"]):
        exp = {}
        hf_norms(tensors, exp, layer, dtype=np.float32)
        for field, shape in mla_shapes().items():
            packed = pack_fp4_random(shape)
            e = RNG.integers(118, 125, size=(shape[0], shape[1] // 32), dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
            base = f"model.layers.{layer}.self_attn.{HF_NAMES[field]}"
            tensors[base + ".weight"], tensors[base + ".weight_scale"] = packed, e
            exp[field] = unpack_fp4(packed) * np.repeat(e.astype(np.float32), 32, axis=1)
        expected_layers.append(exp)
    save_file(tensors, out(d, "model.safetensors"))
    record_model("mxfp4", d, expected_layers)


def hf_bf16_single():
    """One plain BF16 file (no index), q_proj without q LoRA (DeepSeek-V2-Lite style), one layer."""
    d = "models/hf_bf16_noqlora"
    json.dump(hf_config({"q_lora_rank": None, "num_hidden_layers": 1}), open(out(d, "config.json"), "w"))
    tensors, exp = {}, {}
    m = MINI
    for field, (name, dim) in NORMS.items():
        if field == "q_a_norm":
            continue
        n = (1 + 0.1 * RNG.standard_normal(m[dim])).astype(np.float32).astype(ml_dtypes.bfloat16)
        tensors[f"model.layers.0.{name}.weight"] = n
        exp[field] = n.astype(np.float32)
    shapes = mla_shapes()
    shapes.pop("q_a_proj")
    shapes["q_b_proj"] = (m["heads"] * (m["nope"] + m["rope"]), m["hidden"])
    names = dict(HF_NAMES, q_b_proj="q_proj")
    for field, shape in shapes.items():
        w = weight(shape).astype(ml_dtypes.bfloat16)
        tensors[f"model.layers.0.self_attn.{names[field]}.weight"] = w
        exp[field] = w.astype(np.float32)
    save_file(tensors, out(d, "model.safetensors"))
    record_model("hf_bf16_noqlora", d + "/model.safetensors", [exp], layers=1)


DSA = dict(index_topk=8, index_n_heads=2, index_head_dim=32)


def hf_glm_dsa(name="hf_glm_dsa", wq_b_rows=None):
    """GLM-5 style (glm_moe_dsa, BF16): DSA's indexer weights in layer 0 under HF's names; layer 1 "shared" (no
    indexer of its own, index_topk_pattern "FS"). wq_b_rows: a wrong row count for wq_b (inspect must say so)."""
    d = f"models/{name}"
    m = MINI
    json.dump(hf_config(dict(DSA, model_type="glm_moe_dsa", architectures=["GlmMoeDsaForCausalLM"],
                             index_topk_pattern="FS")), open(out(d, "config.json"), "w"))
    tensors, expected_layers = {}, []
    Hi, Di = DSA["index_n_heads"], DSA["index_head_dim"]
    for layer in range(m["layers"]):
        exp = {}
        hf_norms(tensors, exp, layer)
        for field, shape in mla_shapes().items():
            w = weight(shape).astype(ml_dtypes.bfloat16)
            tensors[f"model.layers.{layer}.self_attn.{HF_NAMES[field]}.weight"] = w
            exp[field] = w.astype(np.float32)
        if layer == 0:
            a = "model.layers.0.self_attn.indexer."
            tensors[a + "wq_b.weight"] = weight((wq_b_rows or Hi * Di, m["q_lora"])).astype(ml_dtypes.bfloat16)
            tensors[a + "wk.weight"] = weight((Di, m["hidden"])).astype(ml_dtypes.bfloat16)
            tensors[a + "k_norm.weight"] = np.ones(Di, dtype=np.float32)
            tensors[a + "k_norm.bias"] = np.zeros(Di, dtype=np.float32)
            tensors[a + "weights_proj.weight"] = weight((Hi, m["hidden"])).astype(ml_dtypes.bfloat16)
        expected_layers.append(exp)
    save_file(tensors, out(d, "model.safetensors"))
    if wq_b_rows is None:
        record_model(name, d, expected_layers)
        gguf_glm_dsa(tensors)


def gguf_glm_dsa(hf):
    """The same layer 0 as hf_glm_dsa's (values and indexer) as llama.cpp's glm-dsa GGUF writes it: BF16 tensors
    under blk.0.*, kv_b split into attn_k_b / attn_v_b, the indexer under blk.0.indexer.{attn_q_b,attn_k,k_norm,proj};
    the indexer's constants in glm-dsa.attention.indexer.*. One layer (a shared layer has no GGUF spelling)."""
    m = MINI
    H, N, Lq, L, P, R, V = m["hidden"], m["heads"], m["q_lora"], m["kv_lora"], m["nope"], m["rope"], m["v"]
    w = gguf.GGUFWriter(out("models/gguf_glm_dsa.gguf"), "glm-dsa")
    w.add_block_count(1)
    w.add_embedding_length(H)
    w.add_head_count(N)
    w.add_head_count_kv(1)
    w.add_uint32("glm-dsa.attention.q_lora_rank", Lq)
    w.add_uint32("glm-dsa.attention.kv_lora_rank", L)
    w.add_rope_dimension_count(R)
    w.add_key_length(L + R)
    w.add_value_length(L)
    w.add_uint32("glm-dsa.attention.key_length_mla", P + R)
    w.add_uint32("glm-dsa.attention.value_length_mla", V)
    w.add_float32("glm-dsa.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_string("glm-dsa.rope.scaling.type", "yarn")
    w.add_float32("glm-dsa.rope.scaling.factor", 4.0)
    w.add_uint32("glm-dsa.rope.scaling.original_context_length", 64)
    w.add_float32("glm-dsa.rope.scaling.yarn_log_multiplier", 0.1)
    w.add_uint32("glm-dsa.attention.indexer.top_k", DSA["index_topk"])
    w.add_uint32("glm-dsa.attention.indexer.head_count", DSA["index_n_heads"])
    w.add_uint32("glm-dsa.attention.indexer.key_length", DSA["index_head_dim"])
    a = "model.layers.0."

    def put(name, arr):
        arr = np.ascontiguousarray(arr)
        if arr.dtype == ml_dtypes.bfloat16:
            w.add_tensor(name, arr.view(np.uint16), raw_dtype=QT.BF16)
        else:
            w.add_tensor(name, arr.astype(np.float32))

    put("blk.0.attn_norm.weight", hf[a + "input_layernorm.weight"])
    put("blk.0.attn_q_a_norm.weight", hf[a + "self_attn.q_a_layernorm.weight"])
    put("blk.0.attn_kv_a_norm.weight", hf[a + "self_attn.kv_a_layernorm.weight"])
    for gname, hname in [("attn_q_a", "q_a_proj"), ("attn_q_b", "q_b_proj"), ("attn_kv_a_mqa", "kv_a_proj_with_mqa"),
                         ("attn_output", "o_proj")]:
        put(f"blk.0.{gname}.weight", hf[a + f"self_attn.{hname}.weight"])
    kv = hf[a + "self_attn.kv_b_proj.weight"].reshape(N, P + V, L)
    put("blk.0.attn_k_b.weight", kv[:, :P, :].transpose(0, 2, 1))  # [N, L, P] as convert_hf_to_gguf.py
    put("blk.0.attn_v_b.weight", kv[:, P:, :])                      # [N, V, L]
    for gname, hname in [("attn_q_b.weight", "wq_b.weight"), ("attn_k.weight", "wk.weight"),
                         ("k_norm.weight", "k_norm.weight"), ("k_norm.bias", "k_norm.bias"),
                         ("proj.weight", "weights_proj.weight")]:
        put(f"blk.0.indexer.{gname}", hf[a + f"self_attn.indexer.{hname}"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    MANIFEST["models"]["gguf_glm_dsa"] = {"path": "models/gguf_glm_dsa.gguf", "same_as": "hf_glm_dsa", "layers": 1}


def gguf_model(name, types, split_kv_b):
    """A deepseek2 GGUF. types: field -> ggml type for the projections (random finite blocks for K-quants)."""
    m = MINI
    H, N, Lq, L, P, R, V = m["hidden"], m["heads"], m["q_lora"], m["kv_lora"], m["nope"], m["rope"], m["v"]
    path = f"models/{name}.gguf"
    w = gguf.GGUFWriter(out(path), "deepseek2")
    w.add_block_count(m["layers"])
    w.add_embedding_length(H)
    w.add_head_count(N)
    w.add_head_count_kv(N if not split_kv_b else 1)
    w.add_uint32("deepseek2.attention.q_lora_rank", Lq)
    w.add_uint32("deepseek2.attention.kv_lora_rank", L)
    w.add_rope_dimension_count(R)
    if split_kv_b:  # llama.cpp's layout for the absorbed form: key/value_length describe the latent
        w.add_key_length(L + R)
        w.add_value_length(L)
        w.add_uint32("deepseek2.attention.key_length_mla", P + R)
        w.add_uint32("deepseek2.attention.value_length_mla", V)
    else:
        w.add_key_length(P + R)
        w.add_value_length(V)
    w.add_float32("deepseek2.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_string("deepseek2.rope.scaling.type", "yarn")
    w.add_float32("deepseek2.rope.scaling.factor", 4.0)
    w.add_uint32("deepseek2.rope.scaling.original_context_length", 64)
    w.add_float32("deepseek2.rope.scaling.yarn_log_multiplier", 0.1)
    gguf_names = {"q_a_proj": "attn_q_a", "q_b_proj": "attn_q_b", "kv_a_proj": "attn_kv_a_mqa",
                  "kv_b_proj": "attn_kv_b", "o_proj": "attn_output"}
    # Scale fields for random K-quant blocks, magnitudes chosen so weights are ~1/sqrt(fan_in).
    kq = {QT.Q4_K: ([0, 2], (1e-4, 4e-4)), QT.Q6_K: ([208], (2e-5, 8e-5)), QT.Q5_K: ([0, 2], (5e-5, 2e-4)),
          QT.Q2_K: ([80, 82], (1e-3, 4e-3)), QT.Q3_K: ([108], (1e-3, 3e-3))}
    expected_layers = []

    def put(tname, a32, qt):
        """Write a float32 tensor [.., cols] as qt; return what gguf dequantizes it to."""
        if qt == QT.F32:
            w.add_tensor(tname, a32)
            return a32
        if qt == QT.F16:
            h = a32.astype(np.float16)
            w.add_tensor(tname, h)
            return gguf.quants.dequantize(h, QT.F16)
        if qt in kq:
            fields, rng = kq[qt]
            q = random_blocks(qt, int(np.prod(a32.shape[:-1])), a32.shape[-1], fields, rng)
            q = q.reshape(*a32.shape[:-1], -1)
        else:
            q = gguf.quants.quantize(a32, qt)
        w.add_tensor(tname, q, raw_dtype=qt)
        return gguf.quants.dequantize(q, qt)

    for layer in range(m["layers"]):
        exp = {}
        b = f"blk.{layer}."
        for field, tname, n in [("input_norm", "attn_norm", H), ("q_a_norm", "attn_q_a_norm", Lq),
                                ("kv_a_norm", "attn_kv_a_norm", L)]:
            exp[field] = put(b + tname + ".weight", (1 + 0.1 * RNG.standard_normal(n)).astype(np.float32), QT.F32)
        for field, shape in mla_shapes().items():
            qt = types.get(field, QT.F32)
            if field == "kv_b_proj" and split_kv_b:
                kv = weight(shape).reshape(N, P + V, L)
                k_b = np.ascontiguousarray(kv[:, :P, :].transpose(0, 2, 1))  # [N, L, P] as convert_hf_to_gguf.py
                v_b = np.ascontiguousarray(kv[:, P:, :])                      # [N, V, L]
                kd = put(b + "attn_k_b.weight", k_b, types.get("k_b", QT.F32)).reshape(N, L, P)
                vd = put(b + "attn_v_b.weight", v_b, types.get("v_b", QT.F32)).reshape(N, V, L)
                exp[field] = np.concatenate([kd.transpose(0, 2, 1), vd], axis=1).reshape(N * (P + V), L)
                continue
            exp[field] = put(b + gguf_names[field] + ".weight", weight(shape), qt).reshape(shape)
        expected_layers.append(exp)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    record_model(name, path, expected_layers)


def main():
    os.makedirs(OUT, exist_ok=True)
    gguf_quants()
    st_dtypes()
    hf_fp8()
    nvfp4("modelopt_nvfp4")
    nvfp4("ct_nvfp4")
    mxfp4()
    hf_bf16_single()
    hf_glm_dsa()
    hf_glm_dsa("hf_glm_dsa_bad_indexer", wq_b_rows=48)
    gguf_model("gguf_kmix", {"q_a_proj": QT.Q4_K, "q_b_proj": QT.Q6_K, "kv_a_proj": QT.Q4_K, "kv_b_proj": QT.Q6_K,
                             "o_proj": QT.Q5_K}, split_kv_b=False)
    gguf_model("gguf_split", {"q_a_proj": QT.Q8_0, "q_b_proj": QT.Q4_0, "kv_a_proj": QT.Q5_1, "k_b": QT.F16,
                              "v_b": QT.Q8_0, "o_proj": QT.Q4_1}, split_kv_b=True)
    json.dump(MANIFEST, open(out("manifest.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
