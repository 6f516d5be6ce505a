"""A dump's journal folded into a Dump (probes/dump_journal.cpp): as its writer finishes, after a crash, and as a
snapshot of a run still writing; what a dead writer left (its journal, or the temporary file of a journal whose
header never reached it), and recover_dump, which folds that into FILE.h5. The journal's bytes are
mla_bisect.journal."""
import os
from typing import Dict, Tuple

import numpy as np

from . import journal as jr
from .dump_h5 import write_h5
from .dump_types import FORMAT, SCHEMA_VERSION, DumpError, Dump, Inputs, Probe, Record


def _record_from(rec: dict) -> Record:
    tl = rec["token_l2"]
    return Record(shape=tuple(rec["shape"]), dtype=rec["dtype"], l2=rec["l2"], absmax=rec["absmax"],
                  mean=rec["mean"], std=rec["std"], nan=int(rec["nan"]), inf=int(rec["inf"]),
                  checksum=int(rec["checksum"]), level=rec["level"],
                  token_l2=tl if tl is not None and tl.size else None, head_l2=rec["head_l2"], sketch=rec["sketch"],
                  data=rec["data"])


def _attrs_from_meta(meta: dict) -> dict:
    a = {"format": FORMAT, "schema_version": SCHEMA_VERSION}
    for k in ("tool_version", "git_sha", "created_utc", "engine", "engine_options", "engine_dtype", "device",
              "model", "run_options", "tp", "mode", "seed", "inject", "probe_level", "command"):
        a[k] = meta.get(k, "" if k not in ("tp", "seed") else (1 if k == "tp" else 0))
    if int(meta.get("processes", 0)) > 0:
        a["process_rank"] = int(meta.get("process_rank", -1))
        a["processes"] = int(meta["processes"])
        a["launch_id"] = meta.get("launch_id", "")
    if meta.get("layer_index") is not None:
        a["layer_index"] = int(meta["layer_index"])
    if meta.get("kv_cache_dtype"):
        a["kv_cache_dtype"] = str(meta["kv_cache_dtype"])
        a["kv_cache_scale"] = np.float64(meta["kv_cache_scale"])
    return a


def _fold(sc: jr.Scan, dump_path: str, jpath: str, mode: str, finish_status: str = "", copy: bool = True) -> Dump:
    """The Dump a journal holds (probes/dump_journal.cpp fold). mode: finish (the writer's own close), recover (its
    writer died: status "stopped: after <last probe>" unless it finished), live (its writer runs: "running: ...")."""
    if not sc.records or sc.records[0].type != jr.HEADER:
        raise DumpError(f"{jpath}: the journal has no intact header record ({sc.problem or 'empty file'}); nothing "
                        f"can be recovered from it. It is left in place; delete it to read or rewrite {dump_path}")
    try:
        h = jr.decode_header(sc.records[0].payload)
    except jr.FormatError as e:
        raise DumpError(f"{jpath}: unreadable journal header: {e}") from None
    meta = h["meta"]
    attrs = _attrs_from_meta(meta)
    tp = int(meta.get("tp", 1))
    own = int(meta.get("process_rank", -1))
    if own >= tp:
        raise DumpError(f"{jpath}: the journal's header says rank {own} of tp {tp}")
    inputs = None
    if h["inputs"] is not None:
        i = h["inputs"]
        inputs = Inputs(x=i["x"], positions=i["positions"], seq_lens=i["seq_lens"], context_lens=i["context_lens"],
                        block_table=i["block_table"], num_blocks=int(i["num_blocks"]), kv_cache=i["kv_cache"],
                        index_cache=i.get("index_cache"))
    probes: Dict[Tuple[int, str], Probe] = {}
    weights: Dict[Tuple[int, str], Probe] = {}
    last_stage = ["" if own >= 0 else "not started"] * max(tp, 1)
    if own >= 0:
        last_stage[own] = "not started"
    last_probe, finished_status, finished, problem, good = "", "", False, sc.problem, sc.good_bytes
    for r in sc.records[1:]:
        try:
            if r.type == jr.HEADER:
                raise jr.FormatError("a second header record")
            if r.type in (jr.PROBE, jr.WEIGHT):
                e = jr.decode_probe(r.payload, copy=copy)
                key = (e["layer"], e["name"])
                table = probes if r.type == jr.PROBE else weights
                p = table.get(key)
                if p is None:
                    p = table[key] = Probe(layer=e["layer"], name=e["name"], stage=e["stage"],
                                            contract=e["contract"], shape=e["shape"], order=e["order"],
                                            heads_axis=e["heads_axis"], rope_from=e["rope_from"],
                                            engine_dtype=e["rec"]["dtype"])
                rank = e["rank"]
                if own >= 0 and rank != own:
                    raise jr.FormatError(f"probe {e['name']} rank {rank} in the journal of rank {own}'s process")
                if own < 0 and rank > len(p.ranks):
                    raise jr.FormatError(f"probe {e['name']} rank {rank} recorded before rank {len(p.ranks)}")
                p.ranks[rank] = _record_from(e["rec"])  # recorded again (a re-run stage): the later one wins
                if r.type == jr.PROBE:
                    last_probe = f"layer {e['layer']} probe {e['name']} rank {rank}"
            elif r.type == jr.STAGE:
                e = jr.decode_stage(r.payload)
                if e["rank"] >= len(last_stage):
                    last_stage += ["not started"] * (e["rank"] + 1 - len(last_stage))
                last_stage[e["rank"]] = f"layer {e['layer']} stage {e['stage']}"
            elif r.type == jr.FINISH:
                finished_status = jr.decode_finish(r.payload)
                finished = True
        except jr.FormatError as ex:
            problem = f"record at byte {r.offset}: {ex}"
            good = r.offset
            break
    # `run --out` journals its setup (run_options "setup": what it does) before the slow part, then starts the
    # journal again with the inputs: a journal still marked so stopped during setup.
    ro = meta.get("run_options")
    if not last_probe and isinstance(ro, dict) and isinstance(ro.get("setup"), str):
        where = f"during setup ({ro['setup']}), before the first stage"
    else:
        where = f"after {last_probe}" if last_probe else "before the first probe"
    dropped = sc.total_bytes - good
    note = f" (journal: {dropped} bytes from byte {good} dropped: {problem})" if dropped > 0 else ""
    if mode == "finish":
        if dropped > 0:
            raise DumpError(f"{jpath}: the journal was damaged while the run wrote it: {problem}")
        status = finish_status
    elif mode == "recover":
        status = finished_status if finished else f"stopped: {where}{note}"
    else:
        status = f"running: {where}"
    attrs["status"] = status
    attrs["last_stage"] = last_stage
    ordered = dict(sorted(probes.items(), key=lambda kv: (kv[1].layer, kv[1].order)))
    w_ordered = dict(sorted(weights.items(), key=lambda kv: (kv[1].layer, kv[1].order)))
    for p in list(ordered.values()) + list(w_ordered.values()):
        p.ranks = dict(sorted(p.ranks.items()))
    return Dump(path=dump_path, attrs=attrs, status=status, last_stage=last_stage, inputs=inputs, probes=ordered,
                weights=w_ordered)


def _journal_state(path: str):
    """(state, fd) of FILE.h5.journal: ("none", -1) (no journal), ("folded", -1) (removed while it was opened),
    ("live", fd) (its writer holds the lock), ("dead", fd)."""
    import fcntl
    jpath = jr.journal_path(path)
    try:
        fd = os.open(jpath, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return "none", -1
    except OSError as e:
        raise DumpError(f"{jpath}: cannot open the dump journal: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return "live", fd
    except OSError as e:
        os.close(fd)
        raise DumpError(f"{jpath}: cannot lock the dump journal: {e.strerror}") from None
    if os.fstat(fd).st_nlink == 0:  # folded meanwhile
        os.close(fd)
        return "folded", -1
    return "dead", fd


def _dead_journal(path: str, state: str, fd: int):
    """What a dead writer left at `path` (probes/dump_journal.cpp fold_journal): (scan, source, temps) to fold, or
    (None, status, temps) where no header reached the disk, or None where there is nothing to fold. A writer fills
    FILE.h5.journal.tmp.PID and renames it over the journal once its header is on disk: a temporary file whose
    writer is gone stands for the run where the journal holds no header or is absent. An empty journal, or only
    temporary files without a header, means the run was killed before it wrote its header: stopped, nothing else
    known. A journal whose first bytes are not an intact header is an error (_fold raises)."""
    jpath = jr.journal_path(path)
    temps = jr.abandoned_temps(jpath)
    if state == "folded" or (fd < 0 and not temps):
        return None
    sc = jr.scan_fd(fd) if fd >= 0 else None
    if sc is not None and sc.records:
        return sc, jpath, temps
    for t in reversed(temps):
        try:
            tfd = os.open(t, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            ts = jr.scan_fd(tfd)
        finally:
            os.close(tfd)
        if ts.records and ts.records[0].type == jr.HEADER:
            return ts, t, temps
    if sc is not None and sc.total_bytes > 0:
        _fold(sc, path, jpath, "recover")  # raises: no intact header record
    where = jpath if fd >= 0 else temps[0]
    what = f"{jpath} is empty" if fd >= 0 else f"{temps[0]} holds no header"
    return (None, f"stopped: before the run wrote its header ({what}; engine, model and run options are not "
                  f"known). Delete {where}, or write {path} again", temps)


def recover_dump(path: str) -> bool:
    """Folds what a dead writer left (FILE.h5.journal, or its temporary file where the journal holds no header)
    into FILE.h5, as every C++ command does on opening the dump, and removes it; returns False when there is
    nothing to fold: no journal, its writer alive, or no header written (the run was killed before it)."""
    state, fd = _journal_state(path)
    try:
        if state == "live":
            return False
        found = _dead_journal(path, state, fd)
        if found is None or found[0] is None:
            return False
        sc, source, temps = found
        d = _fold(sc, path, source, "recover", copy=True)
        del sc
        write_h5(d, path)
        if fd >= 0:
            os.unlink(jr.journal_path(path))
        for t in temps:
            try:
                os.unlink(t)
            except OSError:
                pass
        jr.sync_dir(path)
    finally:
        if fd >= 0:
            os.close(fd)
    return True
