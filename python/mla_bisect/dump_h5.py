"""The dump as an HDF5 file (docs/dump-format.md): write_h5 writes a Dump in the C++ writer's layout and attribute
types (probes/dump_write.cpp), _read_h5 reads and checks one file as the C++ reader does (probes/dump_read.cpp).
h5py is imported on first use."""
import json
import os
import sys
from typing import List, Tuple

import numpy as np

from . import hashing
from . import journal as jr
from .dump_types import FORMAT, READ_SCHEMA_VERSIONS, SCHEMA_VERSION, DumpError, Dump, Inputs, Probe, Record
from .graph import ProbeSpec, probe_request


class _JournalData:
    """A record's float32 data left in the journal (at byte `offset` of the file open at `fd`): write_h5 reads it
    into a buffer it reuses from record to record, then lets the journal's cached pages of it go (they are on the
    disk: close() fsynced the journal), so that the HDF5 file's pages reuse them."""

    def __init__(self, fd: int, offset: int, shape: Tuple[int, ...]):
        self.fd, self.offset, self.shape = fd, offset, tuple(shape)
        self.size = int(np.prod(self.shape))

    def read(self, scratch: List[np.ndarray]) -> np.ndarray:
        if scratch[0].size < self.size:
            scratch[0] = np.empty(self.size, dtype=np.float32)
        out = scratch[0][:self.size]
        view, off = memoryview(out).cast("B"), self.offset
        while view:
            n = os.preadv(self.fd, [view], off)
            if n <= 0:
                raise DumpError(f"the dump journal ends at byte {off}, inside the record data at byte {self.offset}")
            view, off = view[n:], off + n
        return out.reshape(self.shape) if _LITTLE else out.byteswap().reshape(self.shape)

    def done(self) -> None:
        try:
            os.posix_fadvise(self.fd, self.offset, 4 * self.size, os.POSIX_FADV_DONTNEED)
        except (AttributeError, OSError):
            pass


_LITTLE = sys.byteorder == "little"


def _h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover
        raise ImportError("mla_bisect.dump needs h5py (pip install h5py)") from e
    return h5py


def _json_text(v) -> str:
    return "null" if v is None else json.dumps(v, separators=(",", ":"), default=str)


def write_h5(d: Dump, path: str) -> None:
    """Writes `d` as FILE.h5 atomically (a temp file in the same directory, fsync, rename), in the C++ writer's
    layout and attribute types (probes/dump_write.cpp write_file). The file's writeback starts as its data is
    written, so that the fsync finds little left to do."""
    h5py = _h5py()
    tmp = f"{path}.tmp.{os.getpid()}"
    a = d.attrs
    try:
        with h5py.File(tmp, "w") as f:
            fa = f.attrs
            fa["format"] = FORMAT
            fa["schema_version"] = np.int64(SCHEMA_VERSION)
            for k in ("tool_version", "git_sha", "created_utc", "engine", "engine_options", "engine_dtype", "device"):
                fa[k] = str(a.get(k, ""))
            fa["model"] = _json_text(a.get("model"))
            fa["run_options"] = _json_text(a.get("run_options"))
            fa["tp"] = np.int64(a.get("tp", 1))
            fa["mode"] = str(a.get("mode", ""))
            fa["seed"] = np.uint64(a.get("seed", 0))
            for k in ("inject", "probe_level", "command"):
                fa[k] = str(a.get(k, ""))
            if int(a.get("processes", 0)) > 0:
                fa["process_rank"] = np.int64(a["process_rank"])
                fa["processes"] = np.int64(a["processes"])
                fa["launch_id"] = str(a.get("launch_id", ""))
            if a.get("layer_index") is not None:
                fa["layer_index"] = np.int64(a["layer_index"])
            if a.get("kv_cache_dtype"):
                fa["kv_cache_dtype"] = str(a["kv_cache_dtype"])
                fa["kv_cache_scale"] = np.float64(a["kv_cache_scale"])
            fa["status"] = d.status
            fa["last_stage"] = json.dumps(list(d.last_stage), separators=(",", ":"))
            if d.inputs is not None:
                i = d.inputs
                g = f.create_group("inputs")
                g.create_dataset("x", data=np.asarray(i.x, dtype=np.float32))
                g.create_dataset("positions", data=np.asarray(i.positions, dtype=np.int32))
                g.create_dataset("seq_lens", data=np.asarray(i.seq_lens, dtype=np.int32))
                g.create_dataset("context_lens", data=np.asarray(i.context_lens, dtype=np.int32))
                g.create_dataset("block_table", data=np.asarray(i.block_table, dtype=np.int32))
                g.attrs["num_blocks"] = np.int64(i.num_blocks)
                if i.kv_cache is not None:
                    g.create_dataset("kv_cache", data=np.asarray(i.kv_cache, dtype=np.float32))
                if i.index_cache is not None:
                    g.create_dataset("index_cache", data=np.asarray(i.index_cache, dtype=np.float32))
            try:  # the file descriptor of HDF5's default (sec2) driver: its writeback starts as datasets are written
                fd = f.id.get_vfd_handle()
            except Exception:  # noqa: BLE001 - another driver: the fsync below does it all
                fd = -1
            unsynced = 0
            scratch = [np.empty(0, dtype=np.float32)]
            for p in d.probes.values():
                lg = f.require_group(f"layer{p.layer}")
                g = lg.create_group(p.name)
                g.attrs["order"] = np.int64(p.order)
                g.attrs["stage"] = p.stage
                g.attrs["contract"] = p.contract
                g.attrs["shape"] = np.asarray(p.shape, dtype=np.int64)
                g.attrs["engine_dtype"] = p.engine_dtype
                g.attrs["heads_axis"] = np.int64(p.heads_axis)
                g.attrs["rope_from"] = np.int64(p.rope_from)
                for r, rec in p.ranks.items():
                    rg = g.create_group(f"rank{r}")
                    for k in ("l2", "absmax", "mean", "std"):
                        rg.attrs[k] = np.float64(getattr(rec, k))
                    rg.attrs["nan"] = np.int64(rec.nan)
                    rg.attrs["inf"] = np.int64(rec.inf)
                    rg.attrs["checksum"] = np.uint64(rec.checksum)
                    rg.attrs["level"] = rec.level
                    rg.attrs["shape"] = np.asarray(rec.shape, dtype=np.int64)
                    rg.attrs["dtype"] = rec.dtype
                    for k in ("token_l2", "head_l2", "sketch"):
                        v = getattr(rec, k)
                        if v is not None and np.size(v):
                            rg.create_dataset(k, data=np.asarray(v, dtype=np.float32))
                    if isinstance(rec.data, _JournalData):
                        if rec.data.size:
                            rg.create_dataset("data", data=rec.data.read(scratch))
                            rec.data.done()
                            unsynced += 4 * rec.data.size
                    elif rec.data is not None and np.size(rec.data):
                        rg.create_dataset("data", data=np.asarray(rec.data, dtype=np.float32))
                        unsynced += rec.data.nbytes
                        if fd >= 0 and unsynced >= (1 << 22):
                            jr.start_writeback(fd)
                            unsynced = 0
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        jr.sync_dir(path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _attr(obj, name, default=None):
    if name not in obj.attrs:
        return default
    v = obj.attrs[name]
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, np.ndarray):
        return [int(x) for x in v.reshape(-1)] if np.issubdtype(v.dtype, np.integer) else v
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def _json_attr(obj, name, where):
    text = _attr(obj, name)
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise DumpError(f"{where}: attribute '{name}' is not valid JSON: {e}") from None


def _read_h5(path: str, data: bool = True, inputs: bool = True) -> Dump:
    h5py = _h5py()
    if not os.path.exists(path):
        raise DumpError(f"{path}: no such file")
    if os.path.isdir(path):
        raise DumpError(f"{path}: is a directory, not a dump")
    if not h5py.is_hdf5(path):
        raise DumpError(f"{path}: not an HDF5 file ({os.path.getsize(path)} bytes without an HDF5 superblock: a "
                        f"foreign file, or a dump truncated at its start)")
    try:
        with h5py.File(path, "r") as f:
            return _read_open_h5(f, path, data, inputs)
    except DumpError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise DumpError(f"{path}: cannot read the dump: {e}") from None


def _read_open_h5(f, path: str, data: bool, want_inputs: bool) -> Dump:
    fmt = _attr(f, "format")
    if fmt is None:
        raise DumpError(f"{path}: an HDF5 file but not an mla-bisect dump (no 'format' attribute on the root group)")
    if fmt != FORMAT:
        raise DumpError(f"{path}: format is '{fmt}', expected '{FORMAT}'")
    sv = _attr(f, "schema_version")
    if sv not in READ_SCHEMA_VERSIONS:
        raise DumpError(f"{path}: schema_version {sv} is not supported (this reader reads schema_version "
                        f"{' and '.join(map(str, READ_SCHEMA_VERSIONS))})")
    attrs = {k: _attr(f, k) for k in f.attrs.keys()}
    attrs["model"] = _json_attr(f, "model", path)
    attrs["run_options"] = _json_attr(f, "run_options", path)
    tp = int(attrs.get("tp", 1))
    if not 1 <= tp <= 4096:
        raise DumpError(f"{path}: tp {tp} is out of range")
    own = -1
    if "processes" in attrs:
        own = int(attrs.get("process_rank", -1))
        if int(attrs["processes"]) != tp or not -1 <= own < tp:
            raise DumpError(f"{path}: process_rank {own} of {attrs['processes']} processes does not fit tp {tp}")
    status = attrs.get("status", "complete")
    ls = _json_attr(f, "last_stage", path)
    last_stage = [s for s in ls if isinstance(s, str)] if isinstance(ls, list) else []
    attrs["status"] = status
    attrs["last_stage"] = last_stage
    inp = None
    if want_inputs and "inputs" in f:
        g = f["inputs"]
        kv = np.asarray(g["kv_cache"][...], dtype=np.float32) if "kv_cache" in g else None
        index = np.asarray(g["index_cache"][...], dtype=np.float32) if "index_cache" in g else None
        inp = Inputs(x=g["x"][...], positions=g["positions"][...], seq_lens=g["seq_lens"][...],
                     context_lens=g["context_lens"][...], block_table=g["block_table"][...],
                     num_blocks=int(_attr(g, "num_blocks", 0)), kv_cache=kv, index_cache=index)
    probes = []
    for lname in f.keys():
        if not (lname.startswith("layer") and lname[5:].isdigit() and len(lname) <= 12):
            continue
        layer = int(lname[5:])
        for pname, g in f[lname].items():
            if isinstance(g, h5py_group_type()):
                probes.append(_read_probe(g, f"{path}:/{lname}/{pname}", layer, pname, tp, own, data))
    probes.sort(key=lambda p: (p.layer, p.order))
    weights = []
    if "weights" in f:
        for lname, lg in f["weights"].items():
            if not (lname.startswith("layer") and lname[5:].isdigit()):
                raise DumpError(f"{path}:/weights/{lname}: not a layer group (/weights holds layer{{l}} groups)")
            for wname, g in lg.items():
                weights.append(_read_probe(g, f"{path}:/weights/{lname}/{wname}", int(lname[5:]), wname, tp, own, data,
                                           weight=True))
    weights.sort(key=lambda p: (p.layer, p.order))
    return Dump(path=path, attrs=attrs, status=status, last_stage=last_stage, inputs=inp,
                probes={(p.layer, p.name): p for p in probes}, weights={(p.layer, p.name): p for p in weights})


def h5py_group_type():
    return _h5py().Group


def _read_probe(g, where: str, layer: int, name: str, tp: int, own: int, data: bool, weight: bool = False) -> Probe:
    shape = tuple(_attr(g, "shape") or ())
    p = Probe(layer=layer, name=name, stage=_attr(g, "stage", ""), contract=_attr(g, "contract", ""),
              shape=shape, order=int(_attr(g, "order", 0)), heads_axis=int(_attr(g, "heads_axis", -1)),
              rope_from=int(_attr(g, "rope_from", -1)), engine_dtype=_attr(g, "engine_dtype", ""))
    if not weight and p.contract not in ("replicated", "heads", "partial"):
        raise DumpError(f"{where}: contract '{p.contract}' (expected replicated, heads or partial)")
    if weight and p.contract not in ("replicated", "rows", "columns"):
        raise DumpError(f"{where}: contract '{p.contract}' (a weight's is replicated, rows or columns)")
    if not shape or any(s <= 0 for s in shape):
        raise DumpError(f"{where}: shape {list(shape)} is not valid")
    local = list(shape)
    if p.contract == "heads":
        if p.heads_axis < 0 or shape[p.heads_axis] % tp:
            raise DumpError(f"{where}: heads probe {list(shape)} (heads_axis {p.heads_axis}) does not divide over "
                            f"tp {tp}")
        local[p.heads_axis] //= tp
    if p.contract in ("rows", "columns"):
        axis = 0 if p.contract == "rows" else 1
        if len(shape) != 2 or shape[axis] % tp:
            raise DumpError(f"{where}: {p.contract} weight {list(shape)} does not divide over tp {tp}")
        local[axis] //= tp
    ranks = sorted(int(c[4:]) for c in g.keys() if c.startswith("rank") and c[4:].isdigit())
    expect = own if own >= 0 else 0
    for r in ranks:
        if own >= 0 and r != own:
            raise DumpError(f"{where}: has rank{r} but the dump holds only rank {own} (one process per rank)")
        if r != expect:
            raise DumpError(f"{where}: has rank{r} but no rank{expect}")
        if r >= tp:
            raise DumpError(f"{where}: has rank{r} but the dump's tp is {tp}")
        expect += 1
    stats = ("l2", "absmax", "mean", "std", "nan", "inf", "checksum")
    for r in ranks:
        rg = g[f"rank{r}"]
        w = f"{where}/rank{r}"
        rshape = tuple(_attr(rg, "shape") or local)
        if list(rshape) != local:
            raise DumpError(f"{w}: shape {list(rshape)}, expected {local} ({p.contract} probe {list(shape)} at tp "
                            f"{tp})")
        has_data = "data" in rg
        level = _attr(rg, "level") or ("full" if has_data else "sketch" if "sketch" in rg else "stats")
        dtype = _attr(rg, "dtype", p.engine_dtype) or "fp32"
        got = {k: _attr(rg, k) for k in stats}
        for k in ("token_l2", "head_l2", "sketch"):
            got[k] = rg[k][...] if k in rg else None
        values = rg["data"][...] if has_data else None
        if values is not None and (any(got[k] is None for k in stats) or got["token_l2"] is None or
                                   got["sketch"] is None or (p.heads_axis >= 0 and got["head_l2"] is None)):
            # A producer that stored the tensor may leave out what follows from it (as the C++ reader accepts).
            req = probe_request(ProbeSpec(name, p.stage, p.contract, shape, p.heads_axis, p.rope_from, p.order), tp, r)
            try:
                c = hashing.compute_record(values, dtype, req["tokens"], req["heads"], req["col_offset"],
                                           hashing.probe_key(name), "full")
            except ValueError as e:
                raise DumpError(f"{w}/data: {e} (the record's dtype)") from None
            got = {k: c[k] if got.get(k) is None else got[k] for k in set(got) | set(stats)}
        missing = [k for k in stats[:6] if got[k] is None]
        if missing:
            raise DumpError(f"{w}: missing attribute{'s' if len(missing) > 1 else ''} {', '.join(missing)} (required "
                            f"when the record has no 'data')")
        p.ranks[r] = Record(
            shape=rshape, dtype=dtype, l2=float(got["l2"]), absmax=float(got["absmax"]), mean=float(got["mean"]),
            std=float(got["std"]), nan=int(got["nan"]), inf=int(got["inf"]),
            checksum=int(got["checksum"] or 0) & 0xFFFFFFFFFFFFFFFF, level=level, token_l2=got["token_l2"],
            head_l2=got["head_l2"], sketch=got["sketch"], data=values if data else None)
    return p
