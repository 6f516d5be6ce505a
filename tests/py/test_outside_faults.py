"""An outside measure of `mla-bisect replay`'s diagnosis: an independent numpy MLA layer (tests/py/outside_faults)
captured through mla_bisect.capture.Recorder, replayed against tiny HF-style checkpoints, clean and with faults
modelled on bugs reported against serving stacks, plus faults patched into tiny HF transformers models and captured
with mla_bisect.hf.capture_layer. Each fault carries the expected first-divergence stage and the catalogue classes
that name it, written before any run; the scorer counts right / misleading / none.

Two sets: the first (faults.py) and the second (faults_more.py, and hf_faults.py where torch and transformers are
installed), reported apart and together. Asserted: every clean scenario replays clean (exit 0, no divergence,
nothing confirmed); of the faults of the first set, and of both sets together, misleading answers at most 3%, right
at least 85%, none at most 12%. MLA_OUTSIDE_REPORT=FILE writes the tables as JSON."""
import json
import os
import sys

import pytest

pytest.importorskip("numpy")
pytest.importorskip("h5py")
pytest.importorskip("ml_dtypes")
pytest.importorskip("safetensors")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from outside_faults.checkpoints import CONFIGS  # noqa: E402
from outside_faults.faults import FAULTS  # noqa: E402
from outside_faults.faults_more import FAULTS_MORE  # noqa: E402
from outside_faults.hf_faults import HF_FAULTS, HF_MODELS, HFWorkspace, available  # noqa: E402
from outside_faults.run import Workspace, expected_text, got_text, scenario_key, table  # noqa: E402

BINARY = os.environ.get("MLA_BINARY", "mla-bisect")

# Clean scenarios: every config in fp32 and bf16 (two sequences of 9 and 7 tokens), plus every scenario a fault
# runs on (chunked and decode steps with context, tp 2, large activations in fp16), each without the fault.
BASE_SCENARIOS = [dict(config=c, seq_lens=(9, 7), context=None, tp=1, dtype=d, h_scale_rows={})
                  for c in CONFIGS for d in ("fp32", "bf16")]


def _scenarios():
    seen, out = set(), []
    for s in BASE_SCENARIOS + [dict(config=f.config, seq_lens=f.seq_lens, context=f.context, tp=f.tp, dtype=f.dtype,
                                    h_scale_rows=f.h_scale_rows) for f in FAULTS + FAULTS_MORE]:
        key = scenario_key(**s)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


SCENARIOS = _scenarios()


def _scenario_id(s):
    parts = [s["config"], s["dtype"], "x".join(map(str, s["seq_lens"]))]
    if s["context"]:
        parts.append("ctx" + "_".join(map(str, s["context"])))
    if s["tp"] > 1:
        parts.append(f"tp{s['tp']}")
    if s["h_scale_rows"]:
        parts.append("large")
    return "-".join(parts)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("outside_faults"), BINARY)


def _describe(proc, data):
    return (f"exit {proc.returncode}\nstderr: {proc.stderr[-1500:]}\n"
            f"report: {json.dumps({k: (data or {}).get(k) for k in ('first_divergence', 'isolation', 'diagnosis')})[:2500]}")


@pytest.mark.parametrize("s", SCENARIOS, ids=_scenario_id)
def test_clean_numpy_layer_replays_clean(s, ws):
    proc, data = ws.run("clean-" + _scenario_id(s), s["config"], s["seq_lens"], s["context"], s["tp"], s["dtype"],
                        s["h_scale_rows"])
    assert proc.returncode == 0, _describe(proc, data)
    assert data is not None and not data.get("first_divergence"), _describe(proc, data)
    confirmed = [c.get("class") for c in ((data.get("hypotheses") or {}).get("confirmed") or [])]
    assert not confirmed, confirmed


@pytest.fixture(scope="module")
def hf_ws(tmp_path_factory):
    return HFWorkspace(tmp_path_factory.mktemp("outside_hf_faults"), BINARY)


# Clean HF captures: each model a fault uses, at the position offset the faults use on it.
HF_CLEAN = sorted({(f.model, f.position_offset) for f in HF_FAULTS})


@pytest.mark.parametrize("model,offset", HF_CLEAN, ids=[f"{m}-pos{o}" for m, o in HF_CLEAN])
def test_clean_hf_model_replays_clean(model, offset, hf_ws):
    if not available(model):
        pytest.skip(f"torch / transformers without {HF_MODELS[model][0]}")
    proc, data = hf_ws.run(f"clean-{model}-{offset}", model, None, offset)
    assert proc.returncode == 0, _describe(proc, data)
    assert data is not None and not data.get("first_divergence"), _describe(proc, data)


def test_every_fault_is_sourced_and_answered():
    names = [f.name for f in FAULTS + FAULTS_MORE + HF_FAULTS]
    assert len(names) == len(set(names))
    assert len(FAULTS) >= 30
    assert len(FAULTS_MORE) + len(HF_FAULTS) >= 14
    for f in FAULTS + FAULTS_MORE + HF_FAULTS:
        assert f.source.startswith("https://github.com/"), f.name
        assert f.config in CONFIGS or f.config in HF_MODELS, f.name
        assert f.what, f.name
        assert f.stage is not None or f.expected is None, f.name


def _row(f, verdict, got, fault_set):
    return dict(fault=f.name, set=fault_set, source=f.source, project=f.project, config=f.config,
                expected=expected_text(f), expected_stage=f.stage,
                expected_classes=sorted(f.expected) if f.expected is not None else None,
                got=got_text(got), got_detail=got, verdict=verdict)


def _assert_thresholds(counts, n, text):
    assert counts["misleading"] <= 0.03 * n, text
    assert counts["right"] >= 0.85 * n, text
    assert counts["none"] <= 0.12 * n, text


def test_outside_faults_scored(ws, hf_ws, capsys):
    first = [_row(f, *ws.run_fault(f), "first") for f in FAULTS]
    second = [_row(f, *ws.run_fault(f), "second") for f in FAULTS_MORE]
    skipped = [f.name for f in HF_FAULTS if not available(f.model)]
    second += [_row(f, *hf_ws.run_fault(f), "second (HF)") for f in HF_FAULTS if available(f.model)]
    both = first + second
    parts = {}
    for label, rows in (("first set", first), ("second set", second), ("both sets", both)):
        parts[label] = table(rows)
    with capsys.disabled():
        for label, (text, _) in parts.items():
            print(f"\n{label}:\n{text}" if label != "both sets" else f"\n{label}: {text.splitlines()[-1]}")
        if skipped:
            print(f"HF faults not run (torch / transformers missing): {', '.join(skipped)}")
    report = os.environ.get("MLA_OUTSIDE_REPORT")
    if report:
        with open(report, "w") as fh:
            json.dump({"faults": both, "not_run": skipped,
                       "totals": {label: dict(counts, faults=len(rows)) for (label, (_, counts)), rows
                                  in zip(parts.items(), (first, second, both))}}, fh, indent=1)
    _assert_thresholds(parts["first set"][1], len(first), parts["first set"][0])
    _assert_thresholds(parts["both sets"][1], len(both), parts["both sets"][0])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
