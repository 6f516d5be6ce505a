#!/usr/bin/env python3
"""Reads an mla-bisect dump with h5py, as any outside tool would, and checks the documented layout
(docs/dump-format.md, schema_version 1) against a JSON sidecar of what the C++ side recorded.

    check_dump_layout.py DUMP.h5 SIDECAR.json

Called by tests/test_dump.cpp (DumpLayout.H5pyFindsTheDocumentedLayout). Exit 0 when everything matches;
otherwise prints every mismatch and exits 1.
"""
import json
import sys

import h5py
import numpy as np

ROOT_STRINGS = ["format", "tool_version", "git_sha", "created_utc", "engine", "engine_options", "engine_dtype",
                "device", "model", "run_options", "mode", "inject", "probe_level", "command", "status", "last_stage"]
ROOT_INTS = ["schema_version", "tp", "seed"]
PROBE_ATTRS = ["order", "stage", "contract", "shape", "engine_dtype", "heads_axis", "rope_from"]
def splitmix64(x):
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def pow_mod64(base, e):
    """base ** e mod 2^64, elementwise over the uint64 array e (square and multiply)."""
    r = np.ones_like(e)
    b = np.full_like(e, base)
    e = e.copy()
    with np.errstate(over="ignore"):
        while e.any():
            r = np.where(e & np.uint64(1), r * b, r)
            b = b * b
            e >>= np.uint64(1)
    return r


def checksum_fp32(data):
    """core/probe/probe_hash.h, written again: over the tensor viewed as [tokens, cols] (tokens: its first axis), the
    sum mod 2^64 of multiplier(r, c) * (2 * bits + 1), with multiplier(r, c) = (splitmix64(r) | 1) * A^(c >> 3) +
    0x9e3779b97f4a7c16 * (c & 7), A = 0xd1b54a32d192ed03."""
    rows = data.shape[0] if data.ndim > 0 else 1
    bits = np.ascontiguousarray(data, dtype=np.float32).reshape(rows, -1).view(np.uint32).astype(np.uint64)
    r = np.arange(rows, dtype=np.uint64)[:, None]
    c = np.arange(bits.shape[1], dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        power = pow_mod64(np.uint64(0xD1B54A32D192ED03), c >> np.uint64(3))
        m = (splitmix64(r) | np.uint64(1)) * power + np.uint64(0x9E3779B97F4A7C16) * (c & np.uint64(7))
        return int((m * (np.uint64(2) * bits + np.uint64(1))).sum(dtype=np.uint64))


RANK_ATTRS = ["l2", "absmax", "mean", "std", "nan", "inf", "checksum", "level"]

from check_common import check, report


def same_f32(dataset, values, shape, where):
    """Exact float32 equality (the sidecar's numbers are float32 values printed with round-trip precision)."""
    got = np.asarray(dataset)
    want = np.asarray(values, dtype=np.float32).reshape(shape)
    if not check(got.dtype == np.float32, f"{where}: dtype {got.dtype}, expected float32"):
        return
    if not check(got.shape == tuple(shape), f"{where}: shape {got.shape}, expected {tuple(shape)}"):
        return
    bad = np.flatnonzero(got.reshape(-1).view(np.uint32) != want.reshape(-1).view(np.uint32))
    check(bad.size == 0, f"{where}: {bad.size} values differ from the C++ side, first at flat index "
                         f"{bad[0] if bad.size else -1}")


def main(dump_path, sidecar_path):
    with open(sidecar_path) as f:
        side = json.load(f)
    with h5py.File(dump_path, "r") as h:
        a = h.attrs
        for k in ROOT_STRINGS:
            if check(k in a, f"/: missing attribute {k}"):
                check(isinstance(a[k], str), f"/{k}: {type(a[k]).__name__}, expected a (variable-length) string")
        for k in ROOT_INTS:
            if check(k in a, f"/: missing attribute {k}"):
                check(np.issubdtype(np.asarray(a[k]).dtype, np.integer), f"/{k}: not an integer")
        check(a.get("format") == "mla-bisect-dump", f"/format = {a.get('format')!r}")
        # 1, or 2 when the run recorded its weights (/weights: the one group version 2 adds).
        check(int(a.get("schema_version", -1)) == (2 if "weights" in h else 1),
              f"/schema_version {a.get('schema_version')} with{'' if 'weights' in h else 'out'} /weights")
        if "weights" in h:
            for lname, lg in h["weights"].items():
                check(lname.startswith("layer") and lname[5:].isdigit(), f"/weights/{lname}: not a layer group")
                for wname, wg in lg.items():
                    gp = f"/weights/{lname}/{wname}"
                    for k in PROBE_ATTRS:
                        check(k in wg.attrs, f"{gp}: missing attribute {k}")
                    shape = [int(s) for s in wg.attrs["shape"]]
                    contract = wg.attrs["contract"]
                    check(contract in ("replicated", "rows", "columns"), f"{gp}: contract {contract!r}")
                    check(len(shape) == 2, f"{gp}: shape {shape} is not [rows, columns]")
                    tp = int(a["tp"])
                    local = [shape[0] // tp if contract == "rows" else shape[0],
                             shape[1] // tp if contract == "columns" else shape[1]]
                    for r in range(tp):
                        rg = wg[f"rank{r}"]
                        check(list(rg.attrs["shape"]) == local, f"{gp}/rank{r}: shape {list(rg.attrs['shape'])}")
                        check(rg["token_l2"].shape == (local[0],), f"{gp}/rank{r}/token_l2: {rg['token_l2'].shape}")
                        if "sketch" in rg:
                            check(rg["sketch"].shape == (local[0], 32), f"{gp}/rank{r}/sketch: {rg['sketch'].shape}")
                        if "data" in rg:
                            d = rg["data"][...]
                            check(list(d.shape) == local, f"{gp}/rank{r}/data: {d.shape}")
                            norms = np.sqrt((d.astype(np.float64) ** 2).sum(axis=1))
                            check(np.allclose(norms, rg["token_l2"][...], rtol=1e-5),
                                  f"{gp}/rank{r}: token_l2 is not the rows' norms")
        check(int(a.get("tp", -1)) == side["tp"], "/tp differs")
        check(a.get("status") == "complete", f"/status = {a.get('status')!r}")
        model = json.loads(a["model"])
        check(model["hidden_size"] == side["model"]["hidden_size"], "/model: hidden_size differs")
        check(model == side["model"], "/model: differs from MlaConfig::to_json()")
        run = json.loads(a["run_options"])
        check(run["tp"] == side["tp"] and run["layers"] == side["layers"], "/run_options: tp/layers differ")
        last = json.loads(a["last_stage"])
        check(isinstance(last, list) and len(last) == side["tp"], "/last_stage: not a list of one entry per rank")

        # /inputs
        si = side["inputs"]
        if check("inputs" in h, "/inputs missing"):
            g = h["inputs"]
            same_f32(g["x"], si["x"], si["x_shape"], "/inputs/x")
            for name, key in [("positions", "positions"), ("seq_lens", "seq_lens"), ("context_lens", "context_lens")]:
                d = g[name]
                check(d.dtype == np.int32, f"/inputs/{name}: dtype {d.dtype}")
                check(np.array_equal(d[...], np.asarray(si[key], dtype=np.int32)), f"/inputs/{name}: values differ")
            bt = g["block_table"]
            check(bt.dtype == np.int32 and bt.shape == (len(si["seq_lens"]), si["max_blocks"]),
                  f"/inputs/block_table: {bt.dtype} {bt.shape}")
            check(np.array_equal(bt[...].reshape(-1), np.asarray(si["block_table"])), "/inputs/block_table: values")
            check(int(g.attrs["num_blocks"]) == si["num_blocks"], "/inputs num_blocks attribute")
            kv = g["kv_cache"]
            check(kv.dtype == np.float32 and list(kv.shape) == si["kv_cache_shape"],
                  f"/inputs/kv_cache: {kv.dtype} {kv.shape}, expected {si['kv_cache_shape']}")
            check(float(np.abs(kv[...]).sum()) > 0, "/inputs/kv_cache: all zero although the step has context")

        # /layer{l}/{probe}/rank{r}
        seen_groups = set()
        for rec in side["records"]:
            gp = f"/layer{rec['layer']}/{rec['name']}"
            where = f"{gp}/rank{rec['rank']}"
            if not check(gp in h, f"{gp}: missing"):
                continue
            p = h[gp]
            if gp not in seen_groups:
                seen_groups.add(gp)
                for k in PROBE_ATTRS:
                    check(k in p.attrs, f"{gp}: missing attribute {k}")
                check(p.attrs["stage"] == rec["stage"], f"{gp}: stage {p.attrs['stage']!r}")
                check(p.attrs["contract"] == rec["contract"], f"{gp}: contract {p.attrs['contract']!r}")
                check(list(p.attrs["shape"]) == rec["shape"], f"{gp}: shape {list(p.attrs['shape'])}")
                check(np.asarray(p.attrs["shape"]).dtype == np.int64, f"{gp}: shape is not int64")
                check(int(p.attrs["order"]) == rec["order"], f"{gp}: order")
                check(int(p.attrs["heads_axis"]) == rec["heads_axis"], f"{gp}: heads_axis")
                check(int(p.attrs["rope_from"]) == rec["rope_from"], f"{gp}: rope_from")
            if not check(f"rank{rec['rank']}" in p, f"{where}: missing"):
                continue
            r = p[f"rank{rec['rank']}"]
            for k in RANK_ATTRS:
                check(k in r.attrs, f"{where}: missing attribute {k}")
            check(r.attrs["level"] == rec["level"], f"{where}: level {r.attrs['level']!r}, expected {rec['level']}")
            check(float(r.attrs["l2"]) == rec["l2"], f"{where}: l2 {float(r.attrs['l2'])} != {rec['l2']}")
            check(np.asarray(r.attrs["checksum"]).dtype == np.uint64, f"{where}: checksum is not uint64")
            check(int(r.attrs["checksum"]) == rec["checksum"], f"{where}: checksum differs")
            check(int(r.attrs["nan"]) == rec["nan"], f"{where}: nan count differs")
            T = rec["shape"][0]
            same_f32(r["token_l2"], rec["token_l2"], [T], f"{where}/token_l2")
            if rec["heads_axis"] >= 0:
                heads = rec["local_shape"][rec["heads_axis"]]
                if check("head_l2" in r, f"{where}/head_l2: missing"):
                    same_f32(r["head_l2"], rec["head_l2"], [T, heads], f"{where}/head_l2")
            else:
                check("head_l2" not in r, f"{where}/head_l2: present without a heads axis")
            if rec["level"] == "stats":
                check("sketch" not in r, f"{where}/sketch: present at stats level")
            elif check("sketch" in r, f"{where}/sketch: missing at level {rec['level']}"):
                same_f32(r["sketch"], rec["sketch"], [T, 32], f"{where}/sketch")
            if rec["level"] == "full":
                if check("data" in r, f"{where}/data: missing at full level"):
                    same_f32(r["data"], rec["data"], rec["local_shape"], f"{where}/data")
                    if p.attrs["engine_dtype"] == "fp32":  # the checksum recomputed here from its definition
                        want = checksum_fp32(np.asarray(r["data"]))
                        check(int(r.attrs["checksum"]) == want,
                              f"{where}: checksum {int(r.attrs['checksum'])} != {want} recomputed from the data")
            else:
                check("data" not in r, f"{where}/data: present below full level")

        # Nothing in the file that the run did not record.
        listed = {f"/layer{rec['layer']}/{rec['name']}" for rec in side["records"]}
        for lname in h:
            if lname.startswith("layer"):
                for pname in h[lname]:
                    check(f"/{lname}/{pname}" in listed, f"/{lname}/{pname}: not recorded by the run")

    return report(f"mismatches in {dump_path}",
                  f"ok: {dump_path} matches the documented layout ({len(side['records'])} rank records)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
