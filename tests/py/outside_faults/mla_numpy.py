"""One MLA attention layer (DeepSeek-V2/V3, Kimi-K2, GLM-5 with DSA) in numpy, written from the math of MLA and the
semantics of HF transformers' DeepseekV3Attention / GlmMoeDsaIndexer, independent of mla-bisect's own reference.

Every step is a method of `MLA`, so that a fault (faults.py) replaces one of them on an instance the way a bug in
a serving stack replaces the right computation with a wrong one. `MLA.forward(batch)` returns every probe of the
layer (names and layouts of docs/capture.md), and `capture(...)` writes them through `mla_bisect.capture.Recorder`.

Arithmetic: float32 (matmuls in float32, rope angles in float64 then float32). With dtype="bf16" (or "fp16") every
stage output is rounded to bfloat16 (float16), as a half-precision serving stack holds its activations (softmax
statistics and the indexer's scores stay float32)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

PAGE = 64


def to_bf16(a):
    import ml_dtypes

    return np.asarray(a, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def to_fp16(a):
    return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)


def yarn_get_mscale(scale, mscale=1.0):
    """DeepSeek's YaRN magnitude factor: 0.1 * mscale * ln(s) + 1 (1 for s <= 1)."""
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_settings(cfg):
    """(theta, scaling dict or None) as HF reads them: rope_scaling (older configs) or rope_parameters."""
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    theta = cfg.get("rope_theta", 10000.0)
    if scaling and "rope_theta" in scaling:
        theta = scaling["rope_theta"]
    kind = None
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
    return float(theta), (scaling if kind == "yarn" else None)


@dataclass
class Batch:
    """One step: h [T, H] (the decoder layer's input, sequences' new tokens concatenated), positions [T],
    seq_lens [B] new tokens per sequence, context_lens [B] cached tokens before the step, and for a step with
    context the hidden states of the cached tokens (context_h[b]: [context_lens[b], H]) from which the layer's own kv
    path writes the cache rows."""
    h: np.ndarray
    positions: np.ndarray
    seq_lens: list
    context_lens: list
    context_h: list = field(default_factory=list)

    @property
    def T(self):
        return int(self.h.shape[0])

    @property
    def mode(self):
        if not any(self.context_lens):
            return "prefill"
        return "decode" if all(n == 1 for n in self.seq_lens) else "chunked"


def make_batch(cfg, seq_lens, context_lens=None, seed=0, position_offset=0):
    """Random layer inputs (N(0, 1) hidden states) for sequences of seq_lens new tokens after context_lens cached
    ones; positions count from the context (from position_offset in a prefill)."""
    rng = np.random.default_rng(seed)
    H = cfg["hidden_size"]
    context_lens = list(context_lens or [0] * len(seq_lens))
    T = int(sum(seq_lens))
    h = rng.standard_normal((T, H)).astype(np.float32)
    pos = []
    for n, c in zip(seq_lens, context_lens):
        start = c if c else position_offset
        pos.extend(range(start, start + n))
    ctx = [rng.standard_normal((c, H)).astype(np.float32) for c in context_lens]
    return Batch(h=h, positions=np.array(pos, dtype=np.int64), seq_lens=list(seq_lens), context_lens=context_lens,
                 context_h=ctx)


class MLA:
    """The layer. `weights` maps the HF tensor names below `model.layers.N.` (input_layernorm.weight,
    self_attn.q_a_proj.weight, ...) to float32 arrays [out, in]."""

    def __init__(self, cfg, weights, dtype="fp32", tp=1):
        self.cfg = cfg
        self.W = weights
        self.dtype = dtype
        self.tp = tp
        self.H = cfg["hidden_size"]
        self.N = cfg["num_attention_heads"]
        self.Lq = cfg.get("q_lora_rank") or 0
        self.L = cfg["kv_lora_rank"]
        self.P = cfg["qk_nope_head_dim"]
        self.R = cfg["qk_rope_head_dim"]
        self.V = cfg["v_head_dim"]
        self.D = self.P + self.R
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.theta, self.yarn = rope_settings(cfg)
        self.interleaved = bool(cfg.get("rope_interleave", True))
        self.dsa = cfg.get("index_topk") is not None
        if self.dsa:
            self.topk_k = int(cfg["index_topk"])
            self.Hi = int(cfg["index_n_heads"])
            self.Di = int(cfg["index_head_dim"])
            # GLM-5's indexer rotates interleaved pairs, DeepSeek-V3.2's half-split pairs.
            self.index_interleaved = cfg.get("model_type") != "deepseek_v32"
        assert self.N % tp == 0

    # ------------------------------------------------------------------ precision
    def out(self, a):
        """A stage output as the stack stores it."""
        a = np.asarray(a, dtype=np.float32)
        if self.dtype == "bf16":
            return to_bf16(a)
        return to_fp16(a) if self.dtype == "fp16" else a

    # ------------------------------------------------------------------ weights
    def weight(self, name):
        return self.W["self_attn." + name + ".weight"] if not name.startswith("input_") else self.W[name + ".weight"]

    def shard_rows(self, name, rank):
        """Rank `rank`'s rows of a column-parallel projection (its heads)."""
        w = self.weight(name)
        n = w.shape[0] // self.tp
        return w[rank * n:(rank + 1) * n]

    def shard_cols(self, name, rank):
        w = self.weight(name)
        n = w.shape[1] // self.tp
        return w[:, rank * n:(rank + 1) * n]

    # ------------------------------------------------------------------ building blocks
    def linear(self, name, x, w):
        return np.asarray(x, np.float32) @ np.asarray(w, np.float32).T

    def norm_eps(self, name):
        return self.eps

    def rms_norm(self, name, x, w):
        x = np.asarray(x, np.float32)
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return (x / np.sqrt(ms + np.float32(self.norm_eps(name)))) * w

    # rope ------------------------------------------------------------
    def rope_inv_freq(self):
        """Per lane pair i: theta^(-2i/R), and with YaRN the ramp between extrapolation and interpolation by 1/s
        (HF's _compute_yarn_parameters)."""
        R = self.R
        base = self.theta
        freq = 1.0 / base ** (np.arange(0, R, 2, dtype=np.float64) / R)
        if self.yarn is None:
            return freq
        y = self.yarn
        s = float(y["factor"])
        orig = float(y["original_max_position_embeddings"])
        beta_fast, beta_slow = float(y.get("beta_fast", 32.0)), float(y.get("beta_slow", 1.0))

        def corr_dim(n_rot):
            return (R * math.log(orig / (n_rot * 2 * math.pi))) / (2 * math.log(base))

        low = max(math.floor(corr_dim(beta_fast)), 0)
        high = min(math.ceil(corr_dim(beta_slow)), R - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(R // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        extrap = 1.0 - ramp
        return (freq / s) * (1.0 - extrap) + freq * extrap

    def rope_attention_factor(self):
        """YaRN's multiplier of cos and sin: mscale(s, mscale) / mscale(s, mscale_all_dim)."""
        if self.yarn is None:
            return 1.0
        y = self.yarn
        s = float(y["factor"])
        m, m_all = y.get("mscale"), y.get("mscale_all_dim")
        if m and m_all:
            return yarn_get_mscale(s, m) / yarn_get_mscale(s, m_all)
        return yarn_get_mscale(s)

    def rope_positions(self, which, batch):
        return np.asarray(batch.positions, dtype=np.float64)

    def rope_cos_sin(self, which, pos):
        ang = np.outer(np.asarray(pos, np.float64), self.rope_inv_freq())
        f = self.rope_attention_factor()
        return (np.cos(ang) * f).astype(np.float32), (np.sin(ang) * f).astype(np.float32)

    def rope_pairs(self, which):
        """True: pairs (2i, 2i+1); False: pairs (i, i + R/2)."""
        if which.startswith("idx"):
            return self.index_interleaved
        return self.interleaved

    def rotate(self, t, cos, sin, interleaved):
        """t [T, ..., R]; cos/sin [T, R/2]."""
        t = np.asarray(t, np.float32)
        R = t.shape[-1]
        shape = (t.shape[0],) + (1,) * (t.ndim - 2) + (R // 2,)
        c, s = cos.reshape(shape), sin.reshape(shape)
        if interleaved:
            a, b = t[..., 0::2], t[..., 1::2]
        else:
            a, b = t[..., : R // 2], t[..., R // 2:]
        ra, rb = a * c - b * s, b * c + a * s
        out = np.empty_like(t)
        if interleaved:
            out[..., 0::2], out[..., 1::2] = ra, rb
        else:
            out[..., : R // 2], out[..., R // 2:] = ra, rb
        return out

    def rope(self, which, t, batch):
        """which: q (q_pe [T, N, R]), k (k_pe [T, R]), idx_q, idx_k (the indexer's rope lanes)."""
        cos, sin = self.rope_cos_sin(which, self.rope_positions(which, batch))
        return self.rotate(t, cos, sin, self.rope_pairs(which))

    # cache -------------------------------------------------------------
    def cache_row(self, kv_c_norm, k_pe_rope, k_pe):
        return np.concatenate([kv_c_norm, k_pe_rope], axis=-1)

    def read_cache(self, rows):
        """The context's rows as the attention reads them back (identity; a quantized cache loses here)."""
        return rows

    # attention ---------------------------------------------------------
    def softmax_scale(self):
        scale = 1.0 / math.sqrt(self.D)
        if self.yarn is not None:
            m_all = self.yarn.get("mscale_all_dim") or 0.0
            if m_all:
                f = yarn_get_mscale(float(self.yarn["factor"]), m_all)
                scale = scale * f * f
        return scale

    def visible(self, q_seq, q_idx, q_ctx, k_seq, k_idx):
        """[T, K] booleans: query (sequence, key index of itself within its sequence, its context) sees key
        (sequence, index within its sequence). Causal, bottom-right aligned."""
        return (q_seq[:, None] == k_seq[None, :]) & (k_idx[None, :] <= q_idx[:, None])

    def logits(self, q, k, scale):
        """q [T, N, D], k [K, N, D] -> [N, T, K]."""
        return np.einsum("tnd,knd->ntk", q, k, dtype=np.float32) * np.float32(scale)

    def softmax(self, s, mask):
        """s [N, T, K], mask [T, K] -> probabilities [N, T, K], lse [N, T] (natural log); an empty row gives 0 and
        -inf."""
        s = np.where(mask[None], s, -np.inf).astype(np.float32)
        m = np.max(s, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0).astype(np.float32)
        e = np.exp(s - m)
        z = np.sum(e, axis=-1, keepdims=True, dtype=np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(z > 0, e / z, 0.0).astype(np.float32)
            lse = (np.log(z) + m)[..., 0]
        return p, lse.astype(np.float32)

    def attend(self, q, k, v, mask, scale, ctx_keys):
        """One softmax over every key a query sees (its sequence's cached context and new tokens): -> attn_out
        [T, N, V], lse [N, T]. ctx_keys [K] marks the keys read from the cache."""
        p, lse = self.softmax(self.logits(q, k, scale), mask)
        return self.weighted(p, v), lse

    def weighted(self, p, v):
        """p [N, T, K], v [K, N, V] -> [T, N, V]."""
        return np.einsum("ntk,knv->tnv", p, v, dtype=np.float32)

    # output -------------------------------------------------------------
    def all_reduce(self, partials):
        return np.sum(np.stack(partials), axis=0, dtype=np.float32)

    def residual(self, h, o):
        return h + o

    # indexer (DSA) -------------------------------------------------------
    def layer_norm(self, x, w, b, eps=1e-6):
        x = np.asarray(x, np.float32)
        mu = np.mean(x, axis=-1, keepdims=True)
        var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + np.float32(eps)) * w + b

    def index_q(self, q_c, batch):
        q = self.linear("indexer.wq_b", q_c, self.weight("indexer.wq_b")).reshape(-1, self.Hi, self.Di)
        rot = self.rope("idx_q", q[..., : self.R], batch)
        return np.concatenate([rot, q[..., self.R:]], axis=-1)

    def index_k(self, x, batch):
        k = self.linear("indexer.wk", x, self.weight("indexer.wk"))
        k = self.layer_norm(k, self.W["self_attn.indexer.k_norm.weight"], self.W["self_attn.indexer.k_norm.bias"])
        rot = self.rope("idx_k", k[..., : self.R], batch)
        return np.concatenate([rot, k[..., self.R:]], axis=-1)

    def index_weights(self, x):
        return self.linear("indexer.weights_proj", x, self.weight("indexer.weights_proj")) * np.float32(self.Hi ** -0.5)

    def index_scores(self, iq, ik, iw, mask):
        """iq [T, Hi, Di], ik [K, Di], iw [T, Hi], mask [T, K] -> [T, K] (-inf where not visible)."""
        dots = np.einsum("thd,kd->thk", iq, ik, dtype=np.float32) * np.float32(self.Di ** -0.5)
        s = np.einsum("th,thk->tk", iw, np.maximum(dots, 0.0), dtype=np.float32)
        return np.where(mask, s, -np.inf).astype(np.float32)

    def select(self, scores, mask):
        """Per query the index_topk keys of highest score among those it sees (ties: the lower key), as a [T, K]
        boolean selection."""
        sel = np.zeros_like(mask)
        for t in range(scores.shape[0]):
            seen = np.nonzero(mask[t])[0]
            if len(seen) <= self.topk_k:
                sel[t, seen] = True
                continue
            order = sorted(seen, key=lambda j: (-float(scores[t, j]), j))
            sel[t, order[: self.topk_k]] = True
        return sel

    # ------------------------------------------------------------------ the latent kv path of some tokens
    def kv_path(self, x, batch):
        kv_a = self.out(self.linear("kv_a_proj_with_mqa", x, self.weight("kv_a_proj_with_mqa")))
        kv_c, k_pe = kv_a[:, : self.L], kv_a[:, self.L:]
        kv_c_norm = self.out(self.rms_norm("kv_a_layernorm", kv_c, self.weight("kv_a_layernorm")))
        return kv_c, k_pe, kv_c_norm

    def context_rows(self, batch):
        """The cache rows [kv_c_norm | k_pe_rope] of each sequence's context, as this layer writes them (for the
        context's own hidden states at positions 0..c-1), and for DSA the indexer's keys of those tokens."""
        rows, idx_keys = [], []
        for b, c in enumerate(batch.context_lens):
            if c == 0:
                rows.append(np.zeros((0, self.L + self.R), np.float32))
                idx_keys.append(np.zeros((0, self.Di if self.dsa else 0), np.float32))
                continue
            hb = self.out(batch.context_h[b])
            sub = Batch(h=hb, positions=np.arange(c), seq_lens=[c], context_lens=[0])
            x = self.out(self.rms_norm("input_layernorm", hb, self.weight("input_layernorm")))
            kv_c, k_pe, kv_c_norm = self.kv_path(x, sub)
            k_rope = self.out(self.rope("k", k_pe, sub))
            rows.append(self.out(self.cache_row(kv_c_norm, k_rope, k_pe)))
            if self.dsa:
                idx_keys.append(self.out(self.index_k(x, sub)))
        return rows, idx_keys

    # ------------------------------------------------------------------ the layer
    def forward(self, batch: Batch):
        """Every probe of the layer: replicated ones as arrays, heads / partial ones as lists per rank; plus
        'inputs' (what Recorder.inputs takes)."""
        P, R, V, L, N, tp = self.P, self.R, self.V, self.L, self.N, self.tp
        Nl = N // tp
        pr = {}
        h = np.asarray(batch.h, np.float32)
        pr["h"] = self.out(h)
        x = self.out(self.rms_norm("input_layernorm", pr["h"], self.weight("input_layernorm")))
        pr["x"] = x
        if self.Lq:
            pr["q_a"] = q_a = self.out(self.linear("q_a_proj", x, self.weight("q_a_proj")))
            pr["q_c"] = q_c = self.out(self.rms_norm("q_a_layernorm", q_a, self.weight("q_a_layernorm")))
            qname, q_in = "q_b_proj", q_c
        else:
            qname, q_in = "q_proj", x
        q_ranks = [self.out(self.linear(qname, q_in, self.shard_rows(qname, r)).reshape(-1, Nl, self.D))
                   for r in range(tp)]
        pr["q_nope"] = [q[..., :P] for q in q_ranks]
        pr["q_pe"] = [q[..., P:] for q in q_ranks]
        kv_c, k_pe, kv_c_norm = self.kv_path(x, batch)
        pr["kv_c"], pr["k_pe"], pr["kv_c_norm"] = kv_c, k_pe, kv_c_norm
        pr["q_pe_rope"] = [self.out(self.rope("q", q, batch)) for q in pr["q_pe"]]
        pr["k_pe_rope"] = k_rope = self.out(self.rope("k", k_pe, batch))
        pr["kv_cache"] = self.out(self.cache_row(kv_c_norm, k_rope, k_pe))

        # keys of every sequence: [context (from the cache) | new tokens]
        ctx_rows, ctx_idx_keys = self.context_rows(batch)
        T = batch.T
        q_seq, q_idx, q_ctx, k_seq, k_idx, k_src = [], [], [], [], [], []
        t0 = 0
        for b, (n, c) in enumerate(zip(batch.seq_lens, batch.context_lens)):
            q_seq += [b] * n
            q_idx += list(range(c, c + n))
            q_ctx += [c] * n
            k_seq += [b] * (c + n)
            k_idx += list(range(c + n))
            k_src += [("ctx", b, j) for j in range(c)] + [("new", t0 + i) for i in range(n)]
            t0 += n
        q_seq, q_idx, q_ctx = np.array(q_seq), np.array(q_idx), np.array(q_ctx)
        k_seq, k_idx = np.array(k_seq), np.array(k_idx)
        mask = self.visible(q_seq, q_idx, q_ctx, k_seq, k_idx)

        # latent rows of every key: the cache's for the context, this step's for the new tokens
        lat = np.zeros((len(k_src), L + R), np.float32)
        for j, src in enumerate(k_src):
            if src[0] == "ctx":
                lat[j] = self.read_cache(ctx_rows[src[1]][src[2]:src[2] + 1])[0]
            else:
                lat[j] = pr["kv_cache"][src[1]] if self.attend_from_cache() else \
                    np.concatenate([kv_c_norm[src[1]], k_rope[src[1]]])
        key_latent, key_rope = lat[:, :L], lat[:, L:]

        if self.dsa:
            pr["idx_q"] = iq = self.out(self.index_q(q_c, batch))
            pr["idx_k"] = ik_new = self.out(self.index_k(x, batch))
            pr["idx_weights"] = iw = self.index_weights(x).astype(np.float32)
            ik = np.zeros((len(k_src), self.Di), np.float32)
            for j, src in enumerate(k_src):
                ik[j] = ctx_idx_keys[src[1]][src[2]] if src[0] == "ctx" else ik_new[src[1]]
            scores = self.index_scores(iq, ik, iw, mask)
            sel = self.select(scores, mask)
            # idx_scores' columns as the capture's graph counts them: the most context plus the new tokens of a
            # sequence (all T tokens where sequences differ in length, which the dump describes as one run of T)
            uniform = len(set(batch.seq_lens)) == 1
            Kmax = max(batch.context_lens) + (batch.seq_lens[0] if uniform else T)
            idx_scores = np.zeros((T, Kmax), np.float32)
            topk = np.full((T, self.topk_k), -1.0, np.float32)
            recorded = self.index_scores_written(mask)
            for t in range(T):
                cols = np.nonzero(k_seq == q_seq[t])[0]
                for j in cols:
                    if recorded[t, j]:
                        idx_scores[t, k_idx[j]] = scores[t, j]
                chosen = sorted(int(k_idx[j]) for j in cols if sel[t, j])
                topk[t, : len(chosen)] = chosen
            pr["idx_scores"], pr["topk"] = idx_scores, topk
            mask = mask & sel

        kv_b_ranks = [self.shard_rows("kv_b_proj", r) for r in range(tp)]
        pr["k_nope"], pr["v"], pr["attn_out"], pr["lse"], pr["o_partial"] = [], [], [], [], []
        scale = self.softmax_scale()
        new_rows = np.array([src[0] == "new" for src in k_src])
        for r in range(tp):
            kv_all = self.out(self.linear("kv_b_proj", key_latent, kv_b_ranks[r]).reshape(-1, Nl, P + V))
            k_nope_all, v_all = kv_all[..., :P], kv_all[..., P:]
            pr["k_nope"].append(k_nope_all[new_rows])
            pr["v"].append(v_all[new_rows])
            k_full = np.concatenate([k_nope_all, np.broadcast_to(key_rope[:, None, :], (len(k_src), Nl, R))], -1)
            q_full = np.concatenate([pr["q_nope"][r], pr["q_pe_rope"][r]], -1)
            attn, lse = self.attend(q_full, k_full, v_all, mask, scale, ~new_rows)
            attn = self.out(attn)
            pr["attn_out"].append(attn)
            pr["lse"].append(lse.T.copy())
            o_w = self.shard_cols("o_proj", r)
            pr["o_partial"].append(self.out(self.linear("o_proj", attn.reshape(T, Nl * V), o_w)))
        pr["o"] = o = self.out(self.all_reduce(pr["o_partial"]))
        pr["h_out"] = self.out(self.residual(pr["h"], o))
        pr["inputs"] = self.inputs_for(batch, pr["h"], ctx_rows, ctx_idx_keys)
        return pr

    def index_scores_written(self, mask):
        """[T, K] booleans: the entries of the index scores the engine writes into its idx_scores output (those its
        queries see; 0 elsewhere)."""
        return mask

    def attend_from_cache(self):
        """Whether the new tokens' keys are read back from the rows this step wrote (a paged backend) rather than
        taken from the projections."""
        return False

    def inputs_for(self, batch, h, ctx_rows, ctx_idx_keys):
        inp = dict(h=h, positions=np.asarray(batch.positions, np.int32),
                   seq_lens=list(batch.seq_lens), context_lens=list(batch.context_lens))
        if batch.mode != "prefill":
            per = [(c + n + PAGE - 1) // PAGE for c, n in zip(batch.context_lens, batch.seq_lens)]
            num_blocks = sum(per) + 1
            table = np.full((len(per), max(per) + 1), num_blocks - 1, dtype=np.int32)
            cache = np.zeros((1, num_blocks, PAGE, self.L + self.R), np.float32)
            icache = np.zeros((1, num_blocks, PAGE, self.Di), np.float32) if self.dsa else None
            first = 0
            for b, p in enumerate(per):
                table[b, :p] = np.arange(first, first + p)
                first += p
                for j in range(batch.context_lens[b]):
                    cache[0, table[b, j // PAGE], j % PAGE] = ctx_rows[b][j]
                    if self.dsa:
                        icache[0, table[b, j // PAGE], j % PAGE] = ctx_idx_keys[b][j]
            inp.update(block_table=table, kv_cache=cache)
            if self.dsa:
                inp["index_cache"] = icache
        return inp


REPLICATED = ("h", "x", "q_a", "q_c", "kv_c", "k_pe", "kv_c_norm", "k_pe_rope", "kv_cache", "idx_q", "idx_k",
              "idx_weights", "idx_scores", "topk", "o", "h_out")
PER_RANK = ("q_nope", "q_pe", "q_pe_rope", "k_nope", "v", "attn_out", "lse", "o_partial")
FP32_PROBES = ("lse", "idx_scores", "topk", "idx_weights")


def capture(path, cfg, probes, dtype="fp32", tp=1, engine="numpy-mla", skip=(), layer_index=0):
    """Writes the probes of MLA.forward as a capture (a dump replay reads) through mla_bisect.capture.Recorder."""
    from mla_bisect.capture import Recorder

    inp = probes["inputs"]
    mode = "prefill" if not any(inp["context_lens"]) else (
        "decode" if all(n == 1 for n in inp["seq_lens"]) else "chunked")

    def stored(name, a):
        a = np.asarray(a, np.float32)
        if dtype == "bf16" and name not in FP32_PROBES:
            import ml_dtypes
            return a.astype(ml_dtypes.bfloat16)
        if dtype == "fp16" and name not in FP32_PROBES:
            return a.astype(np.float16)
        return a

    with Recorder(str(path), cfg, mode=mode, form="mha", tp=tp, engine=engine, engine_dtype=dtype,
                  layer_index=layer_index) as rec:
        rec.inputs(h=inp["h"], positions=inp["positions"], seq_lens=inp["seq_lens"],
                   context_lens=inp["context_lens"], block_table=inp.get("block_table"),
                   kv_cache=inp.get("kv_cache"), index_cache=inp.get("index_cache"))
        for name in ("h", "x", "q_a", "q_c", "q_nope", "q_pe", "kv_c", "k_pe", "kv_c_norm", "q_pe_rope",
                     "k_pe_rope", "kv_cache", "idx_q", "idx_k", "idx_weights", "idx_scores", "topk", "k_nope", "v",
                     "attn_out", "lse", "o_partial", "o", "h_out"):
            if name not in probes or name in skip:
                continue
            t = probes[name]
            for r in range(tp):
                rec.probe(name, stored(name, t[r] if name in PER_RANK else t), rank=r)
    return mode
