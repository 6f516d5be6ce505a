"""The Python dump package (python/mla_bisect) against the C++ tool: records recomputed from C++ dumps equal the
C++ ones (checksums bit for bit), dumps the Python writer makes read back in the C++ tool as the C++ dumps they copy
(compare --tolerance exact, inspect, per-probe metadata), per-rank files merge both ways, a SIGKILLed capture leaves
a dump both readers read, and bad input is refused with a message naming it.

Run by CTest (py_dump: MLA_BINARY = the mla-bisect binary, PYTHONPATH = python/), or by hand:
    MLA_BINARY=build/mla-bisect PYTHONPATH=python python -m pytest -q -rs tests/py/test_python_dump.py
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

try:
    import h5py  # noqa: F401
    import numpy as np
except ImportError:  # CTest reads this message as a skip (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt)
    pytest.skip("mla_bisect needs numpy and h5py, which this Python lacks", allow_module_level=True)

from mla_bisect import hashing  # noqa: E402
from mla_bisect.dump import DumpError, DumpWriter, read_dump, rank_dump_path  # noqa: E402
from mla_bisect.graph import ProbeSpec, build_graph, parse_hf_config, probe_request  # noqa: E402

BINARY = os.environ.get("MLA_BINARY", "")
if not BINARY or not os.path.exists(BINARY):
    pytest.skip("MLA_BINARY (the mla-bisect binary) is not set", allow_module_level=True)

# No launcher variable of the test's own environment may leak into a child (a CI job under srun has SLURM_PROCID).
LAUNCHER_VARS = ["MLA_RANK", "MLA_WORLD_SIZE", "MLA_LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE", "MASTER_PORT",
                 "MLA_LAUNCH_ID"]
ENV = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
ENV["OMP_WAIT_POLICY"] = "PASSIVE"

# One C++ run per case: the run options a Python rewrite must reproduce.
BASE = ["run", "--probe-level", "full", "--quiet"]
TINY = ["--model", "tiny"]
PREFILL = ["--tokens", "8"]
DECODE = ["--mode", "decode", "--batch", "2", "--context", "40,70"]  # one new token per sequence
CASES = {
    "prefill_tp1": PREFILL,
    "prefill_tp2": PREFILL + ["--tp", "2"],
    "decode_tp2": DECODE + ["--tp", "2"],
    "bf16_decode": DECODE + ["--engine", "reference:precision=bf16"],
    "bf16_tp2": PREFILL + ["--engine", "reference:precision=bf16", "--tp", "2"],
    "layers2_tp2": PREFILL + ["--tp", "2", "--layers", "2"],
}
# A model without q LoRA (q_lora_rank null: the q_proj path), small dims, no rope scaling.
NO_Q_LORA = {"model_type": "deepseek_v2", "hidden_size": 32, "num_attention_heads": 4, "q_lora_rank": None,
             "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
             "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "rope_scaling": None}


def cli(*args, check=None, cwd=None):
    r = subprocess.run([BINARY, *args], capture_output=True, text=True, env=ENV, cwd=cwd, timeout=120)
    if check is not None:
        assert r.returncode == check, f"mla-bisect {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("pydump")


@pytest.fixture(scope="module")
def cpp_dumps(work):
    out = {}
    for name, extra in CASES.items():
        path = str(work / f"cpp_{name}.h5")
        cli(*BASE, *TINY, *extra, "--out", path, check=0)
        out[name] = path
    cfg = work / "noqlora.json"
    cfg.write_text(json.dumps(NO_Q_LORA))
    path = str(work / "cpp_noqlora.h5")
    cli(*BASE, *PREFILL, "--model", str(cfg), "--tp", "2", "--out", path, check=0)
    out["noqlora_tp2"] = path
    # DSA (tiny-dsa: 12 keys a token) in decode, contexts longer than that: the index cache among the inputs.
    path = str(work / "cpp_dsa.h5")
    cli(*BASE, "--model", "tiny-dsa", *DECODE, "--tp", "2", "--out", path, check=0)
    out["dsa_decode_tp2"] = path
    return out


ALL_CASES = list(CASES) + ["noqlora_tp2", "dsa_decode_tp2"]


@pytest.fixture(scope="module")
def cpp_read(cpp_dumps):
    """read_dump of each C++ dump, read once (tests must not change them)."""
    cache = {}

    def get(case):
        if case not in cache:
            cache[case] = read_dump(cpp_dumps[case])
        return cache[case]
    return get


def spec_of(p):
    return ProbeSpec(p.name, p.stage, p.contract, p.shape, p.heads_axis, p.rope_from, p.order)


def close_rel(a, b, rel):
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-30


# ---------------------------------------------------------------------------------------------------------------
# Python recomputes what the C++ recorded
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ALL_CASES)
def test_records_recomputed_from_cpp_dumps(cpp_read, case):
    d = cpp_read(case)
    assert d.complete, d.status
    assert d.probes, "no probes read"
    n_records = 0
    for (layer, name), p in d.probes.items():
        assert sorted(p.ranks) == list(range(d.tp)), f"{name}: ranks {sorted(p.ranks)}"
        for r, rec in p.ranks.items():
            where = f"{case} layer {layer} {name} rank {r}"
            assert rec.level == "full" and rec.data is not None, where
            req = probe_request(spec_of(p), d.tp, r)
            c = hashing.compute_record(rec.data, rec.dtype, req["tokens"], req["heads"], req["col_offset"],
                                       hashing.probe_key(name), rec.level)
            assert c["checksum"] == rec.checksum, f"{where}: checksum {c['checksum']:#x} != {rec.checksum:#x}"
            for k in ("l2", "absmax", "mean", "std"):
                scale = rec.l2 / np.sqrt(rec.data.size) if k == "mean" else 0.0  # mean can cancel to ~0
                assert abs(c[k] - getattr(rec, k)) <= 1e-6 * max(abs(getattr(rec, k)), scale) + 1e-30, \
                    f"{where}: {k} {c[k]!r} vs {getattr(rec, k)!r}"
            assert (c["nan"], c["inf"]) == (rec.nan, rec.inf), where
            np.testing.assert_allclose(c["token_l2"], rec.token_l2, rtol=1e-6, err_msg=where)
            assert (c["head_l2"] is None) == (rec.head_l2 is None), where
            if rec.head_l2 is not None:
                np.testing.assert_allclose(c["head_l2"], rec.head_l2, rtol=1e-6, err_msg=where)
            # Float rounding: float32 results of float64 sums in another order.
            atol = 1e-6 * float(np.max(rec.token_l2)) + 1e-30
            np.testing.assert_allclose(c["sketch"], rec.sketch, rtol=1e-5, atol=atol, err_msg=where)
            n_records += 1
    assert n_records == sum(len(p.ranks) for p in d.probes.values())


def test_checksum_sees_one_changed_bit(cpp_read):
    d = cpp_read("bf16_tp2")
    rec = d.probes[(0, "q_nope")].ranks[1]
    req = probe_request(spec_of(d.probes[(0, "q_nope")]), 2, 1)
    data = rec.data.copy()
    bits = data.view(np.uint32)
    bits.reshape(-1)[5] ^= np.uint32(1 << 16)  # lowest bf16 mantissa bit
    c = hashing.compute_record(data, "bf16", req["tokens"], req["heads"], req["col_offset"],
                               hashing.probe_key("q_nope"), "full")
    assert c["checksum"] != rec.checksum


def test_bit_pattern_ports_match_ieee():
    rng = np.random.default_rng(1)
    v = np.concatenate([rng.standard_normal(4000) * 10.0 ** rng.integers(-9, 6, 4000),
                        [0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e-8, -3e-8, np.inf, -np.inf]]).astype(np.float32)
    with np.errstate(over="ignore"):
        assert np.array_equal(hashing.to_fp16_bits(v), v.astype(np.float16).view(np.uint16))
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert np.array_equal(hashing.to_bf16_bits(v), v.astype(ml_dtypes.bfloat16).view(np.uint16))
    for name, t in (("fp8_e4m3", ml_dtypes.float8_e4m3fn), ("fp8_e5m2", ml_dtypes.float8_e5m2)):
        codes = np.arange(256, dtype=np.uint8)
        want = codes.view(t).astype(np.float32)
        got = hashing.fp8_to_float(codes, name)
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[~np.isnan(got)],
                                                                               want[~np.isnan(want)]), name


# ---------------------------------------------------------------------------------------------------------------
# Python writes what the C++ tool reads as the same dump
# ---------------------------------------------------------------------------------------------------------------

def rewrite(d, dst: str, process_rank=None, launch_id=None, perturb=None):
    """The tensors of dump `d` (read_dump's) written again by DumpWriter (engine python-test)."""
    ro = d.run_options
    w = DumpWriter(dst, config=d.model, mode=ro["mode"], tp=d.tp, engine="python-test",
                   engine_dtype=d.attrs["engine_dtype"], tokens=ro["tokens"], batch=ro["batch"],
                   context=ro["context"], input_norm=ro["input_norm"], layers=ro["layers"], form=ro["form"],
                   process_rank=process_rank, launch_id=launch_id, layer_index=3)
    i = d.inputs
    w.inputs(x=i.x, positions=i.positions, seq_lens=i.seq_lens, context_lens=i.context_lens,
             block_table=i.block_table, kv_cache=i.kv_cache, num_blocks=i.num_blocks, index_cache=i.index_cache)
    for (layer, name), p in d.probes.items():
        for r, rec in p.ranks.items():
            if process_rank is not None and r != process_rank:
                continue
            data = rec.data
            if perturb == name:
                data = data.copy()
                data.reshape(-1)[0] += 1.0
            w.probe(name, data, rank=r, layer=layer, dtype=rec.dtype)
    w.close()
    return d


PROBE_ATTRS = ("order", "stage", "contract", "shape", "heads_axis", "rope_from")


@pytest.mark.parametrize("case", ALL_CASES)
def test_python_rewrite_reads_as_the_cpp_dump(cpp_dumps, cpp_read, work, case):
    src, dst = cpp_dumps[case], str(work / f"py_{case}.h5")
    d = rewrite(cpp_read(case), dst)
    assert not os.path.exists(dst + ".journal")
    e = read_dump(dst)
    assert e.complete and e.attrs["engine"] == "python-test" and e.layer_index == 3
    assert list(e.probes) == list(d.probes)
    for key, p in d.probes.items():
        q = e.probes[key]
        for a in PROBE_ATTRS:
            assert getattr(q, a) == getattr(p, a), f"{case} {key}: {a} {getattr(q, a)} vs {getattr(p, a)}"
        for r, rec in p.ranks.items():
            got = q.ranks[r]
            assert (got.checksum, got.shape, got.dtype) == (rec.checksum, rec.shape, rec.dtype), f"{key} rank {r}"
            assert got.l2 == rec.l2 and got.std == rec.std, f"{key} rank {r}"
    for k in ("x", "positions", "seq_lens", "context_lens", "block_table"):
        assert np.array_equal(getattr(e.inputs, k), getattr(d.inputs, k)), k
    assert (d.inputs.index_cache is not None) == (case == "dsa_decode_tp2")
    if d.inputs.index_cache is not None:
        assert np.array_equal(e.inputs.index_cache, d.inputs.index_cache)
    # The same run as the C++ tool reads it.
    assert json.loads(json.dumps(e.run_options))["tokens"] == d.run_options["tokens"]
    r = cli("compare", dst, src, "--tolerance", "exact", "--brief", check=0)
    assert "PASS" in r.stdout
    r = cli("inspect", dst, check=0)
    assert "python-test" in r.stdout and "status    complete" in r.stdout


def test_records_without_stats_are_computed_from_data(cpp_dumps, cpp_read, work):
    """A producer writing with plain h5py may store the tensor only: both readers compute the rest from it."""
    src = cpp_dumps["decode_tp2"]
    path = str(work / "stripped.h5")
    shutil.copy(src, path)
    with h5py.File(path, "r+") as f:
        for lname in ("layer0",):
            for pname in f[lname]:
                for rname in f[lname][pname]:
                    rg = f[lname][pname][rname]
                    for a in ("l2", "absmax", "mean", "std", "nan", "inf", "checksum"):
                        del rg.attrs[a]
                    for ds in ("token_l2", "head_l2", "sketch"):
                        if ds in rg:
                            del rg[ds]
    d, e = cpp_read("decode_tp2"), read_dump(path)
    for key, p in d.probes.items():
        for r, rec in p.ranks.items():
            got = e.probes[key].ranks[r]
            assert (got.checksum, got.l2, got.std, got.nan) == (rec.checksum, rec.l2, rec.std, rec.nan), key
            np.testing.assert_array_equal(got.token_l2, rec.token_l2)
    cli("compare", path, src, "--tolerance", "exact", "--brief", check=0)


def test_compare_sees_a_changed_python_probe(cpp_dumps, cpp_read, work):
    dst = str(work / "py_perturbed.h5")
    rewrite(cpp_read("prefill_tp2"), dst, perturb="kv_c")
    r = cli("compare", dst, cpp_dumps["prefill_tp2"], "--tolerance", "exact", "--brief")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "kv_c" in r.stdout


def test_python_rank_files_merge(cpp_dumps, cpp_read, work):
    """One process per rank from Python: FILE.rank{r}.h5 each, read as one dump by both readers."""
    src, dsrc = cpp_dumps["decode_tp2"], cpp_read("decode_tp2")
    base = str(work / "pyset.h5")
    for r in (0, 1):
        rewrite(dsrc, base, process_rank=r, launch_id="launch-a")
    assert os.path.exists(rank_dump_path(base, 0)) and os.path.exists(rank_dump_path(base, 1))
    assert not os.path.exists(base)
    one = read_dump(rank_dump_path(base, 1))
    assert one.process_rank == 1 and one.processes == 2 and one.launch_id == "launch-a"
    assert all(list(p.ranks) == [1] for p in one.probes.values())
    d = read_dump(base)
    assert d.complete and d.parts == [rank_dump_path(base, 0), rank_dump_path(base, 1)]
    assert all(sorted(p.ranks) == [0, 1] for p in d.probes.values())
    cli("compare", base, src, "--tolerance", "exact", "--brief", check=0)
    r = cli("inspect", rank_dump_path(base, 1), check=0)
    assert "rank 1 of 2" in r.stdout
    # A rank file of another launch: both readers refuse the set, naming the launch.
    rewrite(dsrc, base, process_rank=1, launch_id="launch-b")
    with pytest.raises(DumpError, match="launch"):
        read_dump(base)
    r = cli("inspect", base, check=2)
    assert "launch" in r.stderr


def test_cpp_rank_files_merge(work):
    base, rv = str(work / "cppset.h5"), str(work / "rendezvous")
    run = [*BASE, *TINY, *PREFILL, "--tp", "2", "--out", base, "--rendezvous", rv]
    cli(*run, "--rank", "0", check=0)
    cli(*run, "--rank", "1", check=0)
    d = read_dump(base)
    assert d.complete and d.processes == 2 and d.process_rank == -1 and len(d.parts) == 2
    assert all(sorted(p.ranks) == [0, 1] for p in d.probes.values())
    one = read_dump(rank_dump_path(base, 0))
    assert one.process_rank == 0 and one.launch_id == d.launch_id != ""


# ---------------------------------------------------------------------------------------------------------------
# Crash safety
# ---------------------------------------------------------------------------------------------------------------

KILLED = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from mla_bisect.dump import DumpWriter
    path, n = sys.argv[1], int(sys.argv[2])
    cfg = {"model_type": "deepseek_v3", "hidden_size": 64, "num_attention_heads": 8, "q_lora_rank": 48,
           "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12}
    w = DumpWriter(path, config=cfg, tokens=4, engine="killed-test", engine_dtype="fp32")
    rng = np.random.default_rng(0)
    w.inputs(x=rng.standard_normal((4, 64)).astype(np.float32))
    for name, shape in [("x", (4, 64)), ("q_a", (4, 48)), ("q_c", (4, 48)), ("q_nope", (4, 8, 16))][:n]:
        w.probe(name, rng.standard_normal(shape).astype(np.float32))
    os.kill(os.getpid(), signal.SIGKILL)
""")


def killed_capture(work, name, n):
    path = str(work / name)
    env = dict(ENV, PYTHONPATH=os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""),
                                                            os.path.dirname(hashing.__file__) + "/.."] if p))
    r = subprocess.run([sys.executable, "-c", KILLED, path, str(n)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not os.path.exists(path) and os.path.exists(path + ".journal")
    return path


def test_killed_capture_reads_in_both_readers(work):
    path = killed_capture(work, "killed.h5", 3)
    d = read_dump(path)  # in memory: the journal stays
    assert d.status == "stopped: after layer 0 probe q_c rank 0", d.status
    assert list(d.probes) == [(0, "x"), (0, "q_a"), (0, "q_c")]
    assert d.inputs is not None and d.inputs.x.shape == (4, 64)
    assert d.last_stage == ["layer 0 stage q_a_norm"]
    assert os.path.exists(path + ".journal")
    # The C++ reader folds the journal into FILE.h5 (a stopped dump is still a readable one: inspect exits 0).
    r = cli("inspect", path, check=0)
    assert "stopped: after layer 0 probe q_c rank 0" in r.stdout and "killed-test" in r.stdout
    assert os.path.exists(path) and not os.path.exists(path + ".journal")
    e = read_dump(path)
    assert e.status == d.status and list(e.probes) == list(d.probes)
    assert e.probes[(0, "q_c")].ranks[0].checksum == d.probes[(0, "q_c")].ranks[0].checksum
    # compare of a stopped dump: exit 3.
    cli("compare", path, path, "--tolerance", "exact", "--brief", check=3)


def test_killed_before_the_first_probe(work):
    path = killed_capture(work, "killed0.h5", 0)
    assert read_dump(path).status == "stopped: before the first probe"
    r = cli("inspect", path, check=0)
    assert "stopped: before the first probe" in r.stdout


def test_torn_last_record_keeps_the_rest(work):
    path = killed_capture(work, "torn.h5", 4)
    with open(path + ".journal", "r+b") as f:  # the last record cut in the middle, as a full disk would leave it
        f.truncate(os.path.getsize(path + ".journal") - 100)
    d = read_dump(path)
    assert d.status.startswith("stopped: after layer 0 probe q_c rank 0 (journal:"), d.status
    assert "dropped" in d.status
    r = cli("inspect", path, check=0)
    assert "stopped: after layer 0 probe q_c rank 0" in r.stdout


HEADER_ONLY = textwrap.dedent("""
    import os, signal, sys
    from mla_bisect import journal as jr
    from mla_bisect.dump import DumpWriter
    path, meta_from = sys.argv[1], sys.argv[2]
    cfg = {"model_type": "deepseek_v2", "hidden_size": 32, "num_attention_heads": 4, "q_lora_rank": None,
           "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
    w = DumpWriter(meta_from, config=cfg, tokens=2, engine="headerless-test", engine_dtype="fp32")
    meta = w.meta
    w.close()
    j = jr.Writer(jr.journal_path(path))     # the header written to the writer's temporary file, not yet renamed
    j.append(jr.HEADER, jr.encode_header(meta, None))
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_journal_without_a_header_reads_as_stopped(work):
    """A writer killed before its header reached the journal: a 0-byte FILE.h5.journal (as earlier writers left
    it) or an empty temporary file reads as stopped, nothing else known, in both readers (inspect exits 0 on a
    stopped dump, compare 3); a header left in the dead writer's temporary file (FILE.h5.journal.tmp.PID) is folded
    as the journal ("stopped: before the first probe"). Garbage where the header belongs stays an error (exit 2)."""
    from mla_bisect import journal as jr
    from mla_bisect.dump import recover_dump
    d = work / "headerless"
    d.mkdir()
    empty = str(d / "empty.h5")
    open(empty + ".journal", "wb").close()
    etemp = str(d / "etemp.h5")
    open(jr.temp_path(etemp + ".journal", 2 ** 22 + 12345), "wb").close()  # no such process: its writer is gone
    for path, what in ((empty, f"{empty}.journal is empty"), (etemp, "holds no header")):
        got = read_dump(path)
        assert got.status.startswith("stopped: before the run wrote its header (") and what in got.status, got.status
        assert not got.complete and got.probes == {} and got.inputs is None and got.model is None
        assert not recover_dump(path) and not os.path.exists(path)  # nothing to fold: the files stay as they are
        r = cli("inspect", path, check=0)
        assert "stopped: before the run wrote its header" in r.stdout, r.stdout
        cli("compare", path, path, "--brief", check=3)
    # The header only in the temporary file of a writer killed before the rename.
    temp = str(d / "temp.h5")
    env = dict(ENV, PYTHONPATH=os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""),
                                                            os.path.dirname(hashing.__file__) + "/.."] if p))
    r = subprocess.run([sys.executable, "-c", HEADER_ONLY, temp, str(d / "meta.h5")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    temps = jr.abandoned_temps(temp + ".journal")
    assert len(temps) == 1 and not os.path.exists(temp + ".journal") and not os.path.exists(temp)
    got = read_dump(temp)
    assert got.status == "stopped: before the first probe" and got.attrs["engine"] == "headerless-test"
    assert got.last_stage == ["not started"] and os.path.exists(temps[0])  # read_dump writes nothing
    r = cli("inspect", temp, check=0)
    assert "stopped: before the first probe" in r.stdout and "headerless-test" in r.stdout
    assert os.path.exists(temp) and not os.path.exists(temps[0])  # the C++ reader folded it into FILE.h5
    assert read_dump(temp).status == "stopped: before the first probe"
    cli("compare", temp, temp, "--brief", check=3)
    # The same through the Python recovery.
    r = subprocess.run([sys.executable, "-c", HEADER_ONLY, str(d / "temp2.h5"), str(d / "meta2.h5")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert recover_dump(str(d / "temp2.h5")) and not jr.abandoned_temps(str(d / "temp2.h5.journal"))
    assert read_dump(str(d / "temp2.h5")).attrs["engine"] == "headerless-test"
    # Bytes that are not a header: refused by both.
    bad = str(d / "bad.h5")
    with open(bad + ".journal", "wb") as f:
        f.write(b"not a journal record at all")
    with pytest.raises(DumpError, match="no intact header record"):
        read_dump(bad)
    cli("inspect", bad, check=2)


def test_live_writer_reads_as_running(work):
    path = str(work / "live.h5")
    w = DumpWriter(path, config=NO_Q_LORA, tokens=2, engine_dtype="fp32")
    w.probe("x", np.ones((2, 32), np.float32))
    assert read_dump(path).status == "running: after layer 0 probe x rank 0"
    r = cli("inspect", path, check=0)
    assert "running: after layer 0 probe x rank 0" in r.stdout and "inputs    none" in r.stdout
    # Inputs given after a probe: the journal's header is swapped for one that carries them, the probe kept.
    w.inputs(x=np.full((2, 32), 0.5, np.float32))
    d = read_dump(path)
    assert d.inputs is not None and d.inputs.x[0, 0] == 0.5 and list(d.probes) == [(0, "x")]
    w.probe("kv_c", np.ones((2, 16), np.float32))
    w.close()
    d = read_dump(path)
    assert d.complete and list(d.probes) == [(0, "x"), (0, "kv_c")] and d.inputs.positions.tolist() == [0, 1]
    r = cli("inspect", path, check=0)
    assert "x [2,32]" in r.stdout


def test_python_inputs_run_in_cpp(work):
    """Inputs of sequences of different lengths with a paged cache (batch 1 of T tokens, the real layout in
    /inputs): the C++ reference runs on them (`run --input`)."""
    cfg = work / "noqlora_inputs.json"
    cfg.write_text(json.dumps(NO_Q_LORA))
    path, ref = str(work / "ragged.h5"), str(work / "ragged_ref.h5")
    rng = np.random.default_rng(0)
    w = DumpWriter(path, config=NO_Q_LORA, mode="chunked", tokens=5, engine_dtype="fp32")
    w.inputs(x=rng.standard_normal((5, 32)).astype(np.float32), seq_lens=[2, 3], context_lens=[70, 20],
             block_table=np.array([[2, 0, 3], [1, 3, 3]]), kv_cache=rng.standard_normal((4, 64, 20)).astype(np.float32))
    w.close()
    d = read_dump(path)
    assert d.inputs.positions.tolist() == [70, 71, 20, 21, 22] and d.run_options["context"] == []
    cli("run", "--input", path, "--model", str(cfg), "--out", ref, "--quiet", check=0)
    r = cli("inspect", ref, check=0)
    assert "2 sequences (new 2,3, context 70,20)" in r.stdout


def test_cpp_journal_reads_in_python(work):
    """A C++ run that crashed leaves its journal; the Python reader folds it as the C++ reader does."""
    path = str(work / "crashed.h5")
    r = cli(*BASE, *TINY, *PREFILL, "--inject", "crash-at:rope", "--out", path)
    assert r.returncode != 0 and os.path.exists(path + ".journal") and not os.path.exists(path)
    d = read_dump(path)
    assert d.status == "stopped: after layer 0 probe kv_c_norm rank 0", d.status
    assert d.last_stage == ["layer 0 stage rope"] and d.inputs.x.shape == (8, 64)
    r = cli("inspect", path, check=0)
    assert d.status in r.stdout


def test_exception_closes_the_dump_as_stopped(work):
    path = str(work / "raised.h5")
    with pytest.raises(RuntimeError):
        with DumpWriter(path, config=NO_Q_LORA, tokens=2, engine_dtype="fp32") as w:
            w.probe("x", np.ones((2, 32), np.float32))
            raise RuntimeError("model blew up")
    d = read_dump(path)
    assert d.status == "stopped: after layer 0 probe x rank 0 (RuntimeError: model blew up)"


# ---------------------------------------------------------------------------------------------------------------
# Dtypes and ranks out of order
# ---------------------------------------------------------------------------------------------------------------

def test_low_precision_tensors_keep_their_dtype(work):
    torch = pytest.importorskip("torch")
    path = str(work / "dtypes.h5")
    w = DumpWriter(path, config=NO_Q_LORA, tokens=3, engine_dtype="bf16")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 32, generator=g)
    w.probe("x", x.to(torch.bfloat16))
    w.probe("kv_c", torch.randn(3, 16, generator=g).to(torch.float16))
    e4 = (torch.randn(3, 4, generator=g) * 8).to(torch.float8_e4m3fn)
    w.probe("k_pe", e4)
    e5 = (torch.randn(3, 4, generator=g) * 8).to(torch.float8_e5m2)
    w.probe("k_pe_rope", e5)
    w.close()
    r = cli("inspect", path, check=0)
    assert all(dt in r.stdout for dt in ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2")), r.stdout
    d = read_dump(path)
    recs = {n: d.probes[(0, n)].ranks[0] for n in ("x", "kv_c", "k_pe", "k_pe_rope")}
    assert [r.dtype for r in recs.values()] == ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"]
    # bf16 / fp16: the C++ definition over the float32 values (what a C++ engine holding them records).
    bits = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).reshape(3, -1)
    assert recs["x"].checksum == hashing.checksum(bits)
    assert np.array_equal(recs["x"].data, x.to(torch.bfloat16).float().numpy())
    # fp8: the checksum covers the 8-bit codes; the data is their exact float32 values.
    for name, t in (("k_pe", e4), ("k_pe_rope", e5)):
        codes = t.view(torch.uint8).numpy().reshape(3, -1)
        assert recs[name].checksum == hashing.checksum(codes)
        assert recs[name].checksum != hashing.checksum(t.float().numpy().view(np.uint32))
        assert np.array_equal(recs[name].data, t.float().numpy())


def test_ranks_recorded_out_of_order_are_kept_in_rank_order(cpp_dumps, cpp_read, work):
    src = cpp_read("prefill_tp2")
    path = str(work / "outoforder.h5")
    ro = src.run_options
    w = DumpWriter(path, config=src.model, tp=2, tokens=ro["tokens"], engine_dtype="fp32")
    for r in (1, 0):  # rank-major: every probe of rank 1 first
        for (layer, name), p in src.probes.items():
            w.probe(name, p.ranks[r].data, rank=r)
    w.close()
    cli("compare", path, cpp_dumps["prefill_tp2"], "--tolerance", "exact", "--brief", check=0)
    w = DumpWriter(str(work / "lonely.h5"), config=src.model, tp=2, tokens=ro["tokens"], engine_dtype="fp32")
    w.probe("kv_c", src.probes[(0, "kv_c")].ranks[1].data, rank=1)
    with pytest.warns(UserWarning, match="without their lower ranks"):
        w.close()
    assert read_dump(str(work / "lonely.h5")).status.startswith("stopped: probes recorded without their lower")


def _same_dump(a, b, where):
    """Two Dumps equal in everything read_dump gives: attributes, status, inputs and every record, arrays bit for
    bit."""
    def same(x, y, what):
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x is not None and y is not None, f"{where}: {what}"
            x, y = np.asarray(x), np.asarray(y)
            assert x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes(), f"{where}: {what}"
        else:
            assert x == y, f"{where}: {what}: {x!r} vs {y!r}"
    same(a.attrs, b.attrs, "attrs")
    same(a.status, b.status, "status")
    same(a.last_stage, b.last_stage, "last_stage")
    for k in ("x", "positions", "seq_lens", "context_lens", "block_table", "num_blocks", "kv_cache", "index_cache"):
        x, y = getattr(a.inputs, k), getattr(b.inputs, k)
        if x is None or y is None:
            assert x is None and y is None, f"{where}: inputs {k}"
        else:
            same(x, y, f"inputs {k}")
    assert list(a.probes) == list(b.probes), where
    for key, p in a.probes.items():
        q = b.probes[key]
        for k in PROBE_ATTRS + ("engine_dtype",):
            same(getattr(p, k), getattr(q, k), f"{key} {k}")
        assert list(p.ranks) == list(q.ranks), f"{where}: {key}"
        for r, rec in p.ranks.items():
            for k, v in rec.__dict__.items():
                w = getattr(q.ranks[r], k)
                if v is None or w is None:
                    assert v is None and w is None, f"{where}: {key} rank {r} {k}"
                else:
                    same(v, w, f"{key} rank {r} {k}")


@pytest.mark.parametrize("hold", ["all", "some", "none"])
def test_close_writes_what_the_journal_folds_to(cpp_read, work, monkeypatch, hold):
    """close() writes FILE.h5 from what the writer kept (records, and their data held in memory up to HOLD_BYTES,
    read back from the journal past it) instead of reading the journal back: the file equals the one the journal
    folds to, bit for bit in every record, with ranks out of order, a probe recorded twice, probes before inputs()
    (whose header swap moves every record) and several layers."""
    import mla_bisect.dump_write as dw
    from mla_bisect import journal as jr
    from mla_bisect.dump_journal import _fold
    monkeypatch.setattr(dw, "HOLD_BYTES", {"all": dw.HOLD_BYTES, "some": 6000, "none": 0}[hold])
    folded = {}
    write_h5 = dw.write_h5

    def spy(d, path):
        jp = path + ".journal"
        fd = os.open(jp, os.O_RDONLY)
        try:
            folded[path] = _fold(jr.scan_fd(fd), path, jp, "finish", finish_status=d.status, copy=True)
        finally:
            os.close(fd)
        return write_h5(d, path)

    monkeypatch.setattr(dw, "write_h5", spy)
    for case in ("layers2_tp2", "dsa_decode_tp2", "bf16_decode"):
        src = cpp_read(case)
        ro = src.run_options
        path = str(work / f"fold_{case}_{hold}.h5")
        w = DumpWriter(path, config=src.model, mode=ro["mode"], tp=src.tp, engine="python-test",
                       engine_dtype=src.attrs["engine_dtype"], tokens=ro["tokens"], batch=ro["batch"],
                       context=ro["context"], input_norm=ro["input_norm"], layers=ro["layers"], form=ro["form"])
        items = list(src.probes.items())
        first = items[0]
        w.probe(first[0][1], first[1].ranks[0].data, rank=0, layer=first[0][0], dtype=first[1].ranks[0].dtype,
                level="sketch")  # before inputs(), and recorded again below at level full
        i = src.inputs
        w.inputs(x=i.x, positions=i.positions, seq_lens=i.seq_lens, context_lens=i.context_lens,
                 block_table=i.block_table, kv_cache=i.kv_cache, num_blocks=i.num_blocks, index_cache=i.index_cache)
        for (layer, name), p in items:
            for r in sorted(p.ranks, reverse=True):  # the higher rank first: it waits for the lower one
                w.probe(name, p.ranks[r].data, rank=r, layer=layer, dtype=p.ranks[r].dtype)
        assert bool(w._spilled) == (hold != "all") and (w._held_bytes > 0) == (hold != "none")
        held, mine = dw._held[0], w._held_bytes
        w.close()
        assert dw._held[0] == held - mine and w._held_bytes == 0 and not w._written  # the memory given back
        assert path in folded and not os.path.exists(path + ".journal")
        fold_path = str(work / f"fold_{case}_{hold}.journal.h5")
        write_h5(folded.pop(path), fold_path)
        got, want = read_dump(path), read_dump(fold_path)
        assert got.complete and len(got.probes) == len(items) and got.inputs is not None
        want.path = got.path
        _same_dump(got, want, f"{case} hold {hold}")
        cli("compare", path, fold_path, "--tolerance", "exact", "--brief", check=0)


def test_large_records_read_back_alike_in_both_readers(work):
    """Records of 1 MiB and more (their CRC-32 computed beside the write and written after the payload, their
    writeback started at once; the HDF5 file's writeback started as it is written): the live journal scans intact
    with every CRC good, and the finished file reads the same in both readers."""
    from mla_bisect import journal as jr
    path = str(work / "large.h5")
    T = 9000  # x: 9000 x 32 float32 = 1.1 MiB
    rng = np.random.default_rng(5)
    x = rng.standard_normal((T, 32)).astype(np.float32)
    w = DumpWriter(path, config=NO_Q_LORA, tokens=T, engine_dtype="fp32")
    w.inputs(x=x)
    w.probe("x", x)
    w.probe("q_nope", rng.standard_normal((T, 4, 8)).astype(np.float32))
    fd = os.open(path + ".journal", os.O_RDONLY)
    try:
        sc = jr.scan_fd(fd)
        assert sc.problem == "" and sc.good_bytes == sc.total_bytes and len(sc.records) == 5  # header, 2 stage markers, 2 probes
        assert max(len(r.payload) for r in sc.records) > (1 << 20)
    finally:
        os.close(fd)
    assert read_dump(path).status == "running: after layer 0 probe q_nope rank 0"
    w.close()
    d = read_dump(path)
    assert d.complete and np.array_equal(d.probes[(0, "x")].ranks[0].data, x) and np.array_equal(d.inputs.x, x)
    r = cli("inspect", path, check=0)
    assert "status    complete" in r.stdout and "q_nope" in r.stdout


def test_writers_open_together_share_the_memory_budget(work, monkeypatch):
    """HOLD_BYTES bounds the data every open writer of the process keeps in memory together (a whole-model capture
    keeps a writer a layer open): past it records are read back from the journal at close; a closed writer gives
    its share back."""
    import mla_bisect.dump_write as dw
    monkeypatch.setattr(dw, "HOLD_BYTES", dw._held[0] + 3000)
    x = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)  # 2048 bytes
    paths = [str(work / f"budget{i}.h5") for i in range(3)]
    a = DumpWriter(paths[0], config=NO_Q_LORA, tokens=16, engine_dtype="fp32")
    b = DumpWriter(paths[1], config=NO_Q_LORA, tokens=16, engine_dtype="fp32")
    a.probe("x", x)
    b.probe("x", x + 1)
    assert a._held_bytes == 2048 and b._held_bytes == 0 and b._spilled
    a.close()
    c = DumpWriter(paths[2], config=NO_Q_LORA, tokens=16, engine_dtype="fp32")
    c.probe("x", x + 2)
    assert c._held_bytes == 2048
    b.close()
    c.close()
    for i, p in enumerate(paths):
        assert np.array_equal(read_dump(p).probes[(0, "x")].ranks[0].data, x + i)


# ---------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------

def test_bad_input_is_refused_with_what_and_where(cpp_read, work):
    tiny = cpp_read("prefill_tp2").model
    w = DumpWriter(str(work / "bad.h5"), config=tiny, tp=2, tokens=8, engine_dtype="fp32")
    with pytest.raises(ValueError, match=r"probe 'q_nope' layer 0 rank 1: shape \[8, 8, 16\], expected the rank's "
                                         r"local shape \[8, 4, 16\] \(heads probe \[8, 8, 16\] at tp 2\)"):
        w.probe("q_nope", np.zeros((8, 8, 16), np.float32), rank=1)
    with pytest.raises(ValueError, match=r"unknown probe 'q_proj_out'.*probes: x, q_a, q_c"):
        w.probe("q_proj_out", np.zeros((8, 48), np.float32), rank=0)
    with pytest.raises(ValueError, match="rank 2 outside tp 2"):
        w.probe("x", np.zeros((8, 64), np.float32), rank=2)
    with pytest.raises(ValueError, match="rank= is required at tp 2"):
        w.probe("x", np.zeros((8, 64), np.float32))
    with pytest.raises(ValueError, match=r"inputs: x: shape \[7, 64\], expected \[8, 64\]"):
        w.inputs(x=np.zeros((7, 64), np.float32))
    with pytest.raises(ValueError, match="kv_cache is required"):
        DumpWriter(str(work / "bad3.h5"), config=NO_Q_LORA, mode="decode", tokens=1, context=5).inputs(
            x=np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError, match="dtype int32 is not supported"):
        w.probe("x", np.zeros((8, 64), np.int32), rank=0)
    # Leading axes that multiply to T are accepted ([B, S, ...]).
    w.probe("q_nope", np.zeros((2, 4, 4, 16), np.float32), rank=0)
    w.close()
    llama = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8}
    with pytest.raises(ValueError, match="model_type 'llama' is not an MLA model"):
        DumpWriter(str(work / "bad2.h5"), config=llama, tokens=4)
    with pytest.raises(ValueError, match="missing field 'v_head_dim'"):
        DumpWriter(str(work / "bad2.h5"), config={k: v for k, v in NO_Q_LORA.items() if k != "v_head_dim"}, tokens=4)
    with pytest.raises(ValueError, match="4 attention heads, which tp 3 does not divide"):
        DumpWriter(str(work / "bad2.h5"), config=NO_Q_LORA, tp=3, tokens=4)
    with pytest.raises(ValueError, match="common launch id"):
        DumpWriter(str(work / "bad2.h5"), config=NO_Q_LORA, tp=2, tokens=4, process_rank=1)
    assert not os.path.exists(str(work / "bad2.h5.journal"))
    with pytest.raises(DumpError, match="no such file"):
        read_dump(str(work / "absent.h5"))
    (work / "foreign.h5").write_bytes(b"not hdf5")
    with pytest.raises(DumpError, match="not an HDF5 file"):
        read_dump(str(work / "foreign.h5"))


def test_graph_port_matches_cpp_metadata(cpp_read):
    """build_graph of the Python port lists the probes of every C++ dump, in order, with the same metadata."""
    for case in ALL_CASES:
        d = cpp_read(case)
        ro = d.run_options
        g = build_graph(parse_hf_config(d.model), ro["tokens"] * ro["batch"], ro["mode"], ro["form"],
                        ro["input_norm"] or ro["layers"] > 1, keys=max(ro["context"], default=0) + ro["tokens"])
        layer0 = [p for (layer, _), p in d.probes.items() if layer == 0]
        assert [p.name for p in layer0] == g.names, case
        for p in layer0:
            s = g.find(p.name)
            assert (s.order, s.stage, s.contract, s.shape, s.heads_axis, s.rope_from) == \
                (p.order, p.stage, p.contract, p.shape, p.heads_axis, p.rope_from), f"{case} {p.name}"
    assert "q_a" not in build_graph(parse_hf_config(NO_Q_LORA), 4).names


@pytest.fixture(scope="module", autouse=True)
def _cleanup(work):
    yield
    shutil.rmtree(work, ignore_errors=True)


def test_weights_group_holds_the_checkpoint_shards(work):
    """/weights of a C++ run read with h5py alone: each rank's record of each weight is that rank's block of the
    checkpoint tensor written by `safetensors` (rows of q_b_proj and kv_b_proj, columns of o_proj, whole otherwise),
    bit for bit; norms are one row; the package reader gathers the same."""
    from safetensors.numpy import save_file
    cfg = {"model_type": "deepseek_v3", "hidden_size": 32, "num_attention_heads": 4, "q_lora_rank": 24,
           "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
           "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "rope_scaling": None, "num_hidden_layers": 1}
    H, N, Lq, L, P, R, V = 32, 4, 24, 16, 8, 4, 8
    rng = np.random.default_rng(11)

    def bf16_exact(*shape):  # float32 values a bf16 engine and the FP32 reference hold alike
        a = rng.standard_normal(shape).astype(np.float32)
        return (a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)

    pre = "model.layers.0.self_attn."
    t = {"model.layers.0.input_layernorm.weight": bf16_exact(H), pre + "q_a_proj.weight": bf16_exact(Lq, H), pre + "q_a_layernorm.weight": bf16_exact(Lq),
         pre + "q_b_proj.weight": bf16_exact(N * (P + R), Lq), pre + "kv_a_proj_with_mqa.weight": bf16_exact(L + R, H),
         pre + "kv_a_layernorm.weight": bf16_exact(L), pre + "kv_b_proj.weight": bf16_exact(N * (P + V), L),
         pre + "o_proj.weight": bf16_exact(H, N * V)}
    ckpt = os.path.join(work, "ckpt")
    os.makedirs(ckpt)
    save_file(t, os.path.join(ckpt, "model.safetensors"))
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        json.dump(cfg, f)
    out = os.path.join(work, "w.h5")
    cli("run", "--weights", ckpt, "--tp", "2", "--tokens", "4", "--probe-level", "full", "--quiet", "--out", out,
        check=0)
    blocks = {"q_b_proj": 0, "kv_b_proj": 0, "o_proj": 1}
    with h5py.File(out, "r") as f:
        assert sorted(f["weights/layer0"].keys()) == sorted(k.split(".")[-2] for k in t)
        for key, want in t.items():
            name = key.split(".")[-2]
            g = f["weights/layer0/" + name]
            want = want.reshape(1, -1) if want.ndim == 1 else want
            assert list(g.attrs["shape"]) == list(want.shape), name
            for r in range(2):
                got = g[f"rank{r}/data"][...]
                axis = blocks.get(name)
                if axis is None:
                    part = want
                else:
                    n = want.shape[axis] // 2
                    part = want[r * n:(r + 1) * n] if axis == 0 else want[:, r * n:(r + 1) * n]
                assert got.dtype == np.float32 and np.array_equal(got, part), f"{name} rank {r}"
    d = read_dump(out)
    assert sorted(n for (_, n) in d.weights) == sorted(k.split(".")[-2] for k in t)
    assert d.weights[(0, "q_b_proj")].contract == "rows" and d.weights[(0, "o_proj")].contract == "columns"


def test_a_weight_record_with_its_l2_alone_edited_is_refused(work, tmp_path):
    """A weight record's l2 changed by 10% while its rows (token_l2) are left: the record's norms are no longer of
    one tensor. compare and inspect refuse it (exit 2, naming the record) instead of passing on the rows."""
    d = tmp_path
    a, b = str(d / "a.h5"), str(d / "b.h5")
    for out in (a, b):
        cli("run", "--model", "tiny", "--tokens", "4", "--quiet", "--no-table", "--out", out, check=0)
    assert cli("compare", "--brief", a, b).returncode == 0
    with h5py.File(b, "r+") as f:
        g = f["weights/layer0/q_a_proj/rank0"]
        assert "data" not in g and "token_l2" in g, "the default weight record is rows and stats, no tensor"
        rows = np.sqrt(np.sum(g["token_l2"][...].astype(np.float64) ** 2))
        assert abs(g.attrs["l2"] - rows) <= 1e-4 * rows, "the writer's l2 and rows agree"
        g.attrs["l2"] = g.attrs["l2"] * 1.1
    for cmd in (["compare", "--brief", a, b], ["inspect", b]):
        r = cli(*cmd)
        assert r.returncode == 2, f"{cmd}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        msg = r.stdout + r.stderr
        assert "/weights/layer0/q_a_proj/rank0: l2" in msg and "disagrees with its token_l2" in msg, msg
