"""Faults modelled on bugs reported against serving stacks and model ports, each planted in the numpy MLA layer
(mla_numpy.MLA) by replacing one of its steps, with the answer expected from `mla-bisect replay` written beside it
before any run:

  stage     the stage of the first divergent probe (the stage that introduced the error), or None for a fault that
            must replay clean (a benign one)
  expected  the catalogue classes that name the fault correctly (any one of them, listed first among the confirmed),
            or None: no class models the fault, so the right answer is that nothing is confirmed

`source` is the public thread the fault is modelled on; `project` names whose thread it is (the serving stacks and
libraries named in the brief where a thread from them was found, otherwise the project the thread belongs to).

Every fault runs on a config of checkpoints.CONFIGS and a scenario: seq_lens (new tokens per sequence), context
(cached tokens per sequence before the step), tp, and optionally rows of h scaled (large activations)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from .mla_numpy import to_bf16, yarn_get_mscale


@dataclass
class Fault:
    name: str
    source: str
    project: str
    what: str
    config: str
    apply: Callable
    stage: Optional[str]
    expected: Optional[frozenset]
    seq_lens: tuple = (9, 7)
    context: Optional[tuple] = None
    tp: int = 1
    dtype: str = "fp32"
    h_scale_rows: dict = field(default_factory=dict)


FAULTS: list = []


def fault(name, source, project, config, stage, expected, **scenario):
    """Registers the decorated function (it takes an MLA instance and replaces some of its steps)."""
    def register(fn):
        FAULTS.append(Fault(name=name, source=source, project=project, what=(fn.__doc__ or "").strip(),
                            config=config, apply=fn, stage=stage,
                            expected=frozenset(expected) if expected is not None else None, **scenario))
        return fn
    return register


def _token_layout(batch):
    """Per token of the step: its sequence and its index among the sequence's new tokens."""
    seq, idx = [], []
    for b, n in enumerate(batch.seq_lens):
        seq += [b] * n
        idx += list(range(n))
    return np.array(seq), np.array(idx)


# ---------------------------------------------------------------------------------------------------------- rope

@fault("rope_rotate_half_on_interleaved", "https://github.com/ModelTC/LightLLM/pull/672", "LightLLM",
       "v3_yarn", "rope", {"rope.layout"})
def rope_rotate_half_on_interleaved(m):
    """q_pe and k_pe of an interleaved-lane DeepSeek checkpoint rotated with rotate-half pairs (i, i+R/2), the
    neox flag of the rotary kernel set the wrong way."""
    m.rope_pairs = lambda which: False


@fault("rope_interleaved_on_neox", "https://github.com/ml-explore/mlx-lm/pull/1431", "mlx-lm",
       "v3_neox", "rope", {"rope.layout"})
def rope_interleaved_on_neox(m):
    """A checkpoint whose rope lanes are rotate-half (rope_interleave false) rotated as interleaved pairs
    (the `traditional` switch of the rope call flipped)."""
    m.rope_pairs = lambda which: True


@fault("rope_positions_plus_one", "https://github.com/GeeeekExplorer/nano-vllm/pull/67", "nano-vllm",
       "v3_yarn", "rope", {"rope.position_offset"})
def rope_positions_plus_one(m):
    """Positions built 1-based: every token rotated one position on (q and k alike)."""
    orig = m.rope_positions
    m.rope_positions = lambda which, batch: orig(which, batch) + 1


@fault("rope_positions_restart_in_chunk", "https://github.com/huggingface/transformers/issues/43082",
       "transformers", "v3_yarn", "rope", {"rope.positions_restart"}, seq_lens=(4, 4), context=(10, 20))
def rope_positions_restart_in_chunk(m):
    """Chunked prefill: position_ids taken as the chunk's own indices, so the second chunk's rope restarts at 0
    instead of continuing after the cached tokens."""
    orig = m.rope_positions

    def positions(which, batch):
        if not any(batch.context_lens):
            return orig(which, batch)
        seq, idx = _token_layout(batch)
        return idx.astype(np.float64)
    m.rope_positions = positions


@fault("rope_positions_over_packed_batch", "https://github.com/vllm-project/vllm-metal/pull/151", "vLLM",
       "v3_yarn", "rope", {"rope.positions_global"}, seq_lens=(9, 7))
def rope_positions_over_packed_batch(m):
    """Several prompts packed into one prefill: positions counted over the packed tokens instead of restarting
    at 0 for each request."""
    def positions(which, batch):
        return np.arange(batch.T, dtype=np.float64)
    m.rope_positions = positions


@fault("rope_theta_default_base", "https://github.com/ggml-org/llama.cpp/issues/3090", "llama.cpp",
       "kimi_k2", "rope", {"rope.theta"})
def rope_theta_default_base(m):
    """The model's rope base (5e4 for Kimi-K2) not read: the loader's default 1e4 used instead."""
    m.theta = 10000.0


@fault("rope_yarn_dropped", "https://github.com/vllm-project/vllm/pull/57563", "vLLM",
       "v3_yarn", "rope", {"rope.yarn_off"}, seq_lens=(16,))
def rope_yarn_dropped(m):
    """The YaRN block of the config lost on the way into the rotary embedding (plain inv_freq, no cos/sin
    factor); the softmax scale still carries its mscale^2."""
    theta, R = m.theta, m.R

    def plain():
        return 1.0 / theta ** (np.arange(0, R, 2, dtype=np.float64) / R)
    m.rope_inv_freq = plain
    m.rope_attention_factor = lambda: 1.0


@fault("rope_cos_sin_times_mscale", "https://github.com/ggml-org/llama.cpp/issues/7118", "llama.cpp",
       "v2_lite", "rope", {"rope.mscale"})
def rope_cos_sin_times_mscale(m):
    """DeepSeek-V2's YaRN: cos and sin multiplied by 0.1*ln(s)*mscale + 1 where the model divides it by the
    same factor for mscale_all_dim (a ratio of exactly 1 for V2-Lite)."""
    s, mscale = float(m.yarn["factor"]), float(m.yarn["mscale"])
    m.rope_attention_factor = lambda: yarn_get_mscale(s, mscale)


@fault("rope_k_not_written_back", "https://github.com/kvcache-ai/sglang/pull/31", "SGLang (kvcache-ai fork)",
       "v3_yarn", "rope", {"rope.not_applied"})
def rope_k_not_written_back(m):
    """A fused rope + cache-store kernel that writes the rotated k only into the cache: the attention consumes
    the unrotated k_pe (q is rotated)."""
    orig_rope = m.rope
    stash = {}

    def rope(which, t, batch):
        out = orig_rope(which, t, batch)
        if which != "k":
            return out
        stash["k"] = out
        return np.asarray(t, np.float32)
    m.rope = rope
    orig_row = m.cache_row
    m.cache_row = lambda kv_c_norm, k_pe_rope, k_pe: orig_row(kv_c_norm, m.out(stash["k"]), k_pe)


# ------------------------------------------------------------------------------------------------------ attention

@fault("attn_scale_without_mscale2", "https://github.com/huggingface/transformers/pull/47435", "transformers",
       "v3_yarn", "attention_mha", {"attn.scale"}, seq_lens=(16,))
def attn_scale_without_mscale2(m):
    """The softmax scale left at 1/sqrt(qk_head_dim): YaRN's mscale(s, mscale_all_dim)^2 never applied."""
    m.softmax_scale = lambda: 1.0 / math.sqrt(m.D)


@fault("attn_scale_without_mscale2_v2_lite", "https://github.com/vllm-project/tpu-inference/pull/521",
       "vLLM (tpu-inference)", "v2_lite", "attention_mha", {"attn.scale"}, seq_lens=(9, 7))
def attn_scale_without_mscale2_v2_lite(m):
    """DeepSeek-V2-Lite served with the plain 1/sqrt(D) attention scale instead of the YaRN-based one."""
    m.softmax_scale = lambda: 1.0 / math.sqrt(m.D)


@fault("attn_scale_inverted", "https://github.com/AI-Hypercomputer/maxtext/issues/1370", "MaxText",
       "v3_neox", "attention_mha", {"attn.scale"}, seq_lens=(16,))
def attn_scale_inverted(m):
    """The MLA softmax scale's exponent sign lost: scores multiplied by sqrt(qk_head_dim)."""
    m.softmax_scale = lambda: math.sqrt(m.D)


@fault("attn_causal_one_key_ahead", "https://github.com/flashinfer-ai/flashinfer/pull/348", "FlashInfer",
       "v3_yarn", "attention_mha", {"attn.causal_shift"}, seq_lens=(9, 7))
def attn_causal_one_key_ahead(m):
    """The causal mask's comparison off by one (kv_idx > ... where >= belongs): each query also sees the key
    right after it."""
    def visible(q_seq, q_idx, q_ctx, k_seq, k_idx):
        return (q_seq[:, None] == k_seq[None, :]) & (k_idx[None, :] <= q_idx[:, None] + 1)
    m.visible = visible


@fault("attn_causal_top_left_with_cache", "https://github.com/Dao-AILab/flash-attention/issues/402",
       "flash-attention", "v3_yarn", "attention_mha", {"attn.top_left"}, seq_lens=(4, 4), context=(10, 20))
def attn_causal_top_left_with_cache(m):
    """Chunked prefill through a kernel whose causal mask is aligned top-left when seqlen_q != seqlen_k: new
    token i sees keys 0..i of the whole key sequence, most of the cached context hidden."""
    def visible(q_seq, q_idx, q_ctx, k_seq, k_idx):
        i = q_idx - q_ctx
        return (q_seq[:, None] == k_seq[None, :]) & (k_idx[None, :] <= i[:, None])
    m.visible = visible


@fault("attn_no_mask_vanilla_path", "https://github.com/Tencent-Hunyuan/HunyuanVideo/pull/310", "HunyuanVideo",
       "v3_neox", "attention_mha", {"attn.causal_off"}, seq_lens=(16,))
def attn_no_mask_vanilla_path(m):
    """A fallback attention path that builds no mask at all: every token of the prompt sees every other."""
    def visible(q_seq, q_idx, q_ctx, k_seq, k_idx):
        return q_seq[:, None] == k_seq[None, :]
    m.visible = visible


@fault("attn_packed_requests_leak", "https://github.com/vllm-project/vllm-metal/pull/151", "vLLM",
       "v3_yarn", "attention_mha", {"attn.varlen_leak"}, seq_lens=(9, 7))
def attn_packed_requests_leak(m):
    """Packed prefill of two requests under one causal mask (no block-diagonal split at cu_seqlens): the second
    request's tokens attend to the first request's keys."""
    def visible(q_seq, q_idx, q_ctx, k_seq, k_idx):
        offsets = np.cumsum([0] + [int((k_seq == b).sum()) for b in range(int(k_seq.max()) + 1)])
        qg = offsets[q_seq] + q_idx
        kg = offsets[k_seq] + k_idx
        return kg[None, :] <= qg[:, None]
    m.visible = visible


@fault("attn_window_on_full_attention", "https://github.com/vllm-project/vllm/issues/49795", "vLLM",
       "v3_yarn", "attention_mha", {"attn.window"}, seq_lens=(16,))
def attn_window_on_full_attention(m):
    """A sliding_window from the config applied to every layer although all are full attention (window 6 here):
    keys more than 6 back are dropped."""
    def visible(q_seq, q_idx, q_ctx, k_seq, k_idx):
        d = q_idx[:, None] - k_idx[None, :]
        return (q_seq[:, None] == k_seq[None, :]) & (d >= 0) & (d < 6)
    m.visible = visible


@fault("attn_probs_bf16", "https://github.com/huggingface/optimum-habana/pull/396", "optimum-habana",
       "v3_yarn", "attention_mha", {"attn.probs_lowp"}, seq_lens=(16,))
def attn_probs_bf16(m):
    """The softmax run (and its probabilities kept) in bf16 before the weighted sum of values, in an otherwise
    fp32 forward."""
    orig = m.softmax

    def softmax(s, mask):
        p, lse = orig(s, mask)
        return to_bf16(p), lse
    m.softmax = softmax


@fault("attn_lse_returned_base2", "https://github.com/sgl-project/sglang/pull/35045", "SGLang",
       "v3_yarn", "attention_mha", {"attn.lse_base2"}, seq_lens=(9, 7))
def attn_lse_returned_base2(m):
    """The attention kernel returns its log-sum-exp in base 2 (log2 of sum 2^x of log2(e)-scaled scores), the
    FlashInfer convention, where natural log is expected; the output itself is right."""
    orig = m.attend

    def attend(q, k, v, mask, scale, ctx_keys):
        o, lse = orig(q, k, v, mask, scale, ctx_keys)
        return o, (lse / np.float32(math.log(2.0))).astype(np.float32)
    m.attend = attend


@fault("attn_merge_reads_base2_lse", "https://github.com/sgl-project/sglang/issues/40903", "SGLang",
       "v3_yarn", "attention_mha", {"attn.lse_base2", "attn.merge_base2"}, seq_lens=(4, 4), context=(10, 20))
def attn_merge_reads_base2_lse(m):
    """Chunked prefill with a cached prefix: the prefix and the new tokens are attended separately and merged
    with 2^x / log2 on natural-log LSEs, which weighs the two states wrongly. (The expected set was written as
    attn.lse_base2; attn.merge_base2, a catalogue entry for exactly this merge, was added to it when the
    catalogue gained that class.)"""
    def attend(q, k, v, mask, scale, ctx_keys):
        s = m.logits(q, k, scale)
        mn = mask & ~ctx_keys[None, :]
        mc = mask & ctx_keys[None, :]
        pn, ln = m.softmax(s, mn)
        pc, lc = m.softmax(s, mc)
        on, oc = m.weighted(pn, v), m.weighted(pc, v)
        mx = np.maximum(ln, lc)
        mx = np.where(np.isfinite(mx), mx, 0.0)
        wn, wc = np.exp2(ln - mx), np.exp2(lc - mx)
        tot = wn + wc
        w = (wn / tot).T[..., None].astype(np.float32)  # [T, N, 1]
        o = w * on + (1.0 - w) * np.nan_to_num(oc)
        lse = (mx + np.log2(tot)).astype(np.float32)
        return o.astype(np.float32), lse
    m.attend = attend


@fault("attn_context_not_attended", "https://github.com/flashinfer-ai/flashinfer/issues/3047", "FlashInfer",
       "v3_yarn", "attention_mha", {"attn.context_missing"}, seq_lens=(4, 4), context=(10, 20))
def attn_context_not_attended(m):
    """Chunked prefill whose prefix-chunk attention comes back empty: the new tokens attend only among
    themselves, the cached context never read."""
    orig = m.visible

    def visible(q_seq, q_idx, q_ctx, k_seq, k_idx):
        ctx_of_key = np.zeros_like(k_idx)
        for b in np.unique(q_seq):
            ctx_of_key[k_seq == b] = q_ctx[q_seq == b][0]
        return orig(q_seq, q_idx, q_ctx, k_seq, k_idx) & (k_idx >= ctx_of_key)[None, :]
    m.visible = visible


@fault("attn_decode_context_not_attended", "https://github.com/huggingface/candle/pull/3743", "candle",
       "v2_lite", "attention_mha", {"attn.context_missing"}, seq_lens=(1, 1), context=(12, 70))
def attn_decode_context_not_attended(m):
    """A decode step whose mask is built for the new tokens only, without the cached prefix: each new token
    attends to itself alone."""
    attn_context_not_attended(m)


# ---------------------------------------------------------------------------------------------------------- norms

@fault("input_norm_fp16_sum_of_squares", "https://github.com/vllm-project/vllm/pull/13232", "vLLM",
       "v2_lite", "input_norm", {"norm.fp16_overflow"}, seq_lens=(16,), dtype="fp16",
       h_scale_rows={3: 400.0, 11: 300.0})
def input_norm_fp16_sum_of_squares(m):
    """DeepSeek-V2 served in fp16: hidden states past fp16's range in a few tokens, and an RMSNorm that squares
    and sums in fp16, so those rows' mean square overflows to inf and the row comes out zero."""
    orig = m.rms_norm

    def rms_norm(name, x, w):
        if name != "input_layernorm":
            return orig(name, x, w)
        x16 = np.asarray(x, np.float32).astype(np.float16)
        with np.errstate(over="ignore"):
            ms = np.mean((x16 * x16).astype(np.float16), axis=-1, keepdims=True, dtype=np.float16)
        r = (np.float16(1.0) / np.sqrt(ms + np.float16(m.eps))).astype(np.float32)
        return np.asarray(x, np.float32) * r * w
    m.rms_norm = rms_norm


@fault("kv_norm_eps_default_benign", "https://github.com/huggingface/transformers/pull/44346", "transformers",
       "glm5_dsa", None, None, seq_lens=(8, 8))
def kv_norm_eps_default_benign(m):
    """q_a_layernorm and kv_a_layernorm built without the config's rms_norm_eps (1e-5 for GLM): the class
    default 1e-6 used. Against activations of unit scale this changes outputs by ~1e-6 of their norm: a right
    tool does not flag it at fp32 tolerances (benign)."""
    orig = m.norm_eps
    m.norm_eps = lambda name: 1e-6 if name in ("q_a_layernorm", "kv_a_layernorm") else orig(name)


@fault("kv_norm_left_out", "https://github.com/hw-native-sys/pypto-lib/pull/134", "pypto-lib",
       "v3_yarn", "kv_a_norm", {"norm.skipped"})
def kv_norm_left_out(m):
    """The latent written to the cache and up-projected without kv_a_layernorm: kv_c passed on as kv_c_norm."""
    orig = m.rms_norm
    m.rms_norm = lambda name, x, w: np.asarray(x, np.float32) if name == "kv_a_layernorm" else orig(name, x, w)


@fault("q_norm_one_plus_weight", "https://github.com/llmmanorg/llmman/pull/151", "llmman",
       "v3_yarn", "q_a_norm", {"norm.weight_plus_one"})
def q_norm_one_plus_weight(m):
    """An RMSNorm helper with the (1 + weight) convention (Gemma, Qwen3.5) used for DeepSeek's q_a_layernorm,
    whose weights are direct multipliers."""
    orig = m.rms_norm
    m.rms_norm = lambda name, x, w: orig(name, x, 1.0 + w) if name == "q_a_layernorm" else orig(name, x, w)


@fault("kv_norm_layernorm_module", "https://github.com/pytorch/pytorch/pull/133085", "PyTorch",
       "v3_neox", "kv_a_norm", {"norm.layernorm"})
def kv_norm_layernorm_module(m):
    """kv_a_layernorm swapped for a LayerNorm module (the mean subtracted before scaling) in a port that used a
    framework norm in place of the model's RMSNorm."""
    orig = m.rms_norm

    def rms_norm(name, x, w):
        if name != "kv_a_layernorm":
            return orig(name, x, w)
        return m.layer_norm(x, w, np.zeros_like(w), eps=m.eps)
    m.rms_norm = rms_norm


# ---------------------------------------------------------------------------------------------------- projections

@fault("kv_a_weight_read_transposed", "https://github.com/vllm-project/vllm-ascend/pull/3850", "vLLM (Ascend)",
       "v3_yarn", "kv_a_proj", {"proj.transposed"})
def kv_a_weight_read_transposed(m):
    """kv_a_proj_with_mqa's weight handed to a fused kernel in [in, out] memory order where [out, in] is read
    (a .t() missing around a weight rearrangement)."""
    w = m.W["self_attn.kv_a_proj_with_mqa.weight"]
    out_dim, in_dim = w.shape
    m.W = dict(m.W)
    m.W["self_attn.kv_a_proj_with_mqa.weight"] = np.ascontiguousarray(w.T).reshape(out_dim, in_dim)


@fault("tp_rank1_loads_rank0_heads", "https://github.com/NVIDIA/TensorRT-LLM/pull/9984", "TensorRT-LLM",
       "v3_yarn", "q_b_proj", {"proj.heads_permuted"}, seq_lens=(16,), tp=2)
def tp_rank1_loads_rank0_heads(m):
    """Tensor parallelism 2: the sharder cuts q_b_proj at the wrong head offset, so rank 1 computes with rank
    0's head block."""
    orig = m.shard_rows

    def shard_rows(name, rank):
        if name == "q_b_proj":
            return orig(name, 0)
        return orig(name, rank)
    m.shard_rows = shard_rows


@fault("o_proj_block_scales_transposed", "https://github.com/vllm-project/vllm/pull/50204", "vLLM",
       "v3_yarn", "o_proj", {"proj.block_scale"})
def o_proj_block_scales_transposed(m):
    """A block-quantized o_proj ([64, 48] in 4 x 4 blocks of 16 x 12) dequantized with its scale grid read
    transposed (the scale of block (j, i) applied to block (i, j)); square grids load without complaint."""
    w = m.W["self_attn.o_proj.weight"]
    rng = np.random.default_rng(11)
    s = np.exp2(rng.integers(-2, 3, size=(4, 4))).astype(np.float32)
    ratio = np.kron(s.T / s, np.ones((16, 12), np.float32))
    m.W = dict(m.W)
    m.W["self_attn.o_proj.weight"] = (w * ratio).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------- cache

@fault("cache_stores_unrotated_k_pe", "https://github.com/EleutherAI/gpt-neox/pull/363", "GPT-NeoX",
       "v3_yarn", "cache_write", {"cache.k_pe_unrotated"})
def cache_stores_unrotated_k_pe(m):
    """The cache written with k_pe before its rotation (the attention of this step uses the rotated one)."""
    m.cache_row = lambda kv_c_norm, k_pe_rope, k_pe: np.concatenate([kv_c_norm, k_pe], axis=-1)


@fault("cache_fp8_scale_missing", "https://github.com/vllm-project/vllm/pull/11947", "vLLM",
       "v3_yarn", "cache_write", {"cache.fp8"})
def cache_fp8_scale_missing(m):
    """An fp8 (e4m3) latent cache whose per-tensor scale is not remapped on load: rows stored as fp8 of x/scale
    and read back without multiplying the scale."""
    import ml_dtypes

    orig = m.cache_row

    def row(kv_c_norm, k_pe_rope, k_pe):
        r = np.asarray(orig(kv_c_norm, k_pe_rope, k_pe), np.float32)
        scale = np.float32(np.max(np.abs(r)) / 448.0)
        return (r / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    m.cache_row = row


@fault("cache_rope_lanes_first", "https://github.com/ggml-org/llama.cpp/pull/12801", "llama.cpp",
       "v3_yarn", "cache_write", {"cache.parts_swapped"})
def cache_rope_lanes_first(m):
    """The latent row laid out [k_pe_rope | kv_c_norm] (llama.cpp's order, rope first) where the consumer
    expects [kv_c_norm | k_pe_rope]."""
    m.cache_row = lambda kv_c_norm, k_pe_rope, k_pe: np.concatenate([k_pe_rope, kv_c_norm], axis=-1)


# ------------------------------------------------------------------------------------------------------------ DSA

@fault("dsa_indexer_rope_half_split", "https://github.com/vllm-project/vllm/pull/28968", "vLLM",
       "glm5_dsa", "indexer_q", {"dsa.index_rope_layout"}, seq_lens=(12,))
def dsa_indexer_rope_half_split(m):
    """The indexer's rope with the other pairing than the model's (half-split pairs on GLM-5's interleaved
    indexer lanes): the DeepSeek-V3.2 indexer-rope fix applied to the wrong model."""
    orig = m.rope_pairs
    m.rope_pairs = lambda which: (not orig(which)) if which.startswith("idx") else orig(which)


def by_name():
    return {f.name: f for f in FAULTS}
