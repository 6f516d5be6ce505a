"""Capture MLA layers of a Hugging Face transformers model into mla-bisect dumps, without touching the model's
code: forward hooks on the layer's modules, plus the modeling module's rope and attention functions wrapped for the
duration of the capture. capture_layer records one layer with every probe; capture_model records every MLA layer
of one forward (below). `mla-bisect replay` then checks a capture against the reference."""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
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
    attention_mask: Any = None      # the model call's 2D padding mask [B, context + S] (1: a real token), or None
    rope_deinterleaved: bool = False
    idx_rope_deinterleaved: bool = False  # the same for the DSA indexer's own rope call


class LayerCapture:
    """The handle `capture_layer` yields: `captured` tells whether the layer ran and was written."""

    def __init__(self, path, layer_index, step, probe_level="full"):
        self.path = path
        self.layer_index = layer_index
        self.step = step
        self.probe_level = probe_level
        self.captured = False
        self.probes: list[str] = []
        self.calls = 0
        self.error: str | None = None  # why the step asked for was not recorded (the model's forward went on)


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
    probe_level: str = "full",
):
    """Records layer `layer_index`'s MLA attention of `model` into the dump `path` while the block runs.

    with capture_layer(model, 3, "capture.h5"):
        model(input_ids)

    step: which forward of that layer to capture (0: the first, the prefill of a generate; 1: the first
    decode step, with HF's DynamicCache as the context, and for a DSA model the indexer's key cache of that
    layer as the context's index_cache). input_norm: start at the decoder layer's input h
    (x = input_layernorm(h); h_out = h + o is recorded) rather than at the attention input x.
    The file is written when that forward ends; `captured` on the yielded handle says whether it happened.
    A padded batch (left or right) is recorded as its real tokens: the model call's 2D attention_mask says which
    they are (a call without one: every token of [B, S] is real). Positions are the call's position_ids, starting
    anywhere. A step the adapter cannot record is warned about and its reason written to `path` (status
    "stopped: ..."; `error` on the handle); the model's forward is never interrupted by the capture.
    probe_level: "full" (every probe's tensor: replay can isolate each stage and test causes), "sketch" or "stats"
    (statistics only: small files; the layer's input stays in full in /inputs either way).
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
    handle = LayerCapture(path, layer_index, step, probe_level)
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
        cap.attention_mask = state.get("attention_mask")
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
        # A capture never breaks the program it observes: what cannot be recorded is warned about and written into
        # the file as the reason (status "stopped: ..."), and the model's forward goes on.
        state["recording"] = False
        cap = state["cap"]
        state["cap"] = None
        try:
            _write(handle, cap, config, attn, engine, engine_options, device, input_norm)
        except Exception as e:  # noqa: BLE001 - any failure of the capture's own code
            handle.error = f"{type(e).__name__}: {e}"
            warnings.warn(f"capture_layer: layer {layer_index} step {step} was not recorded to {path}: "
                          f"{handle.error}", stacklevel=2)
            _write_reason(handle, cap, config, engine, device, input_norm)

    def model_pre(mod, args, kwargs):
        # The call's padding mask ([B, context + S], 1 for real tokens), for the layer's call inside it.
        m = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        state["attention_mask"] = m if getattr(m, "dim", None) is not None and m.dim() == 2 else None

    if model is not attn and model is not layer:
        hooks.append(model.register_forward_pre_hook(model_pre, with_kwargs=True))
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
        if not handle.captured and handle.error is None:
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


def _real_tokens(cap, B, S):
    """(new [B, S], context [B, ctx]) booleans: which of the step's tokens and of the cached ones are real (the model
    call's attention_mask), all True without a mask."""
    import torch

    ctx = cap.context
    m = cap.attention_mask
    if m is None or m.dim() != 2 or m.shape[0] != B or m.shape[1] < S:
        return torch.ones(B, S, dtype=torch.bool), torch.ones(B, ctx, dtype=torch.bool)
    m = m.detach().to("cpu") != 0
    new = m[:, -S:]
    context = m[:, : m.shape[1] - S][:, -ctx:] if ctx else torch.ones(B, 0, dtype=torch.bool)
    if context.shape[1] != ctx:  # a mask shorter than the cache: the cached tokens it does not cover are real
        context = torch.cat((torch.ones(B, ctx - context.shape[1], dtype=torch.bool), context), dim=1)
    return new, context


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

    # Padding: only the real tokens of each sequence are the step (the model call's attention_mask); a sequence
    # with no real new token is not part of it. Every probe keeps the real tokens' rows, sequences concatenated.
    new_real, ctx_real = _real_tokens(cap, B, S)
    seqs = [b for b in range(B) if bool(new_real[b].any())]
    if not seqs:
        raise ValueError("the attention_mask marks every new token of the step as padding")
    keep = torch.zeros(B, S, dtype=torch.bool)
    keep[seqs] = new_real[seqs]
    keep_rows = keep.reshape(-1)
    padded = not bool(keep_rows.all())
    if getattr(attn, "indexer", None) is not None:
        probes.update(_indexer_probes(t, cap, attn.indexer, new_real, ctx_real))
    if padded:
        probes = {name: tensor[keep_rows.to(tensor.device)] for name, tensor in probes.items()}

    # Inputs: positions per token, the batch layout, and for a step after a prefill the latent cache.
    pos = cap.position_ids
    if pos is None:
        pos = torch.arange(cap.context, cap.context + S)
    pos = pos.detach().to("cpu").reshape(-1, pos.shape[-1])
    if pos.shape[0] != B:
        pos = pos.expand(B, S)
    positions = pos.reshape(-1)[keep_rows].to(torch.int32).numpy()
    seq_lens = [int(keep[b].sum()) for b in seqs]
    context_lens = [int(ctx_real[b].sum()) for b in seqs]
    dtype = _DTYPE_NAMES.get(str(ref.dtype).removeprefix("torch."), "fp32")
    index_cache = None
    if cap.context == 0:
        mode = "prefill"
        block_table = kv_cache = None
    else:
        mode = "decode" if all(n == 1 for n in seq_lens) else "chunked"
        block_table, kv_cache = _paged_cache(cap, seqs, ctx_real, seq_lens, L, R)
        if cap.index_keys is not None:
            index_cache = _paged_index_cache(cap, seqs, ctx_real, block_table, kv_cache.shape[1], R)
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
        probe_level=handle.probe_level,
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
            rec.probe(name, tensor, rank=0)
    handle.captured = True
    handle.probes = list(probes)


def _write_reason(handle, cap, config, engine, device, input_norm):
    """A dump at the capture's path that says why the layer was not recorded (status "stopped: ..."), so that
    `mla-bisect inspect` / `replay` of it tell the reason instead of reading an older file."""
    from .dump_write import DumpWriter

    try:
        ref = (cap.tensors.get("h") if input_norm else cap.tensors.get("x")) if cap is not None else None
        tokens = int(ref.shape[0] * ref.shape[1]) if ref is not None and ref.dim() == 3 else 1
        w = DumpWriter(handle.path, config, tokens=tokens, engine=engine, engine_dtype="fp32", input_norm=input_norm,
                       layer_index=handle.layer_index, device=device or "")
        w.close(f"stopped: before the first probe (capture_layer could not record layer {handle.layer_index}: "
                f"{handle.error})")
    except Exception as e:  # noqa: BLE001 - the warning has said it; the model's forward goes on
        warnings.warn(f"capture_layer: the reason could not be written to {handle.path} either: {e}", stacklevel=3)


def _indexer_probes(t, cap, indexer, new_real, ctx_real):
    """DSA's indexer probes from what its modules and rope call produced: idx_q [T, Hi, Di] and idx_k [T, Di] with
    the rope lanes (their first R) as the rope function returned them, in our lane order; idx_weights [T, Hi] =
    weights_proj(x) * Hi^-0.5 in fp32, as HF scales it; topk [T, index_topk], the selection per token (idx_scores
    is a local of HF's forward, not recorded). Rows of every token of [B, S], padding included."""
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
        probes["topk"] = _selection(t["_topk"], new_real, ctx_real, indexer.index_topk)
    return probes


def _selection(topk, new_real, ctx_real, k):
    """HF's top-k indices [B, S, n] (n = min(index_topk, keys), by descending score; keys numbered over the padded
    [context | new] layout) -> [B*S, k] float32: per token the keys the indexer selected, numbered among the real
    tokens of its sequence, ascending, then -1. Of HF's n, the first min(n, visible) are the selection, where visible
    is the number of real keys up to the token; the rest is topk's filler (keys the mask gave score -inf), as are
    padding keys. Keys past the token are kept: an indexer that selects them is what the capture must show."""
    import torch

    idx = topk.detach().to("cpu", torch.int64)
    B, S, n = idx.shape
    real = torch.cat((ctx_real, new_real), dim=1)  # [B, keys]
    keys = real.shape[1]
    number = torch.cumsum(real.long(), dim=1) - 1  # a real key's number among its sequence's real keys
    visible = number[:, keys - S:] + 1  # [B, S]: real keys up to and including token s
    unseen = torch.iinfo(torch.int64).max
    inside = (idx >= 0) & (idx < keys)
    safe = idx.clamp(0, max(keys - 1, 0))
    is_real = torch.gather(real.unsqueeze(1).expand(B, S, keys), 2, safe) & inside
    mapped = torch.gather(number.unsqueeze(1).expand(B, S, keys), 2, safe)
    chosen = torch.arange(n).view(1, 1, n) < visible.unsqueeze(-1)
    idx = torch.where(chosen & is_real, mapped, unseen).sort(dim=-1).values[..., :k]
    out = torch.full((B, S, k), -1.0)
    out[..., : idx.shape[-1]] = torch.where(idx == unseen, -1, idx).float()
    return out.reshape(B * S, k)


_PAGE = 64  # rows per page of the paged caches


def _paged_cache(cap, seqs, ctx_real, seq_lens, L, R):
    """The real context rows of HF's DynamicCache as our paged latent cache: [1, num_blocks, 64, L + R] with rows
    [kv_c_norm | k_pe_rope] (rope lanes in our order); sequence i (of those in the step) on consecutive pages, a
    spare page last."""
    import numpy as np
    import torch

    keys = cap.cache_keys.float().cpu()[:, 0]      # [B, ctx, L]
    values = cap.cache_values.float().cpu()[:, 0]  # [B, ctx, R]
    if cap.rope_deinterleaved:
        values = _interleave(values)
    rows = [torch.cat((keys[b][ctx_real[b]], values[b][ctx_real[b]]), dim=-1) for b in seqs]
    block_table, num_blocks = _block_table([r.shape[0] for r in rows], seq_lens)
    cache = np.zeros((1, num_blocks, _PAGE, L + R), dtype=np.float32)
    _page_rows(cache, block_table, rows)
    return block_table, cache


def _block_table(context_lens, seq_lens):
    """Consecutive pages per sequence for its context and new tokens, a spare page last: (table, num_blocks)."""
    import numpy as np

    per = [(c + n + _PAGE - 1) // _PAGE for c, n in zip(context_lens, seq_lens)]
    num_blocks = sum(per) + 1
    table = np.full((len(per), max(per) + 1), num_blocks - 1, dtype=np.int32)
    first = 0
    for i, p in enumerate(per):
        table[i, :p] = np.arange(first, first + p)
        first += p
    return table, num_blocks


def _paged_index_cache(cap, seqs, ctx_real, block_table, num_blocks, R):
    """The indexer's keys of the real context (DSA) as our paged index cache: [1, num_blocks, 64, Di] float32, rows
    idx_k (the rope lanes, the first R, in our order) on the pages and slots of the latent cache's block_table."""
    import numpy as np
    import torch

    keys = cap.index_keys.float().cpu()  # [B, ctx, Di]
    if cap.idx_rope_deinterleaved:
        keys = torch.cat((_interleave(keys[..., :R]), keys[..., R:]), dim=-1)
    cache = np.zeros((1, num_blocks, _PAGE, keys.shape[-1]), dtype=np.float32)
    _page_rows(cache, block_table, [keys[b][ctx_real[b]] for b in seqs])
    return cache


def _page_rows(cache, block_table, rows):
    """rows (per sequence, [ctx_i, D] torch) into cache [1, num_blocks, 64, D]: token p of sequence i on page
    block_table[i, p // 64], slot p % 64."""
    page = cache.shape[2]
    for i, r in enumerate(rows):
        r = r.numpy()
        for p0 in range(0, r.shape[0], page):
            n = min(page, r.shape[0] - p0)
            cache[0, block_table[i, p0 // page], :n] = r[p0:p0 + n]


# ---- A whole model in one forward -------------------------------------------------------------------------------
# Capture every MLA layer of a Hugging Face transformers model in one forward.
#
#     from mla_bisect.hf import capture_model
#     with torch.no_grad(), capture_model(model, "cap.h5", tokens=input_ids.numel()) as run:
#         model(input_ids)
#     # cap.layer0.h5, cap.layer1.h5, ...:  mla-bisect replay cap.h5 --weights CKPT
#
# Each layer is written as its own single-layer capture (capture_layer) to PATH.layer<L>.h5 as soon as that layer's
# forward ends: its input h and (for a decode step) its cache in full, its probes at `probe_level` (sketch by default:
# small files; replay tells which layer's MLA diverges on its own inputs; capture that layer again with
# capture_layer at probe_level "full" to isolate the stage and test causes). A crash mid-forward leaves the layers
# already written readable. Files of an earlier capture at the same PATH are moved aside (FILE.previous).

_SKETCH_LANES = 32


def _mla_layers(model):
    """The layer_idx of every MLA attention module of `model`, ascending."""
    out = []
    for _, mod in model.named_modules():
        if type(mod).__name__ in SUPPORTED_ATTENTION or (
            hasattr(mod, "kv_a_proj_with_mqa") and hasattr(mod, "kv_b_proj") and hasattr(mod, "o_proj")
        ):
            idx = getattr(mod, "layer_idx", None)
            if idx is not None:
                out.append(int(idx))
    return sorted(set(out))


def layer_path(path, layer: int) -> str:
    """PATH.h5 -> PATH.layer<L>.h5: where capture_model writes layer L."""
    path = os.fspath(path)
    stem = path[:-3] if path.endswith(".h5") else path
    return f"{stem}.layer{layer}.h5"


def estimate_capture_bytes(config, tokens: int, layers: int, probe_level: str = "sketch", context: int = 0) -> int:
    """About how many bytes capture_model writes for `layers` layers of a step of `tokens` new tokens over
    `context` cached tokens per layer: the input h in full, the cache rows, and the probes at `probe_level`."""
    c = _config_dict(config) if not isinstance(config, dict) else config
    H, N = int(c["hidden_size"]), int(c["num_attention_heads"])
    Lq = int(c.get("q_lora_rank") or 0)
    L, P, R, V = (int(c["kv_lora_rank"]), int(c["qk_nope_head_dim"]), int(c["qk_rope_head_dim"]),
                  int(c["v_head_dim"]))
    T = int(tokens)
    widths = {"h": H, "x": H, "q_a": Lq, "q_c": Lq, "q_nope": N * P, "q_pe": N * R, "kv_c": L, "k_pe": R,
              "kv_c_norm": L, "q_pe_rope": N * R, "k_pe_rope": R, "kv_cache": L + R, "k_nope": N * P, "v": N * V,
              "attn_out": N * V, "lse": N, "o_partial": H, "o": H, "h_out": H}
    per_probe_small = {"stats": 4 * (T + N), "sketch": 4 * (T * (_SKETCH_LANES + 1) + T * N)}
    probes = 0
    for w in widths.values():
        probes += 4 * T * w if probe_level == "full" else per_probe_small.get(probe_level, 0) + 256
    per_layer = 4 * T * H + 4 * context * (L + R) + probes + 64 * 1024  # input, cache rows, probes, metadata
    return layers * per_layer


class ModelCapture:
    """What capture_model yields: `layers` (the handles of capture_layer, by layer), `paths`, `captured` (the
    layers written) and `errors` (layer -> why it was not recorded)."""

    def __init__(self, path, layers):
        self.path = os.fspath(path)
        self.layers = {}
        self.paths = {l: layer_path(path, l) for l in layers}

    @property
    def captured(self):
        return sorted(l for l, h in self.layers.items() if h.captured)

    @property
    def errors(self):
        return {l: h.error for l, h in self.layers.items() if h.error}


def _move_aside(path):
    """Moves an earlier whole-model capture at PATH (PATH.layer*.h5 and their journals, rank parts) aside as
    FILE.previous, so that replay never mixes two captures' layers."""
    stem = path[:-3] if path.endswith(".h5") else path
    pat = re.compile(re.escape(os.path.basename(stem)) + r"\.layer\d+(\.rank\d+)?\.h5(\.journal)?$")
    for f in glob.glob(glob.escape(stem) + ".layer*"):
        if pat.match(os.path.basename(f)):
            os.replace(f, f + ".previous")


@contextlib.contextmanager
def capture_model(model, path, layers=None, *, step: int = 0, probe_level: str = "sketch", tokens: int | None = None,
                  context: int = 0, budget_bytes: int | None = None, input_norm: bool = True,
                  engine: str = "hf-transformers", engine_options: str = "", device: str | None = None):
    """Records `layers` (default: every MLA layer) of `model` during the next forward (or the `step`-th one: 1 is
    the first decode step of a generate) into PATH.layer<L>.h5, one single-layer capture per layer.

    tokens (and context, cached tokens per layer for a decode step): when given, the files' size is estimated and
    printed before the forward, and a capture that would exceed budget_bytes is refused (ValueError) before any
    hook is installed. The model's forward is never interrupted by the capture (see capture_layer)."""
    path = os.fspath(path)
    if os.path.exists(path):
        raise ValueError(f"capture_model: {path} exists; a whole-model capture is the set {layer_path(path, 0)} ... "
                         "beside a PATH that is not a file (replay reads PATH as that set): choose another PATH")
    all_layers = _mla_layers(model)
    if not all_layers:
        _find_attention(model, 0)  # raises, naming the supported attention classes
    chosen = all_layers if layers is None else sorted(set(int(l) for l in layers))
    missing = [l for l in chosen if l not in all_layers]
    if missing:
        raise ValueError(f"capture_model: no MLA attention at layers {missing} (the model has "
                         f"{all_layers[0]}..{all_layers[-1]})")
    if tokens is not None:
        size = estimate_capture_bytes(model.config, tokens, len(chosen), probe_level, context)
        print(f"capture_model: {len(chosen)} layers at probe level {probe_level} to {layer_path(path, chosen[0])} "
              f"...: about {size / 2**20:.1f} MiB", file=sys.stderr)
        if budget_bytes is not None and size > budget_bytes:
            raise ValueError(f"capture_model: about {size / 2**20:.1f} MiB for {len(chosen)} layers x {tokens} tokens "
                             f"at probe level {probe_level} exceeds budget_bytes ({budget_bytes / 2**20:.1f} MiB): "
                             "fewer layers, fewer tokens, or probe_level 'sketch'/'stats'")
    elif budget_bytes is not None:
        raise ValueError("capture_model: budget_bytes needs tokens (the step's new tokens) to estimate the size")
    _move_aside(path)
    run = ModelCapture(path, chosen)
    with contextlib.ExitStack() as stack:
        for l in chosen:
            run.layers[l] = stack.enter_context(capture_layer(
                model, l, run.paths[l], step=step, input_norm=input_norm, engine=engine,
                engine_options=engine_options, device=device, probe_level=probe_level))
        yield run
