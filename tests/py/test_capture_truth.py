"""Captures replayed true to the system that ran them: the captured layer (HF, the Recorder, `mla-bisect run
--layer-range`), the checkpoint's config (DSA, rope, dims), padded batches, positions that do not start at 0, the
DSA selection as the candidate made it, checked inputs, the writing's speed, one semantics for omitted probes,
and fp8 latent caches. HF models from random configs, saved as safetensors checkpoints."""
import functools
import json
import os
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mla_bisect.capture import Recorder  # noqa: E402
from mla_bisect.dump import read_dump  # noqa: E402
from mla_bisect.hf import capture_layer  # noqa: E402

BINARY = os.environ.get("MLA_BINARY", "mla-bisect")
VOCAB = 64
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4,
            num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=12,
            qk_nope_head_dim=16, first_k_dense_replace=1, max_position_embeddings=4096, n_group=1, topk_group=1)
DSA = dict(index_topk=8, index_head_dim=16, index_n_heads=8)


def _classes(kind):
    t = transformers
    return {
        "deepseek_v3": (t.DeepseekV3Config, t.DeepseekV3ForCausalLM),
        "glm_moe_dsa": (getattr(t, "GlmMoeDsaConfig", None), getattr(t, "GlmMoeDsaForCausalLM", None)),
    }[kind]


def _init_weights(model, seed):
    """Projections ~ N(0, 1/fan_in) x 1.5, norm gains near 1, embeddings N(0, 1); bf16-exact."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                scale = 1.0 if "embed" in name else 1.5 / p.shape[-1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


@functools.lru_cache(maxsize=None)
def _checkpoint(kind, root, overrides=()):
    cfg_cls, model_cls = _classes(kind)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {kind}")
    cfg = cfg_cls(**{**TINY, **(DSA if kind == "glm_moe_dsa" else {}), **dict(overrides)})
    torch.manual_seed(0)
    model = model_cls(cfg)
    _init_weights(model, seed=11)
    path = os.path.join(root, kind + "".join(f"-{k}{v}" for k, v in overrides))
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ckpt"))


def load(path, dtype=torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def ids(batch=2, tokens=12, seed=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, tokens), generator=g)


def replay(capture_path, ckpt, tmp_path, *extra):
    report = tmp_path / "replay.json"
    if report.exists():
        report.unlink()
    proc = subprocess.run([BINARY, "replay", str(capture_path), "--weights", str(ckpt), "--json", str(report),
                           "--quiet", *extra], capture_output=True, text=True, timeout=300)
    data = json.loads(report.read_text()) if report.exists() else None
    return proc, data


def describe(proc, data=None):
    return (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-3000:]}" +
            (f"\njson:\n{json.dumps(data)[:2000]}" if data else ""))


def assert_clean(proc, data):
    assert proc.returncode == 0, describe(proc, data)
    assert data is not None and not data.get("first_divergence"), describe(proc, data)


def hf_capture(model, layer, path, inputs=None, **kw):
    with torch.no_grad(), capture_layer(model, layer, path, **kw) as cap:
        model(inputs if inputs is not None else ids())
    assert cap.captured, "the layer never ran"
    return cap


def copy_through_recorder(src, dst, ckpt, layer_index):
    """An HF capture written again through the Recorder, as another framework would write it."""
    d = read_dump(str(src))
    with Recorder(dst, ckpt, engine="recorder", engine_dtype=d.attrs["engine_dtype"], layer_index=layer_index) as rec:
        rec.inputs(h=d.inputs.x, positions=d.inputs.positions, seq_lens=d.inputs.seq_lens)
        for (_, name), p in d.probes.items():
            rec.probe(name, p.ranks[0].data)


# --- 1. the captured layer ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("layer", [0, 1, 3])
def test_each_layer_replays_against_its_own_weights(layer, root, tmp_path):
    ckpt = _checkpoint("deepseek_v3", root)
    model = load(ckpt)
    hf_capture(model, layer, tmp_path / "hf.h5")
    assert_clean(*replay(tmp_path / "hf.h5", ckpt, tmp_path))
    copy_through_recorder(tmp_path / "hf.h5", tmp_path / "rec.h5", ckpt, layer)
    assert_clean(*replay(tmp_path / "rec.h5", ckpt, tmp_path))
    # mla-bisect's own run of that checkpoint layer, replayed: its weights and probes are layer `layer`'s.
    run = subprocess.run([BINARY, "run", "--weights", ckpt, "--layer-range", f"{layer}:{layer + 1}", "--tokens", "8",
                          "--out", str(tmp_path / "run.h5"), "--quiet"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, describe(run)
    proc, data = replay(tmp_path / "run.h5", ckpt, tmp_path)
    assert_clean(proc, data)
    assert "WEIGHT DIFFERS" not in proc.stdout


def test_recorder_capture_of_another_layer_is_checked_against_that_layer(root, tmp_path):
    """A layer-1 capture labelled layer 3 is replayed against layer 3's weights: it differs there."""
    ckpt = _checkpoint("deepseek_v3", root)
    hf_capture(load(ckpt), 1, tmp_path / "hf.h5")
    copy_through_recorder(tmp_path / "hf.h5", tmp_path / "rec.h5", ckpt, 3)
    proc, data = replay(tmp_path / "rec.h5", ckpt, tmp_path)
    assert proc.returncode == 1, describe(proc, data)


# --- 2. the checkpoint's config against the capture's ------------------------------------------------------------

def _edited_checkpoint(ckpt, dst, edit):
    shutil.copytree(ckpt, dst)
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    edit(cfg)
    with open(path, "w") as f:
        json.dump(cfg, f)
    return str(dst)


@pytest.mark.parametrize("edit,field", [
    (lambda c: c.pop("index_topk"), "index_topk"),                     # HF's default then: 2048
    (lambda c: c.update(index_topk=0), "index_topk"),                  # DSA with no keys is no config
    (lambda c: c.update(index_n_heads=4), "index_n_heads"),
    (lambda c: c["rope_parameters"].update(rope_theta=20000.0), "rope_theta"),
    (lambda c: c.update(rms_norm_eps=1e-4), "rms_norm_eps"),
    (lambda c: c.update(indexer_types=["full", "shared", "full", "full"]), "indexer_types"),
])
def test_dsa_checkpoint_config_disagreeing_with_the_capture_is_refused(edit, field, root, tmp_path):
    ckpt = _checkpoint("glm_moe_dsa", root)
    hf_capture(load(ckpt), 1, tmp_path / "cap.h5")
    other = _edited_checkpoint(ckpt, tmp_path / "ckpt", edit)
    proc, _ = replay(tmp_path / "cap.h5", other, tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert field in proc.stderr, describe(proc)


def test_dsa_config_without_index_topk_reads_as_hf_default(tmp_path):
    """`inspect` of a GLM-5 config.json without index_topk: DSA with HF's 2048 keys, not dense attention."""
    cfg = dict(TINY, model_type="glm_moe_dsa", index_head_dim=16, index_n_heads=8)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from mla_bisect.graph import parse_hf_config
    assert parse_hf_config(cfg).index_topk == 2048
    proc = subprocess.run([BINARY, "run", "--model", str(tmp_path / "config.json"), "--tokens", "4", "--layers", "1",
                           "--quiet", "--out", str(tmp_path / "r.h5")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, describe(proc)
    assert json.loads(json.dumps(read_dump(str(tmp_path / "r.h5")).model))["index_topk"] == 2048
    cfg["index_topk"] = 0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    proc = subprocess.run([BINARY, "run", "--model", str(tmp_path / "config.json"), "--tokens", "4", "--quiet"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "index_topk" in proc.stderr, describe(proc)
    with pytest.raises(ValueError, match="index_topk"):
        parse_hf_config(cfg)


def test_captured_probes_outside_the_reference_graph_are_listed(root, tmp_path):
    """Every captured probe is compared or listed with its reason: a dense model's capture carrying an indexer probe
    (a Recorder writing against a DSA config, replayed on the dense checkpoint of the same dims)."""
    ckpt = _checkpoint("deepseek_v3", root)
    hf_capture(load(ckpt), 1, tmp_path / "hf.h5")
    proc, data = replay(tmp_path / "hf.h5", ckpt, tmp_path)
    assert_clean(proc, data)
    notes = " ".join(data["compare"].get("notes", []))
    assert "not captured" in notes and "lse" in notes, notes


# --- 5. positions that do not start at 0; a capture never breaks the forward --------------------------------------

def test_prefill_at_position_1000_replays_clean(root, tmp_path):
    ckpt = _checkpoint("deepseek_v3", root)
    model = load(ckpt)
    x = ids()
    pos = torch.arange(1000, 1000 + x.shape[1]).repeat(x.shape[0], 1)
    with torch.no_grad(), capture_layer(model, 1, tmp_path / "cap.h5") as cap:
        model(x, position_ids=pos)
    assert cap.captured and cap.error is None, cap.error
    assert list(read_dump(str(tmp_path / "cap.h5")).inputs.positions[:3]) == [1000, 1001, 1002]
    assert_clean(*replay(tmp_path / "cap.h5", ckpt, tmp_path))


def test_capture_failure_never_breaks_the_forward(root, tmp_path, monkeypatch):
    """What the capture cannot record is warned about and written as the reason; the model's output is unchanged."""
    import mla_bisect.hashing as hashing

    ckpt = _checkpoint("deepseek_v3", root)
    model = load(ckpt)
    with torch.no_grad():
        want = model(ids()).logits

    def broken(*a, **k):
        raise RuntimeError("the record cannot be computed")
    monkeypatch.setattr(hashing, "compute_record", broken)
    with warnings.catch_warnings(record=True) as seen, torch.no_grad():
        warnings.simplefilter("always")
        with capture_layer(model, 1, tmp_path / "cap.h5") as cap:
            got = model(ids()).logits
    assert torch.equal(got, want)
    assert not cap.captured and "cannot be computed" in cap.error
    assert any("not recorded" in str(w.message) for w in seen), [str(w.message) for w in seen]
    monkeypatch.undo()
    d = read_dump(str(tmp_path / "cap.h5"))
    assert d.status.startswith("stopped") and "cannot be computed" in d.status, d.status


# --- 4. padded batches ---------------------------------------------------------------------------------------------

def _padded(side, batch=2, tokens=12, pad=(0, 5)):
    x = ids(batch, tokens)
    mask = torch.ones(batch, tokens, dtype=torch.long)
    for b, n in enumerate(pad):
        if n:
            if side == "left":
                mask[b, :n] = 0
            else:
                mask[b, tokens - n:] = 0
            x[b][mask[b] == 0] = 0
    return x, mask


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", ["deepseek_v3", "glm_moe_dsa"])
def test_padded_batch_replays_clean(side, kind, root, tmp_path):
    ckpt = _checkpoint(kind, root)
    model = load(ckpt)
    x, mask = _padded(side)
    with torch.no_grad(), capture_layer(model, 1, tmp_path / "cap.h5") as cap:
        model(x, attention_mask=mask)
    assert cap.captured, cap.error
    d = read_dump(str(tmp_path / "cap.h5"))
    assert list(d.inputs.seq_lens) == [12, 7]
    assert_clean(*replay(tmp_path / "cap.h5", ckpt, tmp_path))


def test_padded_batch_whose_mask_is_ignored_is_caught(root, tmp_path, monkeypatch):
    """The model attends to the padding (its attention_mask dropped before the causal mask is made): a real bug."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

    ckpt = _checkpoint("deepseek_v3", root)
    original = modeling.create_causal_mask

    def mask_ignored(*args, **kwargs):
        kwargs["attention_mask"] = None
        return original(*args, **kwargs)
    monkeypatch.setattr(modeling, "create_causal_mask", mask_ignored)
    model = load(ckpt)
    x, mask = _padded("left")
    with torch.no_grad(), capture_layer(model, 1, tmp_path / "cap.h5"):
        model(x, attention_mask=mask)
    proc, data = replay(tmp_path / "cap.h5", ckpt, tmp_path)
    assert proc.returncode == 1, describe(proc, data)
    assert data["first_divergence"]["probe"] == "attn_out", describe(proc, data)


def test_padded_decode_step_replays_clean(root, tmp_path):
    """A left-padded prefill then one decode step: the cache holds the real context rows only."""
    import inspect

    ckpt = _checkpoint("deepseek_v3", root)
    model = load(ckpt)
    x, mask = _padded("left")
    name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    with torch.no_grad(), capture_layer(model, 1, tmp_path / "cap.h5", step=1) as cap:
        out = model(x, attention_mask=mask, use_cache=True)
        step_mask = torch.cat((mask, torch.ones(2, 1, dtype=torch.long)), dim=1)
        pos = (step_mask.cumsum(1) - 1)[:, -1:]
        model(torch.tensor([[3], [4]]), attention_mask=step_mask, position_ids=pos, use_cache=True,
              **{name: out.past_key_values})
    assert cap.captured, cap.error
    d = read_dump(str(tmp_path / "cap.h5"))
    assert list(d.inputs.context_lens) == [12, 7]
    assert_clean(*replay(tmp_path / "cap.h5", ckpt, tmp_path))


# --- 3. DSA: what the candidate selected -------------------------------------------------------------------------

def test_indexer_that_selects_future_keys_is_recorded_as_it_selected(root, tmp_path, monkeypatch):
    """An indexer whose scores ignore the causal mask selects keys past the query: the capture keeps them, and
    replay finds the selection wrong at topk."""
    modeling = pytest.importorskip("transformers.models.glm_moe_dsa.modeling_glm_moe_dsa")
    ckpt = _checkpoint("glm_moe_dsa", root)
    forward = modeling.GlmMoeDsaIndexer.forward

    def leaky(self, hidden_states, q_resid, position_embeddings, attention_mask, *args, **kwargs):
        return forward(self, hidden_states, q_resid, position_embeddings, torch.zeros_like(attention_mask), *args,
                       **kwargs)
    monkeypatch.setattr(modeling.GlmMoeDsaIndexer, "forward", leaky)
    hf_capture(load(ckpt), 1, tmp_path / "cap.h5")
    d = read_dump(str(tmp_path / "cap.h5"))
    topk = d.probes[(0, "topk")].ranks[0].data
    S = 12
    future = [(t, int(k)) for t in range(topk.shape[0]) for k in topk[t] if k > t % S]
    assert future, "the capture dropped the keys past each query that the indexer selected"
    proc, data = replay(tmp_path / "cap.h5", ckpt, tmp_path)
    assert proc.returncode == 1, describe(proc, data)
    assert data["first_divergence"]["probe"] == "topk", describe(proc, data)


# --- 6. inputs checked ---------------------------------------------------------------------------------------------

def test_decode_at_the_wrong_position_is_warned(root, tmp_path):
    """One decode step rotated at context + 1: replay says the positions and the cache disagree."""
    import inspect

    ckpt = _checkpoint("deepseek_v3", root)
    model = load(ckpt)
    name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    with torch.no_grad(), capture_layer(model, 1, tmp_path / "cap.h5", step=1) as cap:
        out = model(ids(), use_cache=True)
        model(torch.tensor([[3], [4]]), position_ids=torch.full((2, 1), 13), use_cache=True,
              **{name: out.past_key_values})
    assert cap.captured, cap.error
    proc, data = replay(tmp_path / "cap.h5", ckpt, tmp_path)
    assert "start at 13 but its cache holds 12 tokens" in proc.stderr, describe(proc, data)


@pytest.mark.parametrize("as_torch_bf16", [True, False])
def test_bf16_tensors_labelled_fp32_are_calibrated_at_bf16(as_torch_bf16, root, tmp_path):
    """A Recorder told engine_dtype="fp32" given a bf16 model's tensors (as bf16, or upcast to fp32)."""
    ckpt = _checkpoint("deepseek_v3", root)
    hf_capture(load(ckpt, torch.bfloat16), 1, tmp_path / "hf.h5")
    d = read_dump(str(tmp_path / "hf.h5"))
    with Recorder(tmp_path / "rec.h5", ckpt, engine="recorder", engine_dtype="fp32", layer_index=1) as rec:
        rec.inputs(h=d.inputs.x, positions=d.inputs.positions, seq_lens=d.inputs.seq_lens)
        for (_, name), p in d.probes.items():
            t = torch.from_numpy(p.ranks[0].data)
            rec.probe(name, t.to(torch.bfloat16) if as_torch_bf16 else t)
    proc, data = replay(tmp_path / "rec.h5", ckpt, tmp_path)
    assert_clean(proc, data)
    assert "calibrated at bf16" in proc.stderr, describe(proc, data)


def test_nan_in_the_captured_input_is_named_as_the_input(root, tmp_path):
    ckpt = _checkpoint("deepseek_v3", root)
    hf_capture(load(ckpt), 1, tmp_path / "hf.h5")
    d = read_dump(str(tmp_path / "hf.h5"))
    h = d.inputs.x.copy()
    h[5, 3] = np.nan
    with Recorder(tmp_path / "rec.h5", ckpt, engine="recorder", engine_dtype="fp32", layer_index=1) as rec:
        rec.inputs(h=h, positions=d.inputs.positions, seq_lens=d.inputs.seq_lens)
        for (_, name), p in d.probes.items():
            rec.probe(name, h if name == "h" else p.ranks[0].data)
    proc, data = replay(tmp_path / "rec.h5", ckpt, tmp_path)
    assert "captured input h holds 1 NaN/Inf value (first at token row 5)" in proc.stderr, describe(proc, data)
    if data.get("first_divergence"):
        assert "captured input h" in json.dumps(data.get("diagnosis")), describe(proc, data)


# --- 8. one semantics for what a capture omits; no warning about derived fields -----------------------------------

def test_clean_replay_has_no_derived_field_warning(root, tmp_path):
    ckpt = _checkpoint("deepseek_v3", root)
    hf_capture(load(ckpt), 1, tmp_path / "cap.h5")
    proc, data = replay(tmp_path / "cap.h5", ckpt, tmp_path)
    assert_clean(proc, data)
    assert "qk_head_dim" not in proc.stderr, describe(proc, data)


# --- 9. the capture's writing against the forward's time ----------------------------------------------------------

def test_records_have_the_same_bits_as_the_element_by_element_sums():
    """The vectorized record (blocked sequential sums, the checksum as a uint64 matrix-vector product) against a
    plain element-by-element computation of the C++ definitions."""
    from mla_bisect import hashing

    rng = np.random.default_rng(3)
    T, heads, X = 5, 3, 7
    a = (rng.standard_normal((T, heads * X)) * 10.0 ** rng.integers(-6, 6, (T, heads * X))).astype(np.float32)
    a[2, 4] = np.nan
    saved = hashing._ROW_CHUNK_ELEMS
    try:
        hashing._ROW_CHUNK_ELEMS = 2 * heads * X  # several blocks, so the carried running sums are exercised
        rec = hashing.compute_record(a, "fp32", T, heads, 0, 1, "stats")
    finally:
        hashing._ROW_CHUNK_ELEMS = saved
    s = sq = 0.0
    for v in a.reshape(-1).astype(np.float64):
        if np.isfinite(v):
            s += v
            sq += v * v
    assert rec["l2"] == float(np.sqrt(sq)) and rec["mean"] == s / (a.size - 1)
    for t in range(T):
        acc = 0.0
        for v in a[t].astype(np.float64):
            acc += v * v
        assert rec["token_l2"][t] == np.float32(np.sqrt(acc)) or np.isnan(acc)
    bits = a.view(np.uint32).astype(object)
    total = 0
    for r in range(T):
        h = int(hashing.splitmix64(np.uint64(r))) | 1
        for c in range(a.shape[1]):
            m = (h * pow(int(hashing.CHECKSUM_BASE), c >> 3, 1 << 64) + int(hashing.CHECKSUM_STEP) * (c & 7))
            total = (total + m * (2 * int(bits[r, c]) + 1)) % (1 << 64)
    assert rec["checksum"] == total


# --- sequences of different lengths and contexts -------------------------------------------------------------------

def _cache_arg(model):
    import inspect

    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def _step_capture(model, layer, path, context, new, seed):
    """One sequence: a prefill of `context` tokens, then a step of `new` tokens, the step captured."""
    x = ids(1, context + new, seed)
    with torch.no_grad(), capture_layer(model, layer, path, step=1) as cap:
        out = model(x[:, :context], use_cache=True)
        model(x[:, context:], use_cache=True, **{_cache_arg(model): out.past_key_values})
    assert cap.captured, cap.error
    return read_dump(str(path))


def _merge_sequences(parts, dst, ckpt, layer_index):
    """Single-sequence step captures written through the Recorder as one step of several sequences, as a serving
    engine batches them: tokens concatenated, each sequence's cache pages side by side in one paged cache."""
    ins = [p.inputs for p in parts]
    pages = [i.kv_cache.shape[1] for i in ins]
    first_page = np.cumsum([0] + pages[:-1])
    width = max(i.block_table.shape[1] for i in ins)
    table = np.stack([np.pad(i.block_table[0] + off, (0, width - i.block_table.shape[1]), mode="edge")
                      for i, off in zip(ins, first_page)]).astype(np.int32)
    index = [i.index_cache for i in ins]
    seq_lens = [int(i.seq_lens[0]) for i in ins]
    mode = "decode" if all(n == 1 for n in seq_lens) else "chunked"
    with Recorder(dst, ckpt, mode=mode, form="mha", engine="recorder", engine_dtype=parts[0].attrs["engine_dtype"],
                  layer_index=layer_index) as rec:
        rec.inputs(h=np.concatenate([i.x for i in ins]), positions=np.concatenate([i.positions for i in ins]),
                   seq_lens=seq_lens, context_lens=[int(i.context_lens[0]) for i in ins], block_table=table,
                   kv_cache=np.concatenate([i.kv_cache for i in ins], axis=1),
                   index_cache=None if index[0] is None else np.concatenate(index, axis=1))
        for (_, name) in parts[0].probes:
            rec.probe(name, np.concatenate([p.probes[(0, name)].ranks[0].data for p in parts]))


@pytest.mark.parametrize("kind", ["deepseek_v3", "glm_moe_dsa"])
def test_sequences_of_unequal_lengths_and_contexts_replay_clean(kind, root, tmp_path):
    """A chunked step of two sequences with 4 and 3 new tokens after 10 and 20 cached ones: replayed on the
    inputs' own layout (DSA: the indexer scores 23 keys for the longer sequence), clean."""
    ckpt = _checkpoint(kind, root)
    model = load(ckpt)
    parts = [_step_capture(model, 1, tmp_path / f"s{i}.h5", c, n, seed=i) for i, (c, n) in enumerate([(10, 4), (20, 3)])]
    _merge_sequences(parts, tmp_path / "cap.h5", ckpt, 1)
    d = read_dump(str(tmp_path / "cap.h5"))
    assert list(d.inputs.seq_lens) == [4, 3] and list(d.inputs.context_lens) == [10, 20]
    ro = json.loads(d.attrs["run_options"]) if isinstance(d.attrs["run_options"], str) else d.attrs["run_options"]
    assert ro["batch"] == 1 and ro["tokens"] == 7 and ro["context"] == []
    proc, data = replay(tmp_path / "cap.h5", ckpt, tmp_path)
    assert_clean(proc, data)
    assert "not comparable" not in proc.stderr, describe(proc, data)


def test_sequences_of_unequal_lengths_with_a_planted_bug_are_caught(root, tmp_path):
    """The same step, the second sequence's system running kv_a_layernorm with a gain off by 5%: found at
    kv_c_norm."""
    ckpt = _checkpoint("deepseek_v3", root)
    model, buggy = load(ckpt), load(ckpt)
    with torch.no_grad():
        buggy.model.layers[1].self_attn.kv_a_layernorm.weight.mul_(1.05)
    parts = [_step_capture(m, 1, tmp_path / f"s{i}.h5", c, n, seed=i)
             for i, (m, c, n) in enumerate([(model, 10, 4), (buggy, 20, 3)])]
    _merge_sequences(parts, tmp_path / "cap.h5", ckpt, 1)
    proc, data = replay(tmp_path / "cap.h5", ckpt, tmp_path)
    assert proc.returncode == 1, describe(proc, data)
    assert data["first_divergence"]["probe"] == "kv_c_norm", describe(proc, data)


def test_idx_scores_width_is_the_longest_sequence_in_python_and_cpp(tmp_path):
    """docs/dump-format.md: idx_scores is [T, K], K the longest context plus the run's tokens (for sequences of
    different lengths, batch 1 of their T tokens: the longest context plus T, so every sequence's keys fit). The
    Python writer's graph and the C++ reader's agree on it."""
    from mla_bisect.dump import DumpWriter

    cfg = {"model_type": "glm_moe_dsa", **TINY, **DSA}
    seq, ctx = [4, 3], [10, 20]
    T = sum(seq)
    K = max(ctx) + T
    rng = np.random.default_rng(0)
    pages = [(c + n + 63) // 64 for c, n in zip(ctx, seq)]
    table = np.array([[0, 0], [1, 1]], dtype=np.int32)
    with Recorder(tmp_path / "cap.h5", cfg, mode="chunked", engine="recorder", engine_dtype="fp32") as rec:
        rec.inputs(x=rng.standard_normal((T, 64)).astype(np.float32), seq_lens=seq, context_lens=ctx,
                   positions=np.concatenate([c + np.arange(n) for c, n in zip(ctx, seq)]), block_table=table,
                   kv_cache=rng.standard_normal((1, sum(pages), 64, 40)).astype(np.float32),
                   index_cache=rng.standard_normal((1, sum(pages), 64, 16)).astype(np.float32))
        assert rec._writer.graph.find("idx_scores").shape == (T, K)
        rec.probe("idx_scores", rng.standard_normal((T, K)).astype(np.float32))
    proc = subprocess.run([BINARY, "inspect", str(tmp_path / "cap.h5")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, describe(proc)
    with pytest.raises(ValueError):
        DumpWriter(tmp_path / "bad.h5", cfg, mode="chunked", tokens=7, batch=1, context=[10, 20])


# --- 8. one semantics for what a capture may omit ------------------------------------------------------------------

def test_explore_and_compare_of_a_clean_capture_against_its_replay_agree_with_replay(root, tmp_path):
    """HF records no lse: replay lists it as not captured and passes; explore and compare of the capture against
    the replay's reference dump do the same (not a missing probe, not a FAIL)."""
    ckpt = _checkpoint("deepseek_v3", root)
    hf_capture(load(ckpt), 1, tmp_path / "cap.h5")
    proc, data = replay(tmp_path / "cap.h5", ckpt, tmp_path, "--reference-out", str(tmp_path / "ref.h5"))
    assert_clean(proc, data)
    assert "lse" in json.dumps(data), describe(proc, data)  # listed as not captured
    explore = subprocess.run([BINARY, "explore", str(tmp_path / "cap.h5"), str(tmp_path / "ref.h5"), "--quiet"],
                             input="list\nquit\n", capture_output=True, text=True, timeout=300)
    assert explore.returncode == 0, describe(explore)
    assert "FAIL" not in explore.stdout and "missing" not in explore.stdout, describe(explore)
    compare = subprocess.run([BINARY, "compare", str(tmp_path / "cap.h5"), str(tmp_path / "ref.h5")],
                             capture_output=True, text=True, timeout=300)
    assert compare.returncode == 0, describe(compare)
    assert "not captured" in compare.stdout and "lse" in compare.stdout, describe(compare)
    # A run of mla-bisect's own engine that lacks a probe is still short of it.
    d = read_dump(str(tmp_path / "ref.h5"))
    assert d.attrs["engine"] == "reference"


def test_a_planted_bug_in_a_capture_still_fails_explore_and_compare(root, tmp_path, monkeypatch):
    """Narrowing to the captured probes keeps every captured probe compared: a capture whose o_proj input is
    scaled fails compare at attn_out."""
    ckpt = _checkpoint("deepseek_v3", root)
    model = load(ckpt)
    o_proj = model.model.layers[1].self_attn.o_proj
    hook = o_proj.register_forward_pre_hook(lambda m, args: (args[0] * 1.1,))
    hf_capture(model, 1, tmp_path / "cap.h5")
    hook.remove()
    proc, data = replay(tmp_path / "cap.h5", ckpt, tmp_path, "--reference-out", str(tmp_path / "ref.h5"))
    assert proc.returncode == 1, describe(proc, data)
    compare = subprocess.run([BINARY, "compare", str(tmp_path / "cap.h5"), str(tmp_path / "ref.h5")],
                             capture_output=True, text=True, timeout=300)
    assert compare.returncode == 1, describe(compare)


# --- 7. fp8 latent caches -----------------------------------------------------------------------------------------

def _through_e4m3(a, scale):
    """q(a / scale) * scale through OCP float8 e4m3fn (saturating at 448, nearest even), by ml_dtypes."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q = np.clip(np.asarray(a, np.float64) / scale, -448.0, 448.0).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    return (q.astype(np.float64) * scale).astype(np.float32)


def _fp8_cache_capture(ckpt, tmp_path, scale_of, declare=True):
    """A decode step of a system whose latent cache holds fp8 e4m3 codes at one per-tensor scale: its cached
    context is fp8 values, the rows it writes are stored (and read back) as fp8. Made with mla-bisect's own FP32
    reference on that cache, written through the Recorder with the cache's dtype and scale declared."""
    import h5py

    def run(*args):
        p = subprocess.run([BINARY, "run", "--weights", ckpt, "--layer-range", "1:2", "--probe-level", "full",
                            "--quiet", *args], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, describe(p)

    run("--mode", "decode", "--batch", "2", "--context", "30,45", "--out", str(tmp_path / "a.h5"))
    shutil.copy(tmp_path / "a.h5", tmp_path / "in.h5")
    with h5py.File(tmp_path / "in.h5", "r+") as f:
        kv = f["inputs/kv_cache"][...]
        scale = float(np.abs(kv).max()) / 448.0
        f["inputs/kv_cache"][...] = _through_e4m3(kv, scale)
    run("--input", str(tmp_path / "in.h5"), "--out", str(tmp_path / "b.h5"))
    b = read_dump(str(tmp_path / "b.h5"))
    i = b.inputs
    opts = dict(kv_cache_dtype="fp8_e4m3", kv_cache_scale=scale) if declare else {}
    with Recorder(tmp_path / "cap.h5", ckpt, mode="decode", engine="recorder", engine_dtype="fp32", layer_index=1,
                  **opts) as rec:
        kind = "h" if (0, "h") in b.probes else "x"
        rec.inputs(**{kind: i.x}, positions=i.positions, seq_lens=i.seq_lens, context_lens=i.context_lens,
                   block_table=i.block_table, kv_cache=i.kv_cache)
        for (_, name), p in b.probes.items():
            data = p.ranks[0].data
            rec.probe(name, scale_of(data, scale) if name == "kv_cache" else data)
    return tmp_path / "cap.h5"


def test_fp8_cache_with_its_scale_replays_clean(root, tmp_path):
    ckpt = _checkpoint("deepseek_v3", root)
    cap = _fp8_cache_capture(ckpt, tmp_path, lambda rows, s: _through_e4m3(rows, s))
    d = read_dump(str(cap))
    assert d.attrs["kv_cache_dtype"] == "fp8_e4m3" and d.attrs["kv_cache_scale"] > 0
    assert_clean(*replay(cap, ckpt, tmp_path))
    # Undeclared, the same capture's fp8 rows are a divergence at kv_cache: the storage is part of calibration.
    cap = _fp8_cache_capture(ckpt, tmp_path, lambda rows, s: _through_e4m3(rows, s), declare=False)
    proc, data = replay(cap, ckpt, tmp_path)
    assert proc.returncode == 1 and data["first_divergence"]["probe"] == "kv_cache", describe(proc, data)


def test_fp8_cache_read_back_with_the_scale_applied_twice_is_caught(root, tmp_path):
    ckpt = _checkpoint("deepseek_v3", root)
    cap = _fp8_cache_capture(ckpt, tmp_path, lambda rows, s: _through_e4m3(rows, s) * np.float32(s))
    proc, data = replay(cap, ckpt, tmp_path)
    assert proc.returncode == 1, describe(proc, data)
    assert data["first_divergence"]["probe"] == "kv_cache", describe(proc, data)
