"""Capture one MLA layer of a Hugging Face transformers model into an mla-bisect dump, without touching the
model's code: forward hooks on the layer's modules, plus the modeling module's rope and attention functions
wrapped for the duration of the capture. `mla-bisect replay` then checks the capture against the reference."""
from __future__ import annotations

import contextlib
import json
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

# Attention classes whose forward this adapter knows (same structure: q_a_proj/q_a_layernorm/q_b_proj or
# q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj, a module-level rope function).
# Kimi-K2 checkpoints run on DeepseekV3Attention.
SUPPORTED_ATTENTION = (
    "DeepseekV2Attention",
    "DeepseekV3Attention",
    "DeepseekV32Attention",
    "Glm4MoeLiteAttention",
    "GlmMoeDsaAttention",
)

# Module-level rope functions of the modeling files, and the lane order of what each returns.
#   apply_rotary_pos_emb_interleave: takes interleaved pairs (2i, 2i+1), returns them de-interleaved
#       (all first lanes, then all second lanes): re-interleaved before recording.
#   apply_rotary_pos_emb: rotate-half pairs (i, i+R/2) in and out (rope_interleave false).
#   apply_rotary_emb (DeepSeek-V2, complex): interleaved in and out.
_ROPE_FUNCTIONS = {
    "apply_rotary_pos_emb_interleave": True,
    "apply_rotary_pos_emb": False,
    "apply_rotary_emb": False,
}

_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass
class _Captured:
    """What one forward of the target layer produced, in HF layouts, until it is written."""

    tensors: dict = field(default_factory=dict)
    position_ids: Any = None
    context: int = 0                # cached tokens before this step
    cache_keys: Any = None          # [B, 1, context, L] kv_c_norm rows of the context
    cache_values: Any = None        # [B, 1, context, R] k_pe_rope rows, HF lane order
    index_keys: Any = None          # DSA: [B, context, Di] the indexer's keys of the context, HF lane order
    rope_deinterleaved: bool = False
    idx_rope_deinterleaved: bool = False  # the same for the DSA indexer's own rope call


class LayerCapture:
    """The handle `capture_layer` yields: `captured` tells whether the layer ran and was written."""

    def __init__(self, path, layer_index, step):
        self.path = path
        self.layer_index = layer_index
        self.step = step
        self.captured = False
        self.probes: list[str] = []
        self.calls = 0


def _find_attention(model, layer_index):
    found = []
    for name, mod in model.named_modules():
        if type(mod).__name__ in SUPPORTED_ATTENTION or (
            hasattr(mod, "kv_a_proj_with_mqa") and hasattr(mod, "kv_b_proj") and hasattr(mod, "o_proj")
        ):
            found.append((name, mod))
    if not found:
        raise ValueError(
            f"capture_layer: {type(model).__name__} has no MLA attention module (supported: "
            f"{', '.join(SUPPORTED_ATTENTION)})"
        )
    for name, mod in found:
        if getattr(mod, "layer_idx", None) == layer_index:
            return name, mod
    indices = sorted(getattr(m, "layer_idx", -1) for _, m in found)
    raise ValueError(
        f"capture_layer: no MLA attention with layer_idx {layer_index} in {type(model).__name__} "
        f"(layers {indices[0]}..{indices[-1]})"
    )


def _find_decoder_layer(model, attn):
    for mod in model.modules():
        if getattr(mod, "self_attn", None) is attn:
            return mod
    return None


def _config_dict(config) -> dict:
    if isinstance(config, dict):
        return dict(config)
    return json.loads(config.to_json_string(use_diff=False))


def _tokens(t, heads=None):
    """[B, S, ...] -> [B*S, ...] (sequences concatenated); with heads, [B*S, heads, -1]."""
    t = t.detach()
    if heads is None:
        return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])
    return t.reshape(t.shape[0] * t.shape[1], heads, -1)


def _bnsd_tokens(t):
    """HF [B, heads, S, D] -> ours [B*S, heads, D]."""
    t = t.detach().transpose(1, 2)
    return t.reshape(t.shape[0] * t.shape[1], t.shape[2], t.shape[3])


def _interleave(t):
    """HF's de-interleaved rope output (first lanes of all pairs, then second lanes) -> pairs (2i, 2i+1)."""
    import torch

    half = t.shape[-1] // 2
    return torch.stack((t[..., :half], t[..., half:]), dim=-1).reshape(t.shape)


def _first(args, kwargs, name, index=0):
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


@contextlib.contextmanager
def capture_layer(
    model,
    layer_index: int,
    path,
    *,
    step: int = 0,
    input_norm: bool = True,
    engine: str = "hf-transformers",
    engine_options: str = "",
    device: str | None = None,
):
    """Records layer `layer_index`'s MLA attention of `model` into the dump `path` while the block runs.

    with capture_layer(model, 3, "capture.h5"):
        model(input_ids)

    step: which forward of that layer to capture (0: the first, the prefill of a generate; 1: the first
    decode step, with HF's DynamicCache as the context, and for a DSA model the indexer's key cache of that
    layer as the context's index_cache). input_norm: start at the decoder layer's input h
    (x = input_layernorm(h); h_out = h + o is recorded) rather than at the attention input x.
    The file is written when that forward ends; `captured` on the yielded handle says whether it happened.
    Sequences of a batch must not be padded (every token of [B, S] is a real token).
    """
    attn_name, attn = _find_attention(model, layer_index)
    layer = _find_decoder_layer(model, attn)
    if input_norm and (layer is None or not hasattr(layer, "input_layernorm")):
        raise ValueError(
            f"capture_layer: no decoder layer with input_layernorm holds {attn_name}; pass input_norm=False "
            "to start at the attention input"
        )
    modeling = sys.modules[type(attn).__module__]
    config = _config_dict(getattr(attn, "config", None) or model.config)
    handle = LayerCapture(path, layer_index, step)
    state = {"recording": False, "in_indexer": False, "cap": None}
    hooks = []
    patches = []  # (namespace, name, previous value or _MISSING)

    def patch(namespace, name, value):
        """Sets namespace[name] (a module's globals or the attention registry) until the block ends."""
        patches.append((namespace, name, namespace.get(name, _MISSING)))
        namespace[name] = value

    def put(name, tensor):
        if state["recording"] and tensor is not None:
            state["cap"].tensors.setdefault(name, tensor.detach())

    # --- step selection: the attention's pre-hook opens the recording, the layer's (or attention's) post-hook
    # writes it.
    def attn_pre(mod, args, kwargs):
        handle.calls += 1
        if handle.calls - 1 != handle.step or handle.captured:
            return
        cap = _Captured()
        cap.position_ids = kwargs.get("position_ids")
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None:
            try:
                cap.context = int(cache.get_seq_length(attn.layer_idx))
            except Exception:
                cap.context = 0
            if cap.context > 0:
                lay = cache.layers[attn.layer_idx]
                cap.cache_keys = lay.keys[..., : cap.context, :].detach().clone()
                cap.cache_values = lay.values[..., : cap.context, :].detach().clone()
                # DSA: the indexer's keys of the context, [B, tokens, Di] on the cache layer (DynamicIndexedLayer,
                # StaticIndexedLayer), written by the indexer's cache.update_indexer.
                index_keys = getattr(lay, "indexer_keys", None)
                if (getattr(attn, "indexer", None) is not None and index_keys is not None
                        and index_keys.dim() == 3 and index_keys.shape[1] >= cap.context):
                    cap.index_keys = index_keys[:, : cap.context].detach().clone()
        if cap.position_ids is None:
            cap.position_ids = kwargs.get("cache_position")
        state["cap"] = cap
        state["recording"] = True
        if not input_norm:
            put("x", _first(args, kwargs, "hidden_states"))

    def attn_post(mod, args, kwargs, output):
        if not state["recording"]:
            return
        # The latent cache rows this step wrote, as HF's cache holds them ([B, 1, S, L] and [B, 1, S, R]).
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        hidden = _first(args, kwargs, "hidden_states")
        layers = getattr(cache, "layers", None)
        if layers is not None and hidden is not None and len(layers) > attn.layer_idx:
            lay = layers[attn.layer_idx]
            keys, values = getattr(lay, "keys", None), getattr(lay, "values", None)
            S = hidden.shape[1]
            if keys is not None and values is not None and keys.dim() == 4 and keys.shape[-2] >= S:
                put("_cache_keys", keys[..., -S:, :])
                put("_cache_values", values[..., -S:, :])
        if not input_norm:
            finish()

    def layer_pre(mod, args, kwargs):
        # Runs before the attention's pre-hook: remember h for the call the attention hook may open.
        state["pending_h"] = _first(args, kwargs, "hidden_states")
        state["pending_pos"] = kwargs.get("position_ids")

    def layer_post(mod, args, kwargs, output):
        if state["recording"]:
            finish()

    def finish():
        state["recording"] = False
        cap = state["cap"]
        state["cap"] = None
        _write(handle, cap, config, attn, engine, engine_options, device, input_norm)

    hooks.append(attn.register_forward_pre_hook(attn_pre, with_kwargs=True))
    hooks.append(attn.register_forward_hook(attn_post, with_kwargs=True))
    if input_norm:
        hooks.append(layer.register_forward_pre_hook(layer_pre, with_kwargs=True))
        hooks.append(layer.register_forward_hook(layer_post, with_kwargs=True))

        def norm_hook(mod, args, output):
            if state["recording"]:
                return
            # input_layernorm runs before the attention opens the recording; keep its output for it.
            state["pending_x"] = output

        hooks.append(layer.input_layernorm.register_forward_hook(norm_hook))

        def h_out_hook(mod, args):
            put("h_out", args[0])

        if hasattr(layer, "post_attention_layernorm"):
            hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(h_out_hook))

        def open_with_layer_input(mod, args, kwargs):
            if state["recording"]:
                put("h", state.get("pending_h"))
                put("x", state.get("pending_x"))
                if state["cap"].position_ids is None:
                    state["cap"].position_ids = state.get("pending_pos")

        hooks.append(attn.register_forward_pre_hook(open_with_layer_input, with_kwargs=True))

    def out_hook(name):
        return lambda mod, args, output: put(name, output)

    def in_hook(name):
        return lambda mod, args: put(name, args[0])

    if getattr(attn, "q_a_proj", None) is not None:
        hooks.append(attn.q_a_layernorm.register_forward_pre_hook(in_hook("q_a")))
        hooks.append(attn.q_a_layernorm.register_forward_hook(out_hook("q_c")))
        hooks.append(attn.q_b_proj.register_forward_hook(out_hook("_q")))
    else:
        hooks.append(attn.q_proj.register_forward_hook(out_hook("_q")))
    hooks.append(attn.kv_a_proj_with_mqa.register_forward_hook(out_hook("_kv_a")))
    hooks.append(attn.kv_a_layernorm.register_forward_pre_hook(in_hook("kv_c")))
    hooks.append(attn.kv_a_layernorm.register_forward_hook(out_hook("kv_c_norm")))
    hooks.append(attn.kv_b_proj.register_forward_hook(out_hook("_kv_b")))
    hooks.append(attn.o_proj.register_forward_pre_hook(in_hook("attn_out")))
    hooks.append(attn.o_proj.register_forward_hook(out_hook("o")))
    indexer = getattr(attn, "indexer", None)
    if indexer is not None:
        # DSA: the indexer's projections, its top-k indices [B, S, topk] (the module's output), and (in wrap_rope)
        # its own rope call, which must not be taken for the attention's.
        def idx_pre(mod, args):
            state["in_indexer"] = True

        def idx_post(mod, args, output):
            state["in_indexer"] = False
            if getattr(output, "dim", None) is not None and output.dim() == 3:
                put("_topk", output)

        hooks.append(indexer.register_forward_pre_hook(idx_pre))
        hooks.append(indexer.register_forward_hook(idx_post))
        hooks.append(indexer.wq_b.register_forward_hook(out_hook("_idx_q")))
        hooks.append(indexer.k_norm.register_forward_hook(out_hook("_idx_k")))
        hooks.append(indexer.weights_proj.register_forward_hook(out_hook("_idx_w")))

    # --- the rope functions of the modeling module.
    # The first call records (a rope function that calls another is recorded by the inner one, whose output the
    # outer returns): in the attention, q_pe / k_pe [B, N, S, R] and [B, 1, S, R]; in the indexer, the rope lanes
    # of its q [B, S, Hi, R] and k [B, S, 1, R].
    def wrap_rope(fn, deinterleaved):
        def wrapped(q, k, *args, **kwargs):
            q_out, k_out = fn(q, k, *args, **kwargs)
            unsqueeze = kwargs.get("unsqueeze_dim", 1)
            if (state["recording"] and state["in_indexer"] and q.dim() == 4
                    and "_idx_q_rope" not in state["cap"].tensors):
                put("_idx_q_rope", q_out)
                put("_idx_k_rope", k_out)
                state["cap"].idx_rope_deinterleaved = deinterleaved
            elif (state["recording"] and not state["in_indexer"] and unsqueeze == 1 and q.dim() == 4
                    and "q_pe_rope" not in state["cap"].tensors):
                put("q_pe", q)
                put("k_pe", k)
                put("q_pe_rope", q_out)
                put("k_pe_rope", k_out)
                state["cap"].rope_deinterleaved = deinterleaved
            return q_out, k_out

        wrapped.__wrapped__ = fn
        return wrapped

    for fname, deinterleaved in _ROPE_FUNCTIONS.items():
        fn = modeling.__dict__.get(fname)
        if callable(fn):
            patch(modeling.__dict__, fname, wrap_rope(fn, deinterleaved))

    # --- the attention function: what the softmax actually consumed (q_nope, k_nope, v after HF's splits).
    def wrap_attention(fn):
        def wrapped(module, query, key, value, attention_mask, *args, **kwargs):
            out = fn(module, query, key, value, attention_mask, *args, **kwargs)
            if module is attn and state["recording"] and "_query" not in state["cap"].tensors:
                put("_query", query)
                put("_key", key)
                put("_value", value)
            return out

        wrapped.__wrapped__ = fn
        return wrapped

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    impl = getattr(attn.config, "_attn_implementation", None) or "eager"
    if impl == "eager" or impl not in ALL_ATTENTION_FUNCTIONS:
        if callable(modeling.__dict__.get("eager_attention_forward")):
            patch(modeling.__dict__, "eager_attention_forward", wrap_attention(modeling.eager_attention_forward))
    else:
        local = ALL_ATTENTION_FUNCTIONS._local_mapping
        patch(local, impl, wrap_attention(ALL_ATTENTION_FUNCTIONS[impl]))

    try:
        yield handle
        if not handle.captured:
            warnings.warn(
                f"capture_layer: nothing written to {path}: layer {layer_index} ran {handle.calls} time(s) inside "
                f"the block, step {step} was asked for"
            )
    finally:
        for h in hooks:
            h.remove()
        for namespace, name, prev in reversed(patches):
            if prev is _MISSING:
                namespace.pop(name, None)
            else:
                namespace[name] = prev


class _Missing:
    pass


_MISSING = _Missing()


def _write(handle, cap, config, attn, engine, engine_options, device, input_norm):
    import torch

    from .capture import Recorder

    t = cap.tensors
    N, P, R, V = attn.num_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim
    L = attn.kv_lora_rank
    ref = t.get("h") if input_norm else t.get("x")
    if ref is None:
        raise RuntimeError(f"capture_layer: layer {handle.layer_index}'s input was not seen")
    B, S = ref.shape[0], ref.shape[1]
    probes = {}
    for name in ("h", "x", "q_a", "q_c", "kv_c", "kv_c_norm", "h_out"):
        if name in t:
            probes[name] = _tokens(t[name])
    q = _tokens(t["_q"], N)
    q_nope_proj, q_pe_proj = q[..., :P], q[..., P:]
    kv_a = _tokens(t["_kv_a"])
    probes.setdefault("kv_c", kv_a[..., :L])
    # After HF's own splits where they can be seen (rope inputs, the attention's operands); else the projections'.
    probes["q_nope"] = _bnsd_tokens(t["_query"])[..., :P] if "_query" in t else q_nope_proj
    probes["q_pe"] = _bnsd_tokens(t["q_pe"]) if "q_pe" in t else q_pe_proj
    probes["k_pe"] = _bnsd_tokens(t["k_pe"])[:, 0] if "k_pe" in t else kv_a[..., L:]
    if "q_pe_rope" in t:
        q_rope, k_rope = _bnsd_tokens(t["q_pe_rope"]), _bnsd_tokens(t["k_pe_rope"])[:, 0]
        if cap.rope_deinterleaved:
            q_rope, k_rope = _interleave(q_rope), _interleave(k_rope)
        probes["q_pe_rope"], probes["k_pe_rope"] = q_rope, k_rope
    if "_key" in t:  # [B, N, ctx + S, D]: this step's rows are the last S
        key, value = t["_key"][:, :, -S:], t["_value"][:, :, -S:]
        probes["k_nope"] = _bnsd_tokens(key)[..., :P]
        probes["v"] = _bnsd_tokens(value)
    elif "_kv_b" in t:
        kv_b = _tokens(t["_kv_b"], N)
        probes["k_nope"], probes["v"] = kv_b[..., :P], kv_b[..., P:]
    if "_cache_keys" in t and t["_cache_keys"].shape[-1] == L and t["_cache_values"].shape[-1] == R:
        rows = _bnsd_tokens(t["_cache_values"])[:, 0]
        if cap.rope_deinterleaved:
            rows = _interleave(rows)
        probes["kv_cache"] = torch.cat((_bnsd_tokens(t["_cache_keys"])[:, 0], rows), dim=-1)
    if "attn_out" in t:
        probes["attn_out"] = _tokens(t["attn_out"], N)
    if "o" in t:
        probes["o_partial"] = _tokens(t["o"])
        probes["o"] = probes["o_partial"]
    if getattr(attn, "indexer", None) is not None:
        probes.update(_indexer_probes(t, cap, attn.indexer))

    # Inputs: positions per token, the batch layout, and for a step after a prefill the latent cache.
    pos = cap.position_ids
    if pos is None:
        pos = torch.arange(cap.context, cap.context + S)
    pos = pos.detach().to("cpu").reshape(-1, pos.shape[-1])
    if pos.shape[0] != B:
        pos = pos.expand(B, S)
    positions = pos.reshape(-1).to(torch.int32).numpy()
    seq_lens = [S] * B
    context_lens = [cap.context] * B
    dtype = _DTYPE_NAMES.get(str(ref.dtype).removeprefix("torch."), "fp32")
    index_cache = None
    if cap.context == 0:
        mode = "prefill"
        block_table = kv_cache = None
    else:
        mode = "decode" if S == 1 else "chunked"
        block_table, kv_cache = _paged_cache(cap, B, S, L, R)
        if cap.index_keys is not None:
            index_cache = _paged_index_cache(cap, block_table, kv_cache.shape[1], R)
    kind = "h" if input_norm else "x"
    with Recorder(
        handle.path,
        config,
        mode=mode,
        form="mha",
        tp=1,
        engine=engine,
        engine_options=engine_options,
        engine_dtype=dtype,
        device=device or str(ref.device),
        layer_index=handle.layer_index,
    ) as rec:
        rec.inputs(
            **{kind: probes[kind]},
            positions=positions,
            seq_lens=seq_lens,
            context_lens=context_lens,
            block_table=block_table,
            kv_cache=kv_cache,
            index_cache=index_cache,
        )
        for name, tensor in probes.items():
            rec.probe(name, tensor.contiguous(), rank=0)
    handle.captured = True
    handle.probes = list(probes)


def _indexer_probes(t, cap, indexer):
    """DSA's indexer probes from what its modules and rope call produced: idx_q [T, Hi, Di] and idx_k [T, Di] with
    the rope lanes (their first R) as the rope function returned them, in our lane order; idx_weights [T, Hi] =
    weights_proj(x) * Hi^-0.5 in fp32, as HF scales it; topk [T, index_topk], the selection per token (idx_scores
    is a local of HF's forward, not recorded)."""
    import torch

    probes = {}
    Hi = indexer.n_heads
    if "_idx_q_rope" in t:
        order = _interleave if cap.idx_rope_deinterleaved else (lambda lanes: lanes)
        if "_idx_q" in t:
            q = _tokens(t["_idx_q"], Hi)
            rope = order(_tokens(t["_idx_q_rope"]))  # [T, Hi, R]
            probes["idx_q"] = torch.cat((rope, q[..., rope.shape[-1]:]), dim=-1)
        if "_idx_k" in t:
            k = _tokens(t["_idx_k"])
            rope = order(_tokens(t["_idx_k_rope"])[:, 0])  # [T, R]
            probes["idx_k"] = torch.cat((rope, k[..., rope.shape[-1]:]), dim=-1)
    if "_idx_w" in t:
        probes["idx_weights"] = _tokens(t["_idx_w"]).float() * (Hi ** -0.5)
    if "_topk" in t:
        probes["topk"] = _selection(t["_topk"], cap.context, indexer.index_topk)
    return probes


def _selection(topk, context, k):
    """HF's top-k indices [B, S, n] (int32; n = min(index_topk, keys); a token that sees fewer than n keys is given
    some it cannot see) -> [B*S, k] float32: per token the keys it sees (key <= context + s), ascending, then -1."""
    import torch

    idx = topk.detach().to("cpu", torch.int64)
    B, S, n = idx.shape
    limit = context + torch.arange(S).view(1, S, 1)
    unseen = torch.iinfo(torch.int64).max
    idx = torch.where((idx >= 0) & (idx <= limit), idx, unseen).sort(dim=-1).values[..., :k]
    out = torch.full((B, S, k), -1.0)
    out[..., : idx.shape[-1]] = torch.where(idx == unseen, -1, idx).float()
    return out.reshape(B * S, k)


_PAGE = 64  # rows per page of the paged caches


def _paged_cache(cap, B, S, L, R):
    """The context rows of HF's DynamicCache as our paged latent cache: [1, num_blocks, 64, L + R] with rows
    [kv_c_norm | k_pe_rope] (rope lanes in our order), sequence b on pages b*per .. b*per+per-1, a spare page last."""
    import numpy as np
    import torch

    page = _PAGE
    ctx = cap.context
    per = (ctx + S + page - 1) // page
    num_blocks = B * per + 1
    block_table = np.full((B, per + 1), num_blocks - 1, dtype=np.int32)
    cache = np.zeros((1, num_blocks, page, L + R), dtype=np.float32)
    keys = cap.cache_keys.float().cpu()[:, 0]      # [B, ctx, L]
    values = cap.cache_values.float().cpu()[:, 0]  # [B, ctx, R]
    if cap.rope_deinterleaved:
        values = _interleave(values)
    for b in range(B):
        for j in range(per):
            block_table[b, j] = b * per + j
    _page_rows(cache, block_table, torch.cat((keys, values), dim=-1))
    return block_table, cache


def _paged_index_cache(cap, block_table, num_blocks, R):
    """The indexer's keys of the context (DSA) as our paged index cache: [1, num_blocks, 64, Di] float32, rows idx_k
    (the rope lanes, the first R, in our order) on the pages and slots of the latent cache's block_table."""
    import numpy as np
    import torch

    keys = cap.index_keys.float().cpu()  # [B, ctx, Di]
    if cap.idx_rope_deinterleaved:
        keys = torch.cat((_interleave(keys[..., :R]), keys[..., R:]), dim=-1)
    cache = np.zeros((1, num_blocks, _PAGE, keys.shape[-1]), dtype=np.float32)
    _page_rows(cache, block_table, keys)
    return cache


def _page_rows(cache, block_table, rows):
    """rows [B, ctx, D] (torch) into cache [1, num_blocks, 64, D]: token p of sequence b on page
    block_table[b, p // 64], slot p % 64."""
    page = cache.shape[2]
    for b in range(rows.shape[0]):
        for p in range(rows.shape[1]):
            cache[0, block_table[b, p // page], p % page] = rows[b, p].numpy()
