"""A second set of faults for the outside measure, planted in the numpy MLA layer (mla_numpy.MLA) like faults.py's,
each modelled on a public bug thread (`source`) and carrying its expected answer, written before any run:

  stage     the stage of the first divergent probe, or None for a fault that must replay clean
  expected  the catalogue classes that name the fault (any one of them, listed first among the confirmed), or None:
            no class models the fault, and the right answer is a divergence at `stage` with nothing confirmed

This set covers long positions (bf16 positions, a YaRN factor), q and k rotated differently, scores overflowing fp16,
a softmax scale from another head dim, kv_b_proj's split, heads reversed or interleaved, a rank missing from the
all-reduce, the residual, DSA's indexer and top-k, FP8 block scales on a 128 x 128 grid, and faults no class models
(a stale buffer in half the heads, sign flips in a few channels, a partial rotary, the residual counted twice, a bug
upstream of the layer). Faults captured from an HF transformers model are in hf_faults.py."""
from __future__ import annotations

import math

import numpy as np

from .faults import Fault
from .mla_numpy import MLA, make_batch

FAULTS_MORE: list = []


def fault(name, source, project, config, stage, expected, **scenario):
    def register(fn):
        FAULTS_MORE.append(Fault(name=name, source=source, project=project, what=(fn.__doc__ or "").strip(),
                                 config=config, apply=fn, stage=stage,
                                 expected=frozenset(expected) if expected is not None else None, **scenario))
        return fn
    return register


def _block_ratio(w_shape, block_rows, ratio_of_block):
    """[out, in] factors: ratio_of_block(row, col_block) for each row and 128-column block."""
    out_dim, in_dim = w_shape
    r = np.ones(w_shape, np.float32)
    for row in range(out_dim):
        for cb in range((in_dim + 127) // 128):
            r[row, cb * 128:(cb + 1) * 128] = ratio_of_block(row, cb)
    return r


# ---------------------------------------------------------------------------------------------------------- rope

@fault("rope_positions_bf16_long_context", "https://github.com/huggingface/candle/pull/3520", "candle",
       "v3_neox", "rope", {"rope.positions_bf16"}, seq_lens=(4, 4), context=(301, 517))
def rope_positions_bf16_long_context(m):
    """The rope's position vector cast to bf16 before the angle matmul: past 256 integer positions round to the
    nearest even (past 512 to a multiple of 4), so a chunk after 301 and 517 cached tokens is rotated at the wrong
    positions (the cached rows were written by the same rope)."""
    from .mla_numpy import to_bf16
    orig = m.rope_positions
    m.rope_positions = lambda which, batch: to_bf16(orig(which, batch)).astype(np.float64)


@fault("rope_yarn_factor_from_other_checkpoint", "https://github.com/ikawrakow/ik_llama.cpp/issues/1298",
       "ik_llama.cpp", "v3_yarn", "rope", {"rope.yarn_factor"}, seq_lens=(4, 4), context=(300, 700))
def rope_yarn_factor_from_other_checkpoint(m):
    """The rotary cache built with YaRN factor 32 (another checkpoint's rope_scaling) where the model's is 40; the
    softmax scale keeps the model's mscale. Visible at long positions, in the interpolated low frequencies."""
    m.yarn = dict(m.yarn, factor=32.0)


@fault("rope_k_rotated_with_negated_sin", "https://github.com/huggingface/transformers/issues/30900",
       "transformers", "v3_yarn", "rope", {"rope.direction"})
def rope_k_rotated_with_negated_sin(m):
    """k rotated with -sin (the angle's sign put in front of k's rotation, as proposed in the thread) while q keeps
    +sin: q and k rotated differently; rope.direction applied to k alone is this rotation."""
    orig = m.rope_cos_sin

    def cos_sin(which, pos):
        c, s = orig(which, pos)
        return (c, -s) if which == "k" else (c, s)
    m.rope_cos_sin = cos_sin


@fault("rope_partial_rotary_half_lanes", "https://github.com/AI-Hypercomputer/maxtext/issues/4616", "MaxText",
       "v3_neox", "rope", None, seq_lens=(16,))
def rope_partial_rotary_half_lanes(m):
    """A partial_rotary_factor of 0.5 applied to a model that rotates all its rope lanes: only the first R/2 lanes
    rotated (rotate-half pairs within them, frequencies over R/2), the rest passed through. No class models it."""
    R = m.R

    def rope(which, t, batch):
        t = np.asarray(t, np.float32)
        half = R // 2
        pos = np.asarray(m.rope_positions(which, batch), np.float64)
        freq = 1.0 / m.theta ** (np.arange(0, half, 2, dtype=np.float64) / half)
        ang = np.outer(pos, freq)
        out = t.copy()
        out[..., :half] = m.rotate(t[..., :half], np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32),
                                   False)
        return out
    m.rope = rope


# ------------------------------------------------------------------------------------------------------ attention

@fault("attn_scores_fp16_overflow", "https://github.com/huggingface/transformers/pull/33317", "transformers",
       "v3_hot", "attention_mha", {"attn.fp16_overflow"}, seq_lens=(9, 7), dtype="fp16")
def attn_scores_fp16_overflow(m):
    """An eager attention in fp16 that forms q.k in the activation dtype before the softmax scale: with q and k
    entries near 100 the raw scores pass 65504 and become inf (the rows with one come out NaN)."""
    def logits(q, k, scale):
        raw = np.einsum("tnd,knd->ntk", q, k, dtype=np.float32)
        with np.errstate(over="ignore"):
            raw16 = raw.astype(np.float16).astype(np.float32)
        return raw16 * np.float32(scale)
    m.logits = logits


@fault("attn_scale_absorbed_head_dim", "https://github.com/ollama/ollama/pull/13893", "ollama",
       "v3_neox", "attention_mha", {"attn.scale"}, seq_lens=(16,))
def attn_scale_absorbed_head_dim(m):
    """The softmax scale 1/sqrt(kv_lora_rank + qk_rope_head_dim) (the absorbed MQA head dim) where the model trains
    with 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)."""
    m.softmax_scale = lambda: 1.0 / math.sqrt(m.L + m.R)


@fault("attn_stale_buffer_half_heads", "https://github.com/flagos-ai/vllm-plugin-FL/pull/368", "vLLM (plugin-FL)",
       "v3_yarn", "attention_mha", None, seq_lens=(9, 7))
def attn_stale_buffer_half_heads(m):
    """Under a graph replay the attention kernel writes only the first half of the heads; the other half of the
    output buffer keeps the previous step's values (another batch's attention output). No class models it."""
    orig_forward, orig_attend = m.forward, m.attend

    def forward(batch):
        prev = make_batch(m.cfg, batch.seq_lens, batch.context_lens, seed=77)
        stale = MLA(m.cfg, m.W, dtype=m.dtype, tp=m.tp).forward(prev)["attn_out"]
        calls = [0]

        def attend(q, k, v, mask, scale, ctx_keys):
            o, lse = orig_attend(q, k, v, mask, scale, ctx_keys)
            r = calls[0]
            calls[0] += 1
            o = np.array(o, np.float32)
            n = o.shape[1]
            o[:, n // 2:] = stale[r][:, n // 2:]
            return o, lse
        m.attend = attend
        return orig_forward(batch)
    m.forward = forward


# ---------------------------------------------------------------------------------------------------- projections

@fault("kv_b_split_value_first", "https://github.com/ggml-org/llama.cpp/pull/7327", "llama.cpp",
       "v3_yarn", "kv_b_proj", {"proj.split_swapped"})
def kv_b_split_value_first(m):
    """kv_b_proj's per-head output [k_nope | v] read as [v | k_nope] (the key's head size used where the value's
    belongs): each head's first V lanes taken as v, the next P as k_nope."""
    P, V = m.P, m.V
    orig = m.linear

    def linear(name, x, wt):
        y = orig(name, x, wt)
        if name != "kv_b_proj":
            return y
        y = y.reshape(y.shape[0], -1, P + V)
        # what the stack reads: v = first V lanes, k_nope = next P lanes -> written back in the [k_nope | v] slots
        v_read, k_read = y[..., :V], y[..., V:]
        return np.concatenate([k_read, v_read], axis=-1).reshape(y.shape[0], -1)
    m.linear = linear


@fault("q_b_heads_reversed", "https://github.com/pytorch/torchchat/pull/1097", "torchchat",
       "v3_yarn", "q_b_proj", {"proj.heads_permuted"}, seq_lens=(16,))
def q_b_heads_reversed(m):
    """q_b_proj's head blocks loaded in reverse order (a permute over the head axis applied backwards): head h
    computes head N-1-h's query."""
    orig = m.shard_rows

    def shard_rows(name, rank):
        w = orig(name, rank)
        if name != "q_b_proj":
            return w
        return w.reshape(-1, m.D, w.shape[1])[::-1].reshape(w.shape)
    m.shard_rows = shard_rows


@fault("kv_b_heads_interleaved", "https://github.com/NVIDIA-NeMo/Automodel/pull/1324", "NeMo Automodel",
       "v3_neox", "kv_b_proj", {"proj.heads_permuted"}, seq_lens=(16,))
def kv_b_heads_interleaved(m):
    """kv_b_proj's heads stored interleaved (even heads first, then odd: 0, 2, 1, 3) by a fused-layout conversion,
    so head h's keys and values come from another head's rows."""
    orig = m.shard_rows

    def shard_rows(name, rank):
        w = orig(name, rank)
        if name != "kv_b_proj":
            return w
        per = w.reshape(-1, m.P + m.V, w.shape[1])
        order = list(range(0, per.shape[0], 2)) + list(range(1, per.shape[0], 2))
        return per[order].reshape(w.shape)
    m.shard_rows = shard_rows


@fault("fp8_q_b_scale_grid_column_major", "https://github.com/unslothai/unsloth/pull/8953", "unsloth",
       "v3_wide", "q_b_proj", {"proj.block_scale"}, seq_lens=(9, 7))
def fp8_q_b_scale_grid_column_major(m):
    """A 128 x 128 block-FP8 q_b_proj ([384, 256]: a 3 x 2 grid of scales) dequantized with its scale grid read in
    column-major order: block (i, j) gets the scale stored at flat index j*3 + i."""
    w = m.W["self_attn.q_b_proj.weight"]
    rows, cols = (w.shape[0] + 127) // 128, (w.shape[1] + 127) // 128
    s = np.exp2(np.random.default_rng(21).integers(-2, 3, size=(rows, cols))).astype(np.float32)
    flat = s.reshape(-1)
    wrong = np.array([[flat[j * rows + i] for j in range(cols)] for i in range(rows)], np.float32)
    ratio = _block_ratio(w.shape, 128, lambda r, cb: wrong[r // 128, cb] / s[r // 128, cb])
    m.W = dict(m.W)
    m.W["self_attn.q_b_proj.weight"] = (w * ratio).astype(np.float32)


@fault("fp8_kv_a_block_size_from_shapes", "https://github.com/vllm-project/vllm/pull/49596", "vLLM",
       "v3_wide", "kv_a_proj", {"proj.block_scale"}, seq_lens=(9, 7))
def fp8_kv_a_block_size_from_shapes(m):
    """A block-FP8 kv_a_proj_with_mqa ([288, 256], 128 x 128 blocks: scale rows for rows 0-127, 128-255, 256-287)
    dequantized with the block height derived from the shapes (288 / 3 = 96): rows 96-127 take the second row
    block's scale, 192-255 the third's."""
    w = m.W["self_attn.kv_a_proj_with_mqa.weight"]
    rows, cols = (w.shape[0] + 127) // 128, (w.shape[1] + 127) // 128
    s = np.exp2(np.random.default_rng(23).integers(-2, 3, size=(rows, cols))).astype(np.float32)
    derived = w.shape[0] // rows
    ratio = _block_ratio(w.shape, 128, lambda r, cb: s[min(r // derived, rows - 1), cb] / s[r // 128, cb])
    m.W = dict(m.W)
    m.W["self_attn.kv_a_proj_with_mqa.weight"] = (w * ratio).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------- norms

@fault("kv_norm_weight_signs_corrupted", "https://github.com/ggml-org/llama.cpp/issues/22565", "llama.cpp",
       "v3_yarn", "kv_a_norm", None)
def kv_norm_weight_signs_corrupted(m):
    """kv_a_layernorm's weight corrupted in a few channels on conversion (3, 17 and 29 come out with their sign
    flipped). No class models sign flips in scattered channels."""
    orig = m.rms_norm

    def rms_norm(name, x, w):
        if name != "kv_a_layernorm":
            return orig(name, x, w)
        w = np.array(w, np.float32)
        w[[3, 17, 29]] *= -1.0
        return orig(name, x, w)
    m.rms_norm = rms_norm


# ---------------------------------------------------------------------------------------------- all-reduce, residual

@fault("o_proj_reduce_results_off", "https://github.com/sgl-project/sglang/pull/14811", "SGLang",
       "v3_yarn", "all_reduce", {"reduce.rank_missing"}, seq_lens=(16,), tp=2)
def o_proj_reduce_results_off(m):
    """Tensor parallelism 2 with o_proj built reduce_results=False and nothing reducing after it: rank 0's partial
    is taken as the layer's output, rank 1's never added."""
    m.all_reduce = lambda partials: np.asarray(partials[0], np.float32)


@fault("residual_dropped_in_decoder_layer", "https://github.com/vllm-project/vllm/pull/16650", "vLLM",
       "v3_yarn", "residual", {"residual.dropped"})
def residual_dropped_in_decoder_layer(m):
    """The decoder layer's residual threading broken: the attention output passed on without the residual added."""
    m.residual = lambda h, o: np.asarray(o, np.float32)


@fault("residual_attention_added_twice", "https://github.com/kyegomez/BitNet/issues/32", "BitNet",
       "v3_neox", "residual", {"residual.o_twice"})
def residual_attention_added_twice(m):
    """The attention output added to the stream twice (a fused add-norm adding it again after the layer did)."""
    m.residual = lambda h, o: np.asarray(h, np.float32) + 2.0 * np.asarray(o, np.float32)


@fault("residual_stream_counted_twice", "https://github.com/mirage-project/mirage/pull/722", "Mirage",
       "v3_yarn", "residual", None, seq_lens=(16,))
def residual_stream_counted_twice(m):
    """The residual added on every rank before a sum over two ranks (h_out = 2h + o). No class models it."""
    m.residual = lambda h, o: 2.0 * np.asarray(h, np.float32) + np.asarray(o, np.float32)


@fault("mlp_swiglu_order_upstream_benign", "https://github.com/ml-explore/mlx-lm/pull/767", "mlx-lm",
       "v3_yarn", None, None, seq_lens=(4, 4), context=(10, 20))
def mlp_swiglu_order_upstream_benign(m):
    """The previous layer's MLP computing silu(up) * gate instead of silu(gate) * up: the hidden states that reach
    this layer (its input h, and those of the cached tokens) are wrong, and this layer is right on them. The right
    answer is a clean replay: the attention layer is not at fault."""
    orig_forward = m.forward
    rng = np.random.default_rng(31)
    H, I = m.H, 96
    gate, up = rng.standard_normal((I, H)) / math.sqrt(H), rng.standard_normal((I, H)) / math.sqrt(H)
    down = rng.standard_normal((H, I)) / math.sqrt(I)

    def bad_mlp(h):
        g, u = h @ gate.T, h @ up.T
        return (h + ((u / (1.0 + np.exp(-u))) * g) @ down.T).astype(np.float32)

    def forward(batch):
        batch.h = bad_mlp(batch.h)
        batch.context_h = [bad_mlp(c) for c in batch.context_h]
        return orig_forward(batch)
    m.forward = forward


# ------------------------------------------------------------------------------------------------------------ DSA

@fault("dsa_topk_one_short", "https://github.com/vllm-project/vllm/issues/51782", "vLLM",
       "glm5_dsa", "topk", {"dsa.topk_count"}, seq_lens=(12,))
def dsa_topk_one_short(m):
    """The indexer's top-k returning index_topk - 1 keys (a candidate dropped at a bin boundary, every time): each
    query past the first k keys attends one key fewer."""
    k = m.topk_k

    def select(scores, mask):
        sel = np.zeros_like(mask)
        for t in range(scores.shape[0]):
            seen = np.nonzero(mask[t])[0]
            order = sorted(seen, key=lambda j: (-float(scores[t, j]), j))
            sel[t, order[: min(len(seen), k - 1)]] = True
        return sel
    m.select = select


@fault("dsa_index_k_norm_left_out", "https://github.com/hw-native-sys/pypto-lib/pull/174", "pypto-lib",
       "glm5_dsa", "indexer_k", {"dsa.index_k_norm_skipped"}, seq_lens=(12,))
def dsa_index_k_norm_left_out(m):
    """The indexer's key LayerNorm (k_norm, weight and bias) not applied to wk's output before the rope."""
    m.layer_norm = lambda x, w, b, eps=1e-6: np.asarray(x, np.float32)


@fault("dsa_index_weights_without_head_scale", "https://github.com/huggingface/transformers/pull/42788",
       "transformers", "glm5_dsa", "indexer_weights", {"dsa.index_weights_scale"}, seq_lens=(12,))
def dsa_index_weights_without_head_scale(m):
    """The indexer's head weights taken straight from weights_proj, without the n_heads^-0.5 factor."""
    m.index_weights = lambda x: m.linear("indexer.weights_proj", x, m.weight("indexer.weights_proj"))


@fault("dsa_indexer_future_keys", "https://github.com/lablup/mlxcel/pull/667", "mlxcel",
       "glm5_dsa", "topk", {"dsa.future_keys"}, seq_lens=(12,))
def dsa_indexer_future_keys(m):
    """A maskless prefill: the indexer scores and selects among every key of the sequence, later ones included (the
    attention itself stays causal, so a future key selected is a slot wasted)."""
    orig_visible = m.visible
    state = {}

    def visible(q_seq, q_idx, q_ctx, k_seq, k_idx):
        state["same"] = q_seq[:, None] == k_seq[None, :]
        return orig_visible(q_seq, q_idx, q_ctx, k_seq, k_idx)
    m.visible = visible
    orig_scores, orig_select = m.index_scores, m.select
    m.index_scores = lambda iq, ik, iw, mask: orig_scores(iq, ik, iw, state["same"])
    m.select = lambda scores, mask: orig_select(scores, state["same"])


@fault("dsa_indexer_future_keys_scored", "https://github.com/lablup/mlxcel/issues/619", "mlxcel",
       "glm5_dsa", "index_scores", {"dsa.future_keys"}, seq_lens=(12,))
def dsa_indexer_future_keys_scored(m):
    """The indexer of a maskless prefill scoring every key of the sequence and writing those scores (later keys
    included) into its score buffer, from which the top-k selects; the attention itself stays causal."""
    dsa_indexer_future_keys(m)
    orig_visible = m.visible
    state = {}

    def visible(q_seq, q_idx, q_ctx, k_seq, k_idx):
        state["same"] = q_seq[:, None] == k_seq[None, :]
        return orig_visible(q_seq, q_idx, q_ctx, k_seq, k_idx)
    m.visible = visible
    m.index_scores_written = lambda mask: state["same"]


@fault("attn_scores_fp16_overflow_eager", "https://github.com/pytorch/pytorch/issues/60939", "PyTorch",
       "v3_hot", "attention_mha", {"attn.fp16_overflow"}, seq_lens=(9, 7), dtype="fp16")
def attn_scores_fp16_overflow_eager(m):
    """attn_scores_fp16_overflow through an eager attention that returns no log-sum-exp: q.k formed in fp16
    overflows to inf past 65504, and the capture holds attn_out without lse."""
    attn_scores_fp16_overflow(m)
    orig_forward = m.forward

    def forward(batch):
        pr = orig_forward(batch)
        pr.pop("lse", None)
        return pr
    m.forward = forward


def by_name():
    return {f.name: f for f in FAULTS_MORE}
