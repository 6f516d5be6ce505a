"""Capture every MLA layer of a Hugging Face transformers model in one forward.

    from mla_bisect.hf import capture_model
    with torch.no_grad(), capture_model(model, "cap.h5", tokens=input_ids.numel()) as run:
        model(input_ids)
    # cap.layer0.h5, cap.layer1.h5, ...:  mla-bisect replay cap.h5 --weights CKPT

Each layer is written as its own single-layer capture (capture_layer) to PATH.layer<L>.h5 as soon as that layer's
forward ends: its input h and (for a decode step) its cache in full, its probes at `probe_level` (sketch by default:
small files; replay tells which layer's MLA diverges on its own inputs; capture that layer again with
capture_layer at probe_level "full" to isolate the stage and test causes). A crash mid-forward leaves the layers
already written readable. Files of an earlier capture at the same PATH are moved aside (FILE.previous)."""
from __future__ import annotations

import contextlib
import glob
import os
import re
import sys

from .hf import _config_dict, _find_attention, capture_layer

_SKETCH_LANES = 32


def _mla_layers(model):
    """The layer_idx of every MLA attention module of `model`, ascending."""
    from .hf import SUPPORTED_ATTENTION

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
