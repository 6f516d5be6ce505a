"""The stage graph of one MLA layer as the C++ side builds it (core/model/stage_graph.cpp build_graph), and the
HF config.json keys it needs (core/model/config.cpp parse_hf_config): probe names, stages, contracts, global
shapes, heads axes and rope lanes, so that a Python-written dump carries the same probe metadata as a C++ one.
"""
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

KNOWN_MLA_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe_lite", "glm_moe_dsa")
MODES = ("prefill", "decode", "chunked")
FORMS = ("mha", "absorbed")
PAGE_SIZE = 64  # rows per page of the paged latent cache (kPageSize)


@dataclass
class MlaDims:
    """The dimensions build_graph reads (MlaConfig of core/model/config.h)."""
    name: str
    model_type: str
    hidden: int        # H
    heads: int         # N
    q_lora_rank: int   # Lq; 0: no q LoRA (q_proj straight from x)
    kv_lora_rank: int  # L
    qk_nope: int       # P
    qk_rope: int       # R
    v_head: int        # V
    index_topk: int = 0      # DSA (glm_moe_dsa, deepseek_v32): keys a token attends to; 0: dense
    index_n_heads: int = 0   # Hi, the indexer's heads
    index_head_dim: int = 0  # Di, its lanes per head

    @property
    def has_dsa(self) -> bool:
        return self.index_topk > 0

    @property
    def has_q_lora(self) -> bool:
        return self.q_lora_rank > 0

    @property
    def cache_row(self) -> int:
        return self.kv_lora_rank + self.qk_rope


def _field(j: dict, key: str, origin: str, kind, default=None, required=True):
    v = j.get(key)
    if v is None:
        if not required or default is not None:
            return default
        raise ValueError(f"{origin}: missing field '{key}'")
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{origin}: field '{key}' must be an integer, got {json.dumps(v)}")
        if not -2**31 <= v < 2**31:
            raise ValueError(f"{origin}: field '{key}' out of range: {v}")
    elif kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{origin}: field '{key}' must be a number, got {json.dumps(v)}")
        v = float(v)
    elif kind is str and not isinstance(v, str):
        raise ValueError(f"{origin}: field '{key}' must be a string, got {json.dumps(v)}")
    return v


def config_dict(config: Any, origin: str = "config") -> Tuple[dict, str]:
    """An HF config as a plain dict: a dict, a transformers PretrainedConfig (to_dict()), or a path to config.json
    (or a directory holding one). Returns (dict, origin for messages)."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path) as f:
                config = json.load(f)
        except OSError as e:
            raise ValueError(f"{path}: cannot read the model config: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON: {e}") from None
        origin = path
    elif hasattr(config, "to_dict") and not isinstance(config, dict):
        config = config.to_dict()
    if not isinstance(config, dict):
        raise ValueError(f"{origin}: expected an HF config.json dict, got {type(config).__name__}")
    return config, origin


def parse_hf_config(config: Any, origin: str = "config") -> MlaDims:
    """The MLA dimensions of an HF config.json (DeepSeek-V2/V3, Kimi-K2, GLM MLA models), validated as
    parse_hf_config of core/model/config.cpp does; ValueError naming the field otherwise."""
    j, origin = config_dict(config, origin)
    # Multimodal wrappers (Kimi-K2.5 style) keep the language model under text_config.
    if isinstance(j.get("text_config"), dict) and "kv_lora_rank" not in j:
        j = j["text_config"]
    model_type = _field(j, "model_type", origin, str, default="unknown")
    if model_type not in KNOWN_MLA_TYPES and "kv_lora_rank" not in j:
        raise ValueError(f"{origin}: model_type '{model_type}' is not an MLA model (no kv_lora_rank)")
    d = MlaDims(
        name=str(j.get("name") or j.get("_name_or_path") or model_type),
        model_type=model_type,
        hidden=_field(j, "hidden_size", origin, int),
        heads=_field(j, "num_attention_heads", origin, int),
        q_lora_rank=_field(j, "q_lora_rank", origin, int, default=0),
        kv_lora_rank=_field(j, "kv_lora_rank", origin, int),
        qk_nope=_field(j, "qk_nope_head_dim", origin, int),
        qk_rope=_field(j, "qk_rope_head_dim", origin, int),
        v_head=_field(j, "v_head_dim", origin, int),
    )
    # GLM-5 and DeepSeek-V3.2 always select keys with DSA's indexer (HF's config classes: index_topk 2048 where it is
    # left out; min(index_topk, keys) keys per query, so 0 selects none). HF's other defaults: 64 indexer heads for
    # DeepSeek-V3.2, 32 for GLM-5; 128 lanes.
    dsa_type = model_type in ("glm_moe_dsa", "deepseek_v32")
    if dsa_type or j.get("index_topk") is not None:
        d.index_topk = _field(j, "index_topk", origin, int, default=2048 if dsa_type else None)
        if dsa_type and d.index_topk <= 0:
            raise ValueError(f"{origin}: index_topk {d.index_topk}: model_type '{model_type}' attends through DSA's "
                             f"indexer, which selects min(index_topk, keys) keys per query (none at {d.index_topk}); "
                             f"leave index_topk out for HF's default 2048")
        d.index_n_heads = _field(j, "index_n_heads", origin, int, default=64 if model_type == "deepseek_v32" else 32)
        d.index_head_dim = _field(j, "index_head_dim", origin, int, default=128)
    for key, v in [("hidden_size", d.hidden), ("num_attention_heads", d.heads), ("kv_lora_rank", d.kv_lora_rank),
                   ("qk_nope_head_dim", d.qk_nope), ("qk_rope_head_dim", d.qk_rope), ("v_head_dim", d.v_head)]:
        if v <= 0:
            raise ValueError(f"{origin}: {key} must be positive, got {v}")
    if d.q_lora_rank < 0:
        raise ValueError(f"{origin}: q_lora_rank must be positive or null, got {d.q_lora_rank}")
    if d.qk_rope % 2:
        raise ValueError(f"{origin}: qk_rope_head_dim must be even (rope rotates pairs), got {d.qk_rope}")
    # What the C++ reader checks when it loads the dump's model (replay, calibrated compare): fail at capture time.
    _field(j, "num_hidden_layers", origin, int, required=False)
    eps = _field(j, "rms_norm_eps", origin, float, default=1e-6)
    if not 0.0 < eps <= 1.0:
        raise ValueError(f"{origin}: rms_norm_eps must be in (0, 1], got {eps}")
    if j.get("rope_interleave") is not None and not isinstance(j["rope_interleave"], bool):
        raise ValueError(f"{origin}: field 'rope_interleave' must be true or false, got {json.dumps(j['rope_interleave'])}")
    rope = j.get("rope_scaling")
    if rope is None:
        rope = j.get("rope_parameters")
    theta = _field(j, "rope_theta", origin, float, default=10000.0)
    if rope is not None:
        where = f"{origin} rope_scaling"
        if not isinstance(rope, dict):
            raise ValueError(f"{origin}: rope_scaling must be an object or null")
        if "rope_theta" in rope:
            theta = _field(rope, "rope_theta", where, float)
        kind = _field(rope, "rope_type", where, str) if "rope_type" in rope else \
            _field(rope, "type", where, str, default="default")
        if kind == "yarn":
            if not _field(rope, "factor", where, float) >= 1.0:
                raise ValueError(f"{where}: factor must be >= 1")
            if _field(rope, "original_max_position_embeddings", where, int) <= 0:
                raise ValueError(f"{where}: original_max_position_embeddings must be positive")
            for key, default in [("beta_fast", 32.0), ("beta_slow", 1.0)]:
                if not _field(rope, key, where, float, default=default) > 0.0:
                    raise ValueError(f"{where}: {key} must be positive")
            for key in ("mscale", "mscale_all_dim"):
                _field(rope, key, where, float, required=False)
        elif kind not in ("default", "none"):
            raise ValueError(f"{where}: unknown rope type '{kind}' (supported: yarn, default)")
    if not theta > 1.0:
        raise ValueError(f"{origin}: rope_theta must be > 1")
    return d


@dataclass
class ProbeSpec:
    name: str
    stage: str
    contract: str              # replicated | heads | partial
    shape: Tuple[int, ...]     # global
    heads_axis: int = -1
    rope_from: int = -1
    order: int = 0

    def local_shape(self, tp: int) -> Tuple[int, ...]:
        s = list(self.shape)
        if self.contract == "heads" and self.heads_axis >= 0:
            s[self.heads_axis] //= tp
        return tuple(s)


@dataclass
class StageGraph:
    stages: List[Tuple[str, List[str], List[str]]] = field(default_factory=list)  # (stage, inputs, outputs)
    probes: List[ProbeSpec] = field(default_factory=list)

    def find(self, name: str) -> Optional[ProbeSpec]:
        for p in self.probes:
            if p.name == name:
                return p
        return None

    @property
    def names(self) -> List[str]:
        return [p.name for p in self.probes]


def default_form(mode: str) -> str:
    """prefill, chunked: mha; decode: absorbed (as vLLM routes them)."""
    return "absorbed" if mode == "decode" else "mha"


def build_graph(dims: MlaDims, tokens: int, mode: str = "prefill", form: Optional[str] = None,
                input_norm: bool = False, keys: int = 0) -> StageGraph:
    """build_graph of core/model/stage_graph.cpp for T = `tokens` new tokens over all sequences; `keys` (DSA's
    idx_scores columns): the longest context plus the run's tokens per sequence (T where sequences differ in new
    tokens), at least the keys of any one sequence; a token's columns past its sequence's keys hold 0."""
    if mode not in MODES:
        raise ValueError(f"unknown mode '{mode}' (expected prefill, decode or chunked)")
    form = default_form(mode) if form is None else ("absorbed" if form == "mqa" else form)
    if form not in FORMS:
        raise ValueError(f"unknown attention form '{form}' (expected mha or absorbed)")
    T, H, N, Lq, L = tokens, dims.hidden, dims.heads, dims.q_lora_rank, dims.kv_lora_rank
    P, R, V = dims.qk_nope, dims.qk_rope, dims.v_head
    G = StageGraph()

    def stage(s, ins, outs):
        G.stages.append((s, list(ins), list(outs)))

    def probe(name, s, ct, shape, heads_axis=-1, rope_from=-1):
        G.probes.append(ProbeSpec(name, s, ct, tuple(shape), heads_axis, rope_from, len(G.probes)))

    rep, hd = "replicated", "heads"
    if input_norm:
        stage("layer_input", [], ["h"])
        probe("h", "layer_input", rep, (T, H))
        stage("input_norm", ["h"], ["x"])
        probe("x", "input_norm", rep, (T, H))
    else:
        stage("layer_input", [], ["x"])
        probe("x", "layer_input", rep, (T, H))
    if dims.has_q_lora:
        stage("q_a_proj", ["x"], ["q_a"])
        probe("q_a", "q_a_proj", rep, (T, Lq))
        stage("q_a_norm", ["q_a"], ["q_c"])
        probe("q_c", "q_a_norm", rep, (T, Lq))
        stage("q_b_proj", ["q_c"], ["q_nope", "q_pe"])
        probe("q_nope", "q_b_proj", hd, (T, N, P), 1)
        probe("q_pe", "q_b_proj", hd, (T, N, R), 1, 0)
    else:
        stage("q_proj", ["x"], ["q_nope", "q_pe"])
        probe("q_nope", "q_proj", hd, (T, N, P), 1)
        probe("q_pe", "q_proj", hd, (T, N, R), 1, 0)
    stage("kv_a_proj", ["x"], ["kv_c", "k_pe"])
    probe("kv_c", "kv_a_proj", rep, (T, L))
    probe("k_pe", "kv_a_proj", rep, (T, R), -1, 0)
    stage("kv_a_norm", ["kv_c"], ["kv_c_norm"])
    probe("kv_c_norm", "kv_a_norm", rep, (T, L))
    stage("rope", ["q_pe", "k_pe"], ["q_pe_rope", "k_pe_rope"])
    probe("q_pe_rope", "rope", hd, (T, N, R), 1, 0)
    probe("k_pe_rope", "rope", rep, (T, R), -1, 0)
    stage("cache_write", ["kv_c_norm", "k_pe_rope"], ["kv_cache"])
    probe("kv_cache", "cache_write", rep, (T, L + R), -1, L)
    selected = []
    if dims.has_dsa:
        Hi, Di = dims.index_n_heads, dims.index_head_dim
        stage("indexer_q", ["q_c"], ["idx_q"])
        probe("idx_q", "indexer_q", rep, (T, Hi, Di), 1)
        stage("indexer_k", ["x"], ["idx_k"])
        probe("idx_k", "indexer_k", rep, (T, Di))
        stage("indexer_weights", ["x"], ["idx_weights"])
        probe("idx_weights", "indexer_weights", rep, (T, Hi), 1)
        stage("index_scores", ["idx_q", "idx_k", "idx_weights"], ["idx_scores"])
        probe("idx_scores", "index_scores", rep, (T, max(keys, 1)))
        stage("topk", ["idx_scores"], ["topk"])
        probe("topk", "topk", rep, (T, dims.index_topk))
        selected = ["topk"]
    if form == "mha":
        stage("kv_b_proj", ["kv_c_norm"], ["k_nope", "v"])
        probe("k_nope", "kv_b_proj", hd, (T, N, P), 1)
        probe("v", "kv_b_proj", hd, (T, N, V), 1)
        stage("attention_mha", ["q_nope", "q_pe_rope", "k_nope", "k_pe_rope", "v"] + selected, ["attn_out", "lse"])
        probe("attn_out", "attention_mha", hd, (T, N, V), 1)
        probe("lse", "attention_mha", hd, (T, N), 1)
    else:
        stage("q_absorb", ["q_nope"], ["q_latent"])
        probe("q_latent", "q_absorb", hd, (T, N, L), 1)
        stage("attention_mqa", ["q_latent", "q_pe_rope"] + selected, ["attn_latent", "lse"])
        probe("attn_latent", "attention_mqa", hd, (T, N, L), 1)
        probe("lse", "attention_mqa", hd, (T, N), 1)
        stage("v_up", ["attn_latent"], ["attn_out"])
        probe("attn_out", "v_up", hd, (T, N, V), 1)
    stage("o_proj", ["attn_out"], ["o_partial"])
    probe("o_partial", "o_proj", "partial", (T, H))
    stage("all_reduce", ["o_partial"], ["o"])
    probe("o", "all_reduce", rep, (T, H))
    if input_norm:
        stage("residual", ["h", "o"], ["h_out"])
        probe("h_out", "residual", rep, (T, H))
    return G


def probe_request(p: ProbeSpec, tp: int, rank: int) -> Dict[str, int]:
    """make_probe_request of core/probe/probe.cpp: tokens, heads held by the rank, the shard's first global column."""
    local = p.local_shape(tp)
    tokens = p.shape[0] if p.shape else 0
    heads = local[p.heads_axis] if p.heads_axis >= 0 else 0
    col_offset = 0
    if p.contract == "heads" and tokens:
        n = 1
        for d in local:
            n *= d
        col_offset = rank * (n // tokens)
    return {"tokens": tokens, "heads": heads, "col_offset": col_offset}
