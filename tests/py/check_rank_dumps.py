#!/usr/bin/env python3
"""Reads the dumps of a one-process-per-rank run with h5py, as any outside tool would, and checks that each
FILE.rank<R>.h5 holds only rank R (root attributes process_rank = R, processes = tp, one launch_id for all; one
rank group per probe, named rank<R>), and that every record equals rank R's record of the same run made in one
process.

    check_rank_dumps.py SINGLE.h5 RANK0.h5 [RANK1.h5 ...]

Called by tests/test_cli_process_rank.cpp (CliProcessRank.H5pyFindsOnlyItsRankInEachFile). Exit 0 when everything
matches; otherwise prints every mismatch and exits 1.
"""
import sys

import h5py
import numpy as np

RANK_ATTRS = ["l2", "absmax", "mean", "std", "nan", "inf", "checksum", "level", "dtype"]
PROBE_ATTRS = ["order", "stage", "contract", "engine_dtype", "heads_axis", "rope_from"]

from check_common import check, report


def probes(h):
    """{"/layer0/q_c": group} of every probe group in a dump."""
    out = {}
    for lname in h:
        if lname.startswith("layer"):
            for pname in h[lname]:
                out[f"/{lname}/{pname}"] = h[lname][pname]
    return out


def same_attr(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


def main(single_path, rank_paths):
    tp = len(rank_paths)
    with h5py.File(single_path, "r") as s:
        check(int(s.attrs["tp"]) == tp, f"{single_path}: tp {int(s.attrs['tp'])}, expected {tp}")
        check("process_rank" not in s.attrs and "processes" not in s.attrs and "launch_id" not in s.attrs,
              f"{single_path}: one process's dump carries process_rank/processes/launch_id")
        single = probes(s)
        launch_ids = set()
        for r, path in enumerate(rank_paths):
            with h5py.File(path, "r") as h:
                a = h.attrs
                check(int(a.get("process_rank", -1)) == r, f"{path}: process_rank {a.get('process_rank')}, expected {r}")
                check(int(a.get("processes", -1)) == tp, f"{path}: processes {a.get('processes')}, expected {tp}")
                check(int(a["tp"]) == tp, f"{path}: tp {int(a['tp'])}")
                launch = a.get("launch_id", "")
                launch = launch.decode() if isinstance(launch, bytes) else str(launch)
                check(len(launch) == 32 and all(c in "0123456789abcdef" for c in launch),
                      f"{path}: launch_id {launch!r} is not 16 bytes in hex")
                launch_ids.add(launch)
                check(a["status"] == "complete", f"{path}: status {a['status']!r}")
                for k in ["engine", "engine_options", "model", "run_options", "mode", "inject", "probe_level"]:
                    check(a[k] == s.attrs[k], f"{path}: /{k} differs from the one-process run's")
                mine = probes(h)
                check(set(mine) == set(single), f"{path}: probes {sorted(set(mine) ^ set(single))} differ")
                for gp, p in mine.items():
                    groups = sorted(k for k in p if k.startswith("rank"))
                    if not check(groups == [f"rank{r}"], f"{path}{gp}: rank groups {groups}, expected ['rank{r}']"):
                        continue
                    if gp not in single:
                        continue
                    q = single[gp]
                    for k in PROBE_ATTRS:
                        check(same_attr(p.attrs[k], q.attrs[k]), f"{path}{gp}: attribute {k} differs")
                    got, want = p[f"rank{r}"], q[f"rank{r}"]
                    for k in RANK_ATTRS:
                        check(same_attr(got.attrs[k], want.attrs[k]),
                              f"{path}{gp}/rank{r}: {k} {got.attrs[k]!r} vs {want.attrs[k]!r} in one process")
                    check(sorted(got) == sorted(want), f"{path}{gp}/rank{r}: datasets {sorted(got)} vs {sorted(want)}")
                    for d in got:
                        if d in want:
                            x, y = np.asarray(got[d]), np.asarray(want[d])
                            check(x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32)),
                                  f"{path}{gp}/rank{r}/{d}: values differ from the one-process run's")
        check(len(launch_ids) == 1, f"the rank files carry different launch ids: {sorted(launch_ids)}")
    return report("mismatches",
                  f"ok: {tp} rank files, each holds only its rank, equal to {single_path}'s records of that rank")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
