"""Running a fault (or a clean configuration) end to end: the numpy layer's forward with the fault planted,
captured with mla_bisect.capture.Recorder, replayed by `mla-bisect replay CAPTURE --weights CKPT --json`, and
scored against the answer written beside the fault."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np

from .checkpoints import save_checkpoint
from .mla_numpy import MLA, capture, make_batch

INPUT_SEED = 5


def scenario_key(config, seq_lens, context, tp, dtype, h_scale_rows):
    return (config, tuple(seq_lens), tuple(context) if context else None, tp, dtype,
            tuple(sorted((h_scale_rows or {}).items())))


def forward(cfg, weights, seq_lens, context=None, tp=1, dtype="fp32", h_scale_rows=None, plant=None):
    """The layer's probes for one scenario, with `plant` (a fault's apply) applied to the layer first."""
    m = MLA(cfg, weights, dtype=dtype, tp=tp)
    if plant is not None:
        plant(m)
    batch = make_batch(cfg, list(seq_lens), list(context) if context else None, seed=INPUT_SEED)
    for row, factor in (h_scale_rows or {}).items():
        batch.h[row] *= np.float32(factor)
    return m.forward(batch)


def replay(binary, capture_path, ckpt, json_path, timeout=120):
    if os.path.exists(json_path):
        os.remove(json_path)
    proc = subprocess.run([binary, "replay", str(capture_path), "--weights", str(ckpt), "--json", str(json_path),
                           "--quiet"], capture_output=True, text=True, timeout=timeout)
    data = None
    if os.path.exists(json_path):
        with open(json_path) as f:
            data = json.load(f)
    return proc, data


def confirmed_classes(data):
    """The confirmed classes of the replay's hypothesis search, in the tool's order ([] when it confirmed none or
    when the report has no hypothesis search)."""
    hyp = (data or {}).get("hypotheses") or {}
    return [c.get("class") for c in hyp.get("confirmed") or [] if c.get("class")]


def score(expected_stage, expected, rc, data):
    """(verdict, got): right | misleading | none, with what the tool said.

    right: the first confirmed class is one of `expected` and the first divergence is at `expected_stage`; for a
    fault no class models (expected None): nothing confirmed and the divergence at the expected stage; for a benign
    fault (expected_stage None): a clean replay (exit 0) with nothing confirmed.
    misleading: a confirmed class not in `expected` (or any, where expected is None), or a confirmed class at a
    stage other than the expected one.
    none: nothing confirmed (and not right)."""
    first = (data or {}).get("first_divergence") or {}
    stage = first.get("stage")
    confirmed = confirmed_classes(data)
    got = {"exit": rc, "stage": stage, "probe": first.get("probe"), "confirmed": confirmed,
           "confidence": ((data or {}).get("diagnosis") or {}).get("confidence"),
           "searched": ((data or {}).get("hypotheses") or {}).get("searched")}
    if expected_stage is None:
        if confirmed:
            return "misleading", got
        return ("right" if rc == 0 else "none"), got
    if confirmed:
        if expected is not None and confirmed[0] in expected and stage == expected_stage:
            return "right", got
        return "misleading", got
    if expected is None and stage == expected_stage:
        return "right", got
    return "none", got


class Workspace:
    """Checkpoints written once per config under `root`."""

    def __init__(self, root, binary):
        self.root = str(root)
        self.binary = binary
        self._ckpt = {}

    def checkpoint(self, config):
        if config not in self._ckpt:
            self._ckpt[config] = save_checkpoint(self.root, config)
        return self._ckpt[config]

    def run(self, name, config, seq_lens, context=None, tp=1, dtype="fp32", h_scale_rows=None, plant=None):
        path, cfg, weights = self.checkpoint(config)
        probes = forward(cfg, weights, seq_lens, context, tp, dtype, h_scale_rows, plant)
        cap = os.path.join(self.root, f"{name}.h5")
        capture(cap, cfg, probes, dtype=dtype, tp=tp)
        return replay(self.binary, cap, path, os.path.join(self.root, f"{name}.json"))

    def run_fault(self, f):
        proc, data = self.run(f.name, f.config, f.seq_lens, f.context, f.tp, f.dtype, f.h_scale_rows, f.apply)
        verdict, got = score(f.stage, f.expected, proc.returncode, data)
        if proc.returncode not in (0, 1):
            got["error"] = (proc.stderr or proc.stdout)[-600:]
        return verdict, got


def expected_text(f):
    if f.stage is None:
        return "clean (benign)"
    classes = "no class" if f.expected is None else "|".join(sorted(f.expected))
    return f"{f.stage}: {classes}"


def got_text(got):
    if got.get("error"):
        return f"exit {got['exit']}: {got['error'].strip().splitlines()[-1][:80]}"
    if got["exit"] == 0:
        return "clean" + (f" (confirmed {','.join(got['confirmed'])})" if got["confirmed"] else "")
    classes = ",".join(got["confirmed"]) if got["confirmed"] else "none confirmed"
    return f"{got['stage']}/{got['probe']}: {classes}"


def table(rows):
    """rows: dicts with fault, source, expected, got, verdict -> printable table and totals line."""
    w_f = max(len(r["fault"]) for r in rows)
    w_e = max(len(r["expected"]) for r in rows)
    w_g = max(len(r["got"]) for r in rows)
    lines = [f"{'fault':<{w_f}}  {'expected':<{w_e}}  {'got':<{w_g}}  verdict     source"]
    for r in rows:
        lines.append(f"{r['fault']:<{w_f}}  {r['expected']:<{w_e}}  {r['got']:<{w_g}}  {r['verdict']:<10}  "
                     f"{r['source']}")
    n = len(rows)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("right", "misleading", "none")}
    lines.append(f"{n} faults: right {counts['right']} ({100.0 * counts['right'] / n:.0f}%), misleading "
                 f"{counts['misleading']} ({100.0 * counts['misleading'] / n:.0f}%), none {counts['none']} "
                 f"({100.0 * counts['none'] / n:.0f}%)")
    return "\n".join(lines), counts
