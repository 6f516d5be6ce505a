"""read_dump: a dump of either writer read into a Dump: FILE.h5, a journal its writer left folded in memory first, or
a one-process-per-rank set FILE.rank0.h5 ... merged into one dump (probes/dump_read.cpp, probes/dump_ranks.cpp)."""
import os
from typing import Dict, Tuple

import numpy as np

from . import journal as jr
from .dump_h5 import _read_h5
from .dump_journal import _dead_journal, _fold, _journal_state
from .dump_ranks import _rank_files_beside, rank_dump_path
from .dump_types import FORMAT, SCHEMA_VERSION, DumpError, Dump, Probe


def _headerless(path: str, status: str) -> Dump:
    attrs = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "status": status, "last_stage": []}
    return Dump(path=path, attrs=attrs, status=status, last_stage=[], inputs=None, probes={})


def _strip(d: Dump, data: bool, inputs: bool) -> Dump:
    if not inputs:
        d.inputs = None
    if not data:
        for p in d.probes.values():
            for r in p.ranks.values():
                r.data = None
    return d


def _read_one(path: str, data: bool, inputs: bool) -> Dump:
    state, fd = _journal_state(path)
    try:
        if state == "live":
            sc = jr.scan_fd(fd)
            if not sc.records:
                raise DumpError(f"{path}: the run writing this dump is alive and has not written its journal header "
                                f"yet")
            return _strip(_fold(sc, path, jr.journal_path(path), "live", copy=True), data, inputs)
        found = _dead_journal(path, state, fd)
    finally:
        if fd >= 0:
            os.close(fd)
    if found is None:
        return _read_h5(path, data, inputs)
    sc, source, _ = found
    if sc is None:
        return _headerless(path, source)
    return _strip(_fold(sc, path, source, "recover", copy=True), data, inputs)


def _exists_with_journal(path: str) -> bool:
    jpath = jr.journal_path(path)
    return os.path.exists(path) or os.path.exists(jpath) or bool(jr.abandoned_temps(jpath))


def _same_inputs(a: Dump, b: Dump) -> bool:
    if (a.inputs is None) != (b.inputs is None):
        return False
    if a.inputs is None:
        return True
    x, y = a.inputs, b.inputs
    for k in ("x", "positions", "seq_lens", "context_lens", "block_table"):
        u, v = np.asarray(getattr(x, k)), np.asarray(getattr(y, k))
        if u.shape != v.shape or u.tobytes() != v.tobytes():
            return False
    if x.num_blocks != y.num_blocks:
        return False
    for k in ("kv_cache", "index_cache"):
        u, v = getattr(x, k), getattr(y, k)
        if (u is None) != (v is None) or (u is not None and (u.shape != v.shape or u.tobytes() != v.tobytes())):
            return False
    return True


def _read_rank_set(path: str, data: bool, inputs: bool) -> Dump:
    p0 = rank_dump_path(path, 0)
    first = _read_one(p0, data, True)
    if first.process_rank != 0:
        what = ("holds every rank of one process's run" if first.process_rank < 0
                else f"holds rank {first.process_rank}")
        raise DumpError(f"{p0}: {what}, not rank 0 of a one-process-per-rank run, so {path} cannot be read as its set")
    n = first.processes
    set_name = (f"{path} (the set {p0}{' ... ' + rank_dump_path(path, n - 1) if n > 1 else ''} of a "
                f"one-process-per-rank run at tp {n})")
    parts = [first]
    a = first.attrs
    for r in range(1, n):
        pr = rank_dump_path(path, r)
        if not _exists_with_journal(pr):
            raise DumpError(f"{pr}: no such file: rank {r}'s dump is missing from {set_name}")
        d = _read_one(pr, data, True)
        m = d.attrs

        def differs(what, detail):
            raise DumpError(f"{pr} and {p0} differ in {what} ({detail}): they are not ranks of one launch, so {path} "
                            f"cannot be read as their set")
        if d.process_rank != r or d.processes != n:
            differs("which rank they hold", f"rank {d.process_rank} of {d.processes} processes, expected rank {r} "
                                            f"of {n}")
        if d.launch_id != first.launch_id:
            differs("launch", f"launch id {d.launch_id or '(none)'} vs {first.launch_id or '(none)'}")
        for k in ("tp", "engine", "engine_options", "engine_dtype", "model", "run_options", "mode", "seed", "inject",
                  "probe_level"):
            if m.get(k) != a.get(k):
                differs(k, f"{m.get(k)!r} vs {a.get(k)!r}")
        if not _same_inputs(d, first):
            differs("inputs", "/inputs")
        parts.append(d)
    attrs = dict(a)
    attrs["process_rank"] = -1
    attrs["processes"] = n
    stopped = "; ".join(f"{d.status} (in {d.path})" for d in parts if not d.complete)
    status = stopped or "complete"
    last_stage = [d.last_stage[r] if r < len(d.last_stage) else "" for r, d in enumerate(parts)]
    devices = [attrs.get("device", "")]
    for d in parts[1:]:
        dev = d.attrs.get("device", "")
        if dev and dev not in devices[0]:
            devices[0] += "; " + dev
    attrs["device"] = devices[0]
    merged: Dict[Tuple[int, str], Probe] = {}
    left_out = 0
    keys = sorted({k for d in parts for k in d.probes})
    for key in keys:
        per = [d.probes.get(key) for d in parts]
        if any(p is None or not p.ranks for p in per):
            left_out += 1
            continue
        base = per[0]
        mp = Probe(layer=base.layer, name=base.name, stage=base.stage, contract=base.contract, shape=base.shape,
                   order=base.order, heads_axis=base.heads_axis, rope_from=base.rope_from,
                   engine_dtype=base.engine_dtype)
        for r, p in enumerate(per):
            if p.shape != base.shape or p.contract != base.contract or p.order != base.order:
                raise DumpError(f"{parts[r].path}: layer {p.layer} probe {p.name} is {p.contract} {list(p.shape)} at "
                                f"graph position {p.order}, in {p0} {base.contract} {list(base.shape)} at {base.order}")
            mp.ranks[r] = p.ranks[r]
        merged[key] = mp
    if left_out:
        status += (f"; {left_out} probe{'s' if left_out != 1 else ''} recorded by only some ranks left out (inspect "
                   f"the rank files for them)")
    attrs["status"] = status
    attrs["last_stage"] = last_stage
    ordered = dict(sorted(merged.items(), key=lambda kv: (kv[1].layer, kv[1].order)))
    return Dump(path=path, attrs=attrs, status=status, last_stage=last_stage,
                inputs=first.inputs if inputs else None, probes=ordered, parts=[d.path for d in parts])


def read_dump(path, data: bool = True, inputs: bool = True) -> Dump:
    """Reads a dump written by the C++ tool or by DumpWriter: FILE.h5, folding a journal its writer left (in
    memory: the files are not changed), or, where FILE.h5 does not exist, the set FILE.rank0.h5 ... of a
    one-process-per-rank capture merged into one dump with every rank (a single FILE.rankR.h5 reads as itself).
    data=False skips full tensors; inputs=False skips /inputs. DumpError (a ValueError) names the file and what is
    wrong."""
    path = os.fspath(path)
    if not _exists_with_journal(path):
        ranks = _rank_files_beside(path)
        if 0 in ranks:
            return _read_rank_set(path, data, inputs)
        if ranks:
            first = next(iter(ranks.values()))
            more = f" and {len(ranks) - 1} more" if len(ranks) > 1 else ""
            raise DumpError(f"{path}: no such file, and of the one-process-per-rank set that reads as it "
                            f"{rank_dump_path(path, 0)} is missing (found {first}{more})")
    return _read_one(path, data, inputs)
