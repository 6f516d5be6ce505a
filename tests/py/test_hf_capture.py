"""End to end: tiny HF transformers MLA models (random weights saved as a safetensors checkpoint) captured with
mla_bisect.hf.capture_layer and replayed by `mla-bisect replay`; a clean model replays clean, and bugs planted
in the HF modeling code are found at the probe where they enter."""
import functools
import inspect
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mla_bisect.hf import capture_layer  # noqa: E402

BINARY = os.environ.get("MLA_BINARY", "mla-bisect")
LAYER = 1           # the captured layer: its input h is the output of layer 0
TOKENS = 12         # per sequence
BATCH = 2

# Small dims, every field a real config has; P != V so a swapped kv_b split cannot go unnoticed by shape.
TINY = dict(vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4,
            num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=12,
            qk_nope_head_dim=16, first_k_dense_replace=1, max_position_embeddings=256, n_group=1, topk_group=1)


def yarn(factor, mscale, mscale_all_dim, theta=10000.0, beta_fast=32.0, beta_slow=1.0):
    """A YaRN config (rope_parameters, and max_position_embeddings = factor x the original, as real ones have)."""
    return {"rope_parameters": {"rope_type": "yarn", "rope_theta": theta, "factor": factor,
                                "original_max_position_embeddings": 64, "beta_fast": beta_fast,
                                "beta_slow": beta_slow, "mscale": mscale, "mscale_all_dim": mscale_all_dim},
            "max_position_embeddings": int(64 * factor)}


def model_classes(kind):
    t = transformers
    return {
        "deepseek_v2": (t.DeepseekV2Config, t.DeepseekV2ForCausalLM),
        "deepseek_v3": (t.DeepseekV3Config, t.DeepseekV3ForCausalLM),
        "glm4_moe_lite": (getattr(t, "Glm4MoeLiteConfig", None), getattr(t, "Glm4MoeLiteForCausalLM", None)),
        "glm_moe_dsa": (getattr(t, "GlmMoeDsaConfig", None), getattr(t, "GlmMoeDsaForCausalLM", None)),
        "deepseek_v32": (getattr(t, "DeepseekV32Config", None), getattr(t, "DeepseekV32ForCausalLM", None)),
    }[kind]


# name -> (HF class family, config overrides). Kimi-K2 checkpoints run on DeepSeek-V3's code: its rope.
MODELS = {
    "deepseek_v2_lite": ("deepseek_v2", dict(q_lora_rank=None, **yarn(40, 0.707, 0.707))),
    "deepseek_v3": ("deepseek_v3", dict(**yarn(40, 1.0, 1.0))),
    "deepseek_v3_neox": ("deepseek_v3", dict(rope_interleave=False)),
    "kimi_k2": ("deepseek_v3", dict(**yarn(32, 1.0, 1.0, theta=50000.0, beta_fast=1.0))),
    "glm4_moe_lite": ("glm4_moe_lite", dict()),
    # DSA: 8 keys a token of 12, so the last four tokens of each sequence attend sparsely and the replay checks HF's
    # whole sparse attention. 8 indexer heads: with 2, many keys score exactly 0 (every head's ReLU zero) and tie, and
    # torch.topk breaks such ties differently from the reference's lower index (docs/mla.md).
    "glm_moe_dsa": ("glm_moe_dsa", dict(index_topk=8, index_head_dim=16, index_n_heads=8, n_group=1)),
    # DeepSeek-V3.2: the same indexer with half-split rope pairs on its lanes (GLM's are interleaved).
    "deepseek_v32": ("deepseek_v32", dict(index_topk=8, index_head_dim=16, index_n_heads=8, **yarn(40, 1.0, 1.0))),
}


def _init_weights(model, seed):
    """Weights that make attention sharp enough to see a bug: projections ~ N(0, 1/fan_in) (HF's 0.02 leaves
    every logit near zero), norm gains near 1, embeddings N(0, 1). bf16-exact, so the fp32 and bf16 runs share
    one checkpoint."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[-1]
                scale = 1.0 if "embed" in name else 1.5 / fan_in ** 0.5
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


@functools.lru_cache(maxsize=None)
def _checkpoint_dir(name, root):
    kind, overrides = MODELS[name]
    cfg_cls, model_cls = model_classes(kind)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {kind}")
    cfg = cfg_cls(**{**TINY, **overrides})
    torch.manual_seed(0)
    model = model_cls(cfg)
    _init_weights(model, seed=sum(map(ord, name)))
    path = os.path.join(root, name)
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf_ckpt"))


def load(path, dtype):
    cls = transformers.AutoModelForCausalLM
    model = cls.from_pretrained(path, dtype=dtype)
    return model.eval()


def input_ids():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, TINY["vocab_size"], (BATCH, TOKENS), generator=g)


def capture(model, path, **kw):
    with torch.no_grad(), capture_layer(model, LAYER, path, **kw) as cap:
        model(input_ids())
    assert cap.captured, "the layer never ran"
    return cap


def replay(capture_path, ckpt, tmp_path):
    report = tmp_path / "replay.json"
    proc = subprocess.run([BINARY, "replay", str(capture_path), "--weights", ckpt, "--json", str(report), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    data = json.loads(report.read_text()) if report.exists() else None
    return proc, data


def describe(proc):
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_clean_model_replays_clean(name, dtype, root, tmp_path):
    ckpt = _checkpoint_dir(name, root)
    model = load(ckpt, torch.float32 if dtype == "fp32" else torch.bfloat16)
    cap = capture(model, tmp_path / "capture.h5")
    # Every probe of the prefill MHA graph but the softmax lse (HF's attention functions do not return it) and DSA's
    # idx_scores (a local of HF's indexer forward).
    expected = {"h", "x", "q_nope", "q_pe", "kv_c", "k_pe", "kv_c_norm", "q_pe_rope", "k_pe_rope", "kv_cache",
                "k_nope", "v", "attn_out", "o_partial", "o", "h_out"}
    if MODELS[name][1].get("q_lora_rank", 48) is not None:
        expected |= {"q_a", "q_c"}
    if "index_topk" in MODELS[name][1]:
        expected |= {"idx_q", "idx_k", "idx_weights", "topk"}
    assert set(cap.probes) == expected
    proc, data = replay(tmp_path / "capture.h5", ckpt, tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert data is not None and not data.get("first_divergence"), json.dumps(data)[:2000]


def capture_step(model, path, new):
    """Prefills input_ids() (BATCH sequences of TOKENS) with a cache, then captures the next forward (step=1): `new`
    tokens per sequence. Returns the capture handle and the dump read back."""
    from mla_bisect.dump import read_dump

    with torch.no_grad(), capture_layer(model, LAYER, path, step=1) as cap:
        out = model(input_ids(), use_cache=True)
        # transformers 5 renamed past_key_values to cache
        name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
        model(torch.arange(new).repeat(BATCH, 1), use_cache=True, **{name: out.past_key_values})
    assert cap.captured
    d = read_dump(str(path))
    assert d.attrs["mode"] == ("decode" if new == 1 else "chunked")
    assert list(d.inputs.context_lens) == [TOKENS] * BATCH
    assert list(d.inputs.positions) == list(range(TOKENS, TOKENS + new)) * BATCH
    return cap, d


@pytest.mark.parametrize("dtype,new", [("fp32", 1), ("bf16", 3)])
def test_step_after_prefill_replays_clean(dtype, new, root, tmp_path):
    """step=1 captures the forward after the prefill: the context comes from HF's DynamicCache (decode for one
    new token per sequence, chunked for several)."""
    ckpt = _checkpoint_dir("deepseek_v3", root)
    model = load(ckpt, torch.float32 if dtype == "fp32" else torch.bfloat16)
    path = tmp_path / "capture.h5"
    capture_step(model, path, new)
    proc, data = replay(path, ckpt, tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert data is not None and not data.get("first_divergence"), json.dumps(data)[:2000]


# deepseek_v32 in bf16 is left out: on this input HF's bf16 rounding, sharpened by YaRN's softmax scale over 8 keys,
# puts attn_out at 1.03x its calibrated tolerance (the reference's attention on HF's own operands agrees with HF).
@pytest.mark.parametrize("new", [1, 3])
@pytest.mark.parametrize("name,dtype", [("glm_moe_dsa", "fp32"), ("glm_moe_dsa", "bf16"), ("deepseek_v32", "fp32")])
def test_dsa_step_after_prefill_replays_clean(name, dtype, new, root, tmp_path):
    """A DSA step after the prefill: the indexer's keys of the 12 cached tokens come from HF's indexer key cache as
    the dump's index_cache, and each new token selects index_topk (8) of its 13 or more keys, so the replay checks
    the selection over the context and the sparse attention of a decode (one new token) and a chunked step (3)."""
    ckpt = _checkpoint_dir(name, root)
    model = load(ckpt, torch.float32 if dtype == "fp32" else torch.bfloat16)
    path = tmp_path / "capture.h5"
    cap, d = capture_step(model, path, new)
    assert d.inputs.index_cache is not None
    assert d.inputs.index_cache.shape[-1] == MODELS[name][1]["index_head_dim"]
    assert {"idx_q", "idx_k", "idx_weights", "topk"} <= set(cap.probes)
    proc, data = replay(path, ckpt, tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert data is not None and not data.get("first_divergence"), json.dumps(data)[:2000]


# Each bug, planted in the HF modeling code or the loaded model (never in the checkpoint), and the probe where
# replay must first see it:
#   rope_pairs      the rope rotates pairs (i, i+R/2) of interleaved weights, whose pairs are (2i, 2i+1):
#                   q_pe and k_pe are right, the rope stage's first output q_pe_rope is not.
#   scale_mscale    the softmax scale is 1/sqrt(D) without YaRN's mscale^2: every operand of the attention is
#                   right, its output attn_out is not (lse, where the scale shows first, is not captured).
#   kv_b_split      k_nope and v taken from kv_b_proj's output as [V | P] instead of [P | V]: the capture
#                   records them as the attention consumes them, so kv_b_proj's first output k_nope is off.
#   head_copy       q_b_proj's rows of head 2 loaded from head 1: q_nope, q_b_proj's first output, is off
#                   (in head 2 only).
#   mask_shift      the causal mask lets each token see the next one: the attention's operands are right,
#                   attn_out is not.
BUGS = {
    "rope_pairs": "q_pe_rope",
    "scale_mscale": "attn_out",
    "kv_b_split": "k_nope",
    "head_copy": "q_nope",
    "mask_shift": "attn_out",
}


def plant(bug, modeling, monkeypatch):
    """Patches that take effect before the model is built (the scale is computed in __init__)."""
    if bug == "rope_pairs":
        def rope_pairs(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            return modeling.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        monkeypatch.setattr(modeling, "apply_rotary_pos_emb_interleave", rope_pairs)
    elif bug == "scale_mscale":
        monkeypatch.setattr(modeling, "yarn_apply_mscale", lambda rope_parameters, scaling: scaling)
    elif bug == "kv_b_split":
        def expand_kv(self, kv_nope, k_rot):
            b, _, s, _ = kv_nope.shape
            kv = self.kv_b_proj(kv_nope).view(b, s, -1, self.qk_nope_head_dim + self.v_head_dim).transpose(1, 2)
            value, k_nope = torch.split(kv, [self.v_head_dim, self.qk_nope_head_dim], dim=-1)
            k_rot = k_rot.expand(-1, k_nope.shape[1], -1, -1)
            return torch.cat((k_nope, k_rot), dim=-1), value
        monkeypatch.setattr(modeling.DeepseekV3Attention, "expand_kv", expand_kv)
    elif bug == "mask_shift":
        original = modeling.create_causal_mask

        def next_token_visible(batch_idx, head_idx, q_idx, kv_idx):
            return kv_idx == q_idx + 1

        def create_causal_mask(*args, **kwargs):
            kwargs["or_mask_function"] = next_token_visible
            return original(*args, **kwargs)
        monkeypatch.setattr(modeling, "create_causal_mask", create_causal_mask)


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bug_found_at_its_probe(bug, root, tmp_path, monkeypatch):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

    ckpt = _checkpoint_dir("deepseek_v3", root)
    plant(bug, modeling, monkeypatch)
    model = load(ckpt, torch.float32)
    if bug == "head_copy":
        attn = model.model.layers[LAYER].self_attn
        d = attn.qk_head_dim
        with torch.no_grad():
            attn.q_b_proj.weight[2 * d:3 * d] = attn.q_b_proj.weight[1 * d:2 * d]
    capture(model, tmp_path / "capture.h5")
    proc, data = replay(tmp_path / "capture.h5", ckpt, tmp_path)
    assert proc.returncode == 1, describe(proc)
    first = (data or {}).get("first_divergence") or {}
    assert first.get("probe") == BUGS[bug], json.dumps(data)[:3000]


# Bugs planted in GLM-5's indexer (glm_moe_dsa), and the probe where replay must first see each:
#   idx_rope_pairs   the indexer's rope rotates pairs (i, i+R/2) (DeepSeek-V3.2's) of GLM's interleaved lanes,
#                    whose pairs are (2i, 2i+1); the attention's own rope is right: idx_q, the first indexer probe.
#   idx_weights_head weights_proj's row of indexer head 1 loaded from head 0: idx_q and idx_k are right,
#                    idx_weights is not.
#   idx_no_relu      the scores sum the heads' dot products without their ReLU: idx_q, idx_k and idx_weights are
#                    right, the keys selected (topk) are not.
DSA_BUGS = {
    "idx_rope_pairs": "idx_q",
    "idx_weights_head": "idx_weights",
    "idx_no_relu": "topk",
}


def plant_dsa(bug, modeling, monkeypatch):
    if bug == "idx_rope_pairs":
        from transformers.models.deepseek_v3 import modeling_deepseek_v3

        interleave = modeling.apply_rotary_pos_emb_interleave

        def rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            if unsqueeze_dim == 2:  # the indexer's call ([B, S, heads, R])
                return modeling.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
            return interleave(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        # A half-split rope in the module, called through its name as a modeling file calls its functions.
        monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling_deepseek_v3.apply_rotary_pos_emb,
                            raising=False)
        monkeypatch.setattr(modeling, "apply_rotary_pos_emb_interleave", rope)
    elif bug == "idx_no_relu":
        class NoRelu:
            relu = staticmethod(lambda x: x)

            def __getattr__(self, name):
                return getattr(torch.nn.functional, name)
        monkeypatch.setattr(modeling, "F", NoRelu())


@pytest.mark.parametrize("bug", list(DSA_BUGS))
def test_planted_dsa_bug_found_at_its_probe(bug, root, tmp_path, monkeypatch):
    modeling = pytest.importorskip("transformers.models.glm_moe_dsa.modeling_glm_moe_dsa")
    ckpt = _checkpoint_dir("glm_moe_dsa", root)
    plant_dsa(bug, modeling, monkeypatch)
    model = load(ckpt, torch.float32)
    if bug == "idx_weights_head":
        with torch.no_grad():
            w = model.model.layers[LAYER].self_attn.indexer.weights_proj.weight
            w[1] = w[0]
    capture(model, tmp_path / "capture.h5")
    proc, data = replay(tmp_path / "capture.h5", ckpt, tmp_path)
    assert proc.returncode == 1, describe(proc)
    first = (data or {}).get("first_divergence") or {}
    assert first.get("probe") == DSA_BUGS[bug], json.dumps(data)[:3000]


def test_capture_leaves_the_model_as_it_was(root, tmp_path):
    """Hooks and patched functions are gone after the block: the same forward gives the same logits."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

    ckpt = _checkpoint_dir("deepseek_v3", root)
    model = load(ckpt, torch.float32)
    rope = modeling.apply_rotary_pos_emb_interleave
    with torch.no_grad():
        before = model(input_ids()).logits
        capture(model, tmp_path / "capture.h5")
        after = model(input_ids()).logits
    assert torch.equal(before, after)
    assert modeling.apply_rotary_pos_emb_interleave is rope
    assert not model.model.layers[LAYER].self_attn._forward_hooks


def test_recorder_per_rank_files_replay(root, tmp_path):
    """The Recorder as a tensor-parallel engine uses it: two processes' worth of rank files (each rank's heads of
    an HF capture, process_rank=r), read back by replay as one capture."""
    from mla_bisect.capture import Recorder
    from mla_bisect.dump import read_dump

    ckpt = _checkpoint_dir("deepseek_v3", root)
    capture(load(ckpt, torch.float32), tmp_path / "whole.h5")
    d = read_dump(str(tmp_path / "whole.h5"))
    tp = 2
    for r in range(tp):
        with Recorder(tmp_path / "split.h5", ckpt, tp=tp, process_rank=r, launch_id="split-test", engine="split",
                      engine_dtype="fp32", layer_index=LAYER) as rec:
            rec.inputs(h=d.inputs.x, positions=d.inputs.positions, seq_lens=d.inputs.seq_lens)
            for (_, name), p in d.probes.items():
                data = p.ranks[0].data
                if p.contract == "heads":
                    n = data.shape[1] // tp
                    rec.probe(name, data[:, r * n:(r + 1) * n], rank=r)
                elif p.contract == "replicated":
                    rec.probe(name, data, rank=r)
                # o_partial (each rank's partial sum) is left out: a capture may hold any subset
    assert sorted(os.listdir(tmp_path)) == ["split.rank0.h5", "split.rank1.h5", "whole.h5"]
    proc, data = replay(tmp_path / "split.h5", ckpt, tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert data is not None and not data.get("first_divergence"), json.dumps(data)[:2000]


def test_unknown_layer_is_refused(root, tmp_path):
    model = load(_checkpoint_dir("deepseek_v3", root), torch.float32)
    with pytest.raises(ValueError, match="layer_idx 7"):
        with capture_layer(model, 7, tmp_path / "c.h5"):
            pass


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
