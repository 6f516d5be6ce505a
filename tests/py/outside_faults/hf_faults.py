"""Faults captured from HF transformers models: tiny DeepseekV3 / GlmMoeDsa models with random weights (saved as a
safetensors checkpoint), a bug patched into the modeling code or the loaded model at runtime, layer 1 captured with
mla_bisect.hf.capture_layer and replayed. Each fault carries its expected answer, written before any run, and is
scored by run.score like the numpy faults."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Optional

from .run import replay, score

LAYER = 1
TOKENS = 12
BATCH = 2

TINY = dict(vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4,
            num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=12,
            qk_nope_head_dim=16, first_k_dense_replace=1, max_position_embeddings=256, n_group=1, topk_group=1)


def _yarn(factor, mscale, mscale_all_dim, theta=10000.0):
    return {"rope_parameters": {"rope_type": "yarn", "rope_theta": theta, "factor": factor,
                                "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                                "mscale": mscale, "mscale_all_dim": mscale_all_dim},
            "max_position_embeddings": int(64 * factor)}


# name -> (HF class family, config overrides)
HF_MODELS = {
    "hf_deepseek_v3": ("deepseek_v3", dict(**_yarn(40, 1.0, 1.0))),
    "hf_deepseek_v3_neox": ("deepseek_v3", dict(rope_interleave=False, max_position_embeddings=4096)),
    "hf_glm_moe_dsa": ("glm_moe_dsa", dict(index_topk=8, index_head_dim=16, index_n_heads=8, n_group=1)),
}


@dataclass
class HFFault:
    name: str
    source: str
    project: str
    what: str
    model: str
    plant: Callable          # plant(modeling_module, model, patch) after the model is loaded
    stage: Optional[str]
    expected: Optional[frozenset]
    position_offset: int = 0
    config: str = ""

    def __post_init__(self):
        self.config = self.model


HF_FAULTS: list = []


def hf_fault(name, source, project, model, stage, expected, position_offset=0):
    def register(fn):
        HF_FAULTS.append(HFFault(name=name, source=source, project=project, what=(fn.__doc__ or "").strip(),
                                 model=model, plant=fn, stage=stage,
                                 expected=frozenset(expected) if expected is not None else None,
                                 position_offset=position_offset))
        return fn
    return register


def _modeling(kind):
    import importlib

    return importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")


def _classes(kind):
    import transformers as t

    return {
        "deepseek_v3": (t.DeepseekV3Config, t.DeepseekV3ForCausalLM),
        "glm_moe_dsa": (getattr(t, "GlmMoeDsaConfig", None), getattr(t, "GlmMoeDsaForCausalLM", None)),
    }[kind]


def available(model):
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return _classes(HF_MODELS[model][0])[0] is not None


def _init_weights(model, seed):
    """Projections ~ N(0, (1.5 / sqrt(fan_in))^2), embeddings N(0, 1), norm gains near 1; bf16-exact."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                scale = 1.0 if "embed" in name else 1.5 / p.shape[-1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


class _Patcher:
    """setattr that is undone when the run ends."""

    def __init__(self):
        self.undo = []

    def __call__(self, obj, name, value):
        self.undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def restore(self):
        for obj, name, prev in reversed(self.undo):
            setattr(obj, name, prev)
        self.undo.clear()


class HFWorkspace:
    def __init__(self, root, binary):
        self.root = str(root)
        self.binary = binary
        self._ckpt = {}

    def checkpoint(self, model):
        if model not in self._ckpt:
            import torch

            kind, overrides = HF_MODELS[model]
            cfg_cls, model_cls = _classes(kind)
            cfg = cfg_cls(**{**TINY, **overrides})
            torch.manual_seed(0)
            mdl = model_cls(cfg)
            _init_weights(mdl, seed=sum(map(ord, model)))
            path = os.path.join(self.root, model)
            mdl.save_pretrained(path, safe_serialization=True)
            self._ckpt[model] = path
        return self._ckpt[model]

    def run(self, name, model, plant=None, position_offset=0):
        import torch
        import transformers
        from mla_bisect.hf import capture_layer

        ckpt = self.checkpoint(model)
        mdl = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        patch = _Patcher()
        try:
            if plant is not None:
                plant(_modeling(HF_MODELS[model][0]), mdl, patch)
            g = torch.Generator().manual_seed(7)
            ids = torch.randint(0, TINY["vocab_size"], (BATCH, TOKENS), generator=g)
            kw = {}
            if position_offset:
                kw["position_ids"] = torch.arange(position_offset, position_offset + TOKENS).repeat(BATCH, 1)
            cap_path = os.path.join(self.root, f"{name}.h5")
            with torch.no_grad(), capture_layer(mdl, LAYER, cap_path) as cap:
                mdl(ids, **kw)
            if not cap.captured:
                raise RuntimeError(f"{name}: layer {LAYER} never captured")
        finally:
            patch.restore()
        return replay(self.binary, cap_path, ckpt, os.path.join(self.root, f"{name}.json"))

    def run_fault(self, f):
        proc, data = self.run(f.name, f.model, f.plant, f.position_offset)
        verdict, got = score(f.stage, f.expected, proc.returncode, data)
        if proc.returncode not in (0, 1):
            got["error"] = (proc.stderr or proc.stdout)[-600:]
        return verdict, got


# ------------------------------------------------------------------------------------------------------- faults

@hf_fault("hf_scale_absorbed_head_dim", "https://github.com/ollama/ollama/pull/13893", "ollama",
          "hf_deepseek_v3", "attention_mha", {"attn.scale"})
def hf_scale_absorbed_head_dim(modeling, model, patch):
    """DeepseekV3Attention.scaling recomputed from the absorbed head dim kv_lora_rank + qk_rope_head_dim (YaRN's
    mscale^2 kept) where qk_nope_head_dim + qk_rope_head_dim belongs."""
    attn = model.model.layers[LAYER].self_attn
    patch(attn, "scaling", attn.scaling * math.sqrt(attn.qk_head_dim / (attn.kv_lora_rank + attn.qk_rope_head_dim)))


@hf_fault("hf_rope_positions_bf16", "https://github.com/huggingface/transformers/pull/29285", "transformers",
          "hf_deepseek_v3_neox", "rope", {"rope.positions_bf16"}, position_offset=301)
def hf_rope_positions_bf16(modeling, model, patch):
    """The rotary embedding's position_ids cast to bf16 before the frequencies (the autocast the thread describes),
    on a prompt placed at positions 301-312: odd positions round to even ones."""
    import torch

    rot = model.model.rotary_emb
    orig = rot.forward

    def forward(x, position_ids, *args, **kwargs):
        return orig(x, position_ids.to(torch.bfloat16).to(position_ids.dtype), *args, **kwargs)
    patch(rot, "forward", forward)


@hf_fault("hf_indexer_k_norm_identity", "https://github.com/ml-explore/mlx-lm/pull/512", "mlx-lm",
          "hf_glm_moe_dsa", "indexer_k", {"dsa.index_k_norm_skipped"})
def hf_indexer_k_norm_identity(modeling, model, patch):
    """GlmMoeDsa's indexer built with its k_norm LayerNorm as an identity (a port that dropped the key norm)."""
    import torch

    patch(model.model.layers[LAYER].self_attn.indexer, "k_norm", torch.nn.Identity())


@hf_fault("hf_rope_partial_rotary", "https://github.com/huggingface/transformers/pull/48652", "transformers",
          "hf_deepseek_v3_neox", "rope", None)
def hf_rope_partial_rotary(modeling, model, patch):
    """apply_rotary_pos_emb patched to rotate only the first half of the rope lanes (a partial_rotary_factor of 0.5
    the model does not have), with the cos/sin table's first R/4 frequencies. No class models it."""
    import torch

    orig = modeling.apply_rotary_pos_emb

    def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        half = q.shape[-1] // 2
        c = torch.cat([cos[..., : half // 2], cos[..., : half // 2]], dim=-1)
        s = torch.cat([sin[..., : half // 2], sin[..., : half // 2]], dim=-1)
        qr, kr = orig(q[..., :half], k[..., :half], c, s, unsqueeze_dim=unsqueeze_dim)
        return torch.cat([qr, q[..., half:]], dim=-1), torch.cat([kr, k[..., half:]], dim=-1)
    patch(modeling, "apply_rotary_pos_emb", apply_rotary_pos_emb)


def by_name():
    return {f.name: f for f in HF_FAULTS}
