"""Writing and reading mla-bisect dumps (HDF5, schema_version 1, the layout probes/dump_write.cpp writes) from Python, so
that a capture of another system (HF transformers, a serving engine) is an ordinary dump the C++ tool compares,
inspects and replays.

    from mla_bisect.dump import DumpWriter, read_dump
    w = DumpWriter("cap.h5", config=hf_config_dict, mode="prefill", tp=1, engine="hf-transformers",
                   engine_dtype="bf16", tokens=T)
    w.inputs(x=hidden_states)              # /inputs: x [T, H] (+ positions, seq_lens, ... defaults from the run)
    w.probe("q_c", tensor)                 # numpy array or torch tensor, the rank's LOCAL shard
    w.close()                              # status "complete"
    d = read_dump("cap.h5")                # d.attrs, d.inputs, d.probes[(0, "q_c")].ranks[0].l2 ...

Records. Every probe(...) computes what the C++ engines record (core/probe/probe.cpp compute_probe_record, ported in
mla_bisect.hashing): l2, absmax, mean, std, NaN/Inf counts, token_l2, head_l2, the sketch seeded by the probe's
name at the shard's global column offset, and the checksum over the raw bit patterns of the recorded dtype (bf16,
fp16, fp32; fp8_e4m3 / fp8_e5m2 by the 8-bit analogue that mla_bisect.hashing documents). The tensor is stored as
float32 (probe level "full" by default). Probe metadata (order, stage, contract, global shape, heads_axis, rope_from)
comes from the stage graph of the config and run (mla_bisect.graph, a port of build_graph): an unknown probe name or
a tensor whose shape is not the rank's local shape is a ValueError naming the probe, layer and rank. Local shards:
"heads" probes hold heads rank*N/tp ..; "partial" probes (o_partial) the rank's partial sum; "replicated" the
whole tensor. A tensor may carry leading axes that multiply to T ([B, S, N, P] for [T, N, P]).

Crash safety. The writer uses the C++ journal (probes/journal.h, mla_bisect.journal): at construction it writes
FILE.h5.journal (a header record with the run's metadata, fsynced, flock held while the writer lives) and removes
an older FILE.h5; inputs() swaps in a header carrying the inputs (a new journal renamed over the old one); every
probe is one CRC'd record appended with writev(2) straight from the record's buffers (the tensor's float32 data is
not copied), which the kernel keeps when the process is killed: a probe is durable against a crash once probe()
returns. close() appends a finish record, fsyncs the journal, writes FILE.h5 (to FILE.h5.tmp.PID, fsynced,
renamed into place) from the records it wrote, the data kept in memory (up to HOLD_BYTES for all open writers of
the process together; past it read back from the journal), and removes the journal. A capture killed at any
point therefore leaves either the finished FILE.h5 or a journal that `mla-bisect inspect FILE.h5` (and every other
C++ command) folds into FILE.h5, with status "stopped: after layer L probe P rank R" naming the last probe
committed; read_dump folds it in memory the same way (it never writes; recover_dump writes FILE.h5 as the C++
reader does). A writer killed before its header reached the journal leaves its header in FILE.h5.journal.tmp.PID
(folded as the journal, "stopped: before the first probe"), or nothing but an empty journal or temporary file: that
reads as "stopped: before the run wrote its header (...)", nothing else known, and is not folded. A journal whose
writer is alive reads as it stands, status "running: ...". Leaving a `with DumpWriter(...)` block by an exception
closes the dump with status "stopped: after ... (the exception)".

Ranks. One process recording every rank (process_rank=None): probe(..., rank=r) for r in 0..tp-1; the dump format
keeps a probe's ranks in rank order, so a rank recorded before the lower ranks of the same probe waits in memory
until they come (and close() marks the dump stopped if they never do). One process per rank (process_rank=r, or
"auto": MLA_RANK, RANK (torchrun), OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID with the matching world size,
which must equal tp): the process writes FILE.rank{r}.h5 with root attributes process_rank, processes (= tp) and
launch_id, as `mla-bisect run --rank` does, and removes FILE.h5 (the set owns that name). read_dump("FILE.h5"), like
every C++ command, merges FILE.rank0.h5 ... when FILE.h5 is absent, provided the parts agree on the launch id,
model, run options, engine, mode and inputs. The ranks of one capture agree on a launch id by, in this order: the
launch_id argument; the MLA_LAUNCH_ID environment variable; torch.distributed's environment (a hash of
TORCHELASTIC_RUN_ID, MASTER_ADDR and MASTER_PORT: unique per torchrun launch when torchrun is given --rdzv-id, else
per master port); or shared_launch_id(), which rank 0 draws and broadcasts over an initialised torch.distributed
process group (call it on every rank and pass the result).

Run options. tokens is the number of new tokens per sequence (RunSpec.tokens, `run --tokens`); the graph's T is
tokens x batch. context: cached tokens per sequence (decode, chunked). The HF config dict is stored as the root
attribute model (JSON); layer_index (which layer of the real model /layer0 holds) as a root attribute and, so that a
journal folded by the C++ reader keeps it, as run_options.layer_index too.
"""
import hashlib
import json
import os
import secrets
import shlex
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import __version__
from . import hashing
from . import journal as jr
from .graph import PAGE_SIZE, ProbeSpec, build_graph, config_dict, default_form, parse_hf_config, probe_request

FORMAT = "mla-bisect-dump"
SCHEMA_VERSION = 1  # what this writer writes (no /weights)
READ_SCHEMA_VERSIONS = (1, 2)  # 2: version 1 plus the optional /weights group (C++ runs that record weights)
ENGINE_DTYPES = ("fp32", "bf16", "fp16")
# Bytes of recorded data the open DumpWriters of this process keep in memory, all together, until their close()
# writes the HDF5 file from it; data past this is read back from the journal instead.
HOLD_BYTES = 2 << 30
_held = [0]  # bytes held now, by every open writer
_held_lock = threading.Lock()


def _hold(nbytes: int) -> bool:
    with _held_lock:
        if _held[0] + nbytes > HOLD_BYTES:
            return False
        _held[0] += nbytes
        return True


def _unhold(nbytes: int) -> None:
    with _held_lock:
        _held[0] -= nbytes


class DumpError(ValueError):
    """A dump that cannot be read: missing, truncated, foreign, or a rank set whose parts do not belong together."""


# ---------------------------------------------------------------------------------------------------------------
# What read_dump returns
# ---------------------------------------------------------------------------------------------------------------

class _Items:
    """d["x"] as well as d.x."""

    def __getitem__(self, key):
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None


@dataclass
class Record(_Items):
    """One rank's record of a probe (core/probe/probe.h ProbeRecord)."""
    shape: Tuple[int, ...]          # the rank's local shape
    dtype: str                      # the dtype the producer held the tensor in (fp32, bf16, ...)
    l2: float
    absmax: float
    mean: float
    std: float
    nan: int
    inf: int
    checksum: int
    level: str                      # stats | sketch | full
    token_l2: Optional[np.ndarray]  # [T] float32
    head_l2: Optional[np.ndarray]   # [T, local heads] float32, None without a heads axis
    sketch: Optional[np.ndarray]    # [T, 32] float32, None at level stats
    data: Optional[np.ndarray]      # the local tensor as float32 (level full)


@dataclass
class Probe(_Items):
    layer: int
    name: str
    stage: str
    contract: str                   # replicated | heads | partial
    shape: Tuple[int, ...]          # global
    order: int
    heads_axis: int
    rope_from: int
    engine_dtype: str
    ranks: Dict[int, Record] = field(default_factory=dict)  # by tp rank


@dataclass
class Inputs(_Items):
    x: np.ndarray                   # [T, H] float32: h when run_options.input_norm, else the attention input x
    positions: np.ndarray           # [T] int32
    seq_lens: np.ndarray            # [B] int32: new tokens per sequence
    context_lens: np.ndarray        # [B] int32
    block_table: np.ndarray         # [B, max_blocks] int32
    num_blocks: int
    kv_cache: Optional[np.ndarray]  # [layers, num_blocks, 64, L+R] float32
    index_cache: Optional[np.ndarray] = None  # DSA models: [layers, num_blocks, 64, Di] float32, the indexer's keys

    @property
    def token_seq(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.seq_lens), dtype=np.int32), self.seq_lens)


@dataclass
class Dump:
    path: str
    attrs: Dict[str, Any]           # root attributes; model, run_options and last_stage parsed from their JSON
    status: str                     # "complete", "stopped: ...", "running: ..."
    last_stage: List[str]
    inputs: Optional[Inputs]
    probes: Dict[Tuple[int, str], Probe]  # by (layer, name), in (layer, graph order) order
    parts: List[str] = field(default_factory=list)  # FILE.rank0.h5 ... merged into this dump
    # /weights: the weights each layer computed with, as the engine held them (C++ engines record them), by
    # (layer, checkpoint name); same record layout as probes, rows in the tokens' place; {} when none were recorded.
    weights: Dict[Tuple[int, str], Probe] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @property
    def tp(self) -> int:
        return int(self.attrs.get("tp", 1))

    @property
    def process_rank(self) -> int:
        return int(self.attrs.get("process_rank", -1))

    @property
    def processes(self) -> int:
        return int(self.attrs.get("processes", 0))

    @property
    def launch_id(self) -> str:
        return self.attrs.get("launch_id", "")

    @property
    def model(self) -> Any:
        return self.attrs.get("model")

    @property
    def run_options(self) -> Any:
        return self.attrs.get("run_options")

    @property
    def layer_index(self) -> Optional[int]:
        if "layer_index" in self.attrs:
            return int(self.attrs["layer_index"])
        ro = self.run_options
        return int(ro["layer_index"]) if isinstance(ro, dict) and "layer_index" in ro else None

    def find(self, layer: int, name: str) -> Optional[Probe]:
        return self.probes.get((layer, name))


def rank_dump_path(path: str, rank: int) -> str:
    """FILE.h5 -> FILE.rank<R>.h5: rank R's file of a one-process-per-rank capture whose name is FILE.h5."""
    d, base = os.path.split(path)
    stem, ext = os.path.splitext(base)
    if not stem:  # ".h5" alone: std::filesystem treats it as a stem without extension
        stem, ext = ext, ""
    return os.path.join(d, f"{stem}.rank{rank}{ext}")


# ---------------------------------------------------------------------------------------------------------------
# Tensors in
# ---------------------------------------------------------------------------------------------------------------

def _is_torch(t) -> bool:
    return type(t).__module__.startswith("torch") and hasattr(t, "detach")


def tensor_values(t, what: str) -> Tuple[np.ndarray, str]:
    """(float32 values, dtype name) of a numpy array or torch tensor held in fp32, bf16, fp16 or fp8 (e4m3fn, e5m2);
    float64 is taken as fp32 (rounded)."""
    if _is_torch(t):
        import torch
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        dt = t.dtype
        names = {torch.float32: "fp32", torch.float64: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
        if dt in names:
            # One pass from any layout into a new contiguous float32 tensor that the dump owns (bf16 and fp16
            # widen exactly, float64 rounds to nearest as numpy's astype does).
            out = torch.empty(t.shape, dtype=torch.float32)
            out.copy_(t)
            return out.numpy(), names[dt]
        t = t.contiguous()
        for name, tname in (("fp8_e4m3", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2")):
            if dt == getattr(torch, tname, None):
                return hashing.fp8_to_float(t.view(torch.uint8).numpy(), name), name
        raise ValueError(f"{what}: torch dtype {dt} is not supported (fp32, bf16, fp16, float8_e4m3fn, float8_e5m2)")
    a = np.asarray(t)
    name = a.dtype.name
    if name == "bfloat16":  # ml_dtypes
        wide = np.ascontiguousarray(a).view(np.uint16).astype(np.uint32)
        np.left_shift(wide, np.uint32(16), out=wide)
        return wide.view(np.float32), "bf16"
    if name in ("float8_e4m3fn", "float8_e5m2"):
        dt = "fp8_e4m3" if name == "float8_e4m3fn" else "fp8_e5m2"
        return hashing.fp8_to_float(np.ascontiguousarray(a).view(np.uint8), dt), dt
    if a.dtype == np.float32:
        return np.array(a, dtype=np.float32, copy=True), "fp32"
    if a.dtype == np.float16:
        return a.astype(np.float32), "fp16"
    if a.dtype == np.float64:
        return a.astype(np.float32), "fp32"
    raise ValueError(f"{what}: dtype {a.dtype} is not supported (float32, bfloat16, float16, float8_e4m3fn, "
                     f"float8_e5m2, float64)")


def _fit_shape(a: np.ndarray, want: Tuple[int, ...], what: str, expected: str) -> np.ndarray:
    """`a` as shape `want`: the same shape, or leading axes that multiply to want[0] followed by want[1:]."""
    s = tuple(a.shape)
    if s == want:
        return a
    k = len(want) - 1
    if len(s) >= len(want) and s[len(s) - k:] == want[1:] and int(np.prod(s[:len(s) - k])) == want[0]:
        return a.reshape(want)
    raise ValueError(f"{what}: shape {list(s)}, expected {expected}")


def _int_array(v, what: str, dims: Optional[int]) -> np.ndarray:
    if _is_torch(v):
        v = v.detach().cpu().numpy()
    a = np.asarray(v)
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"inputs: {what} must hold integers, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if dims is None:
        a = a.reshape(-1)
    elif a.ndim != dims:
        raise ValueError(f"inputs: {what} has {a.ndim} axes, expected {dims}")
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        raise ValueError(f"inputs: {what} holds values outside int32")
    return a.astype(np.int32)


# ---------------------------------------------------------------------------------------------------------------
# Ranks and launch ids
# ---------------------------------------------------------------------------------------------------------------

_LAUNCHERS = [("MLA_RANK", "MLA_WORLD_SIZE"), ("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
              ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")]


def _resolve_process_rank(process_rank, tp: int) -> Optional[int]:
    if process_rank is None:
        return None
    if process_rank == "auto":
        for rv, wv in _LAUNCHERS:
            if rv in os.environ:
                try:
                    r, w = int(os.environ[rv]), int(os.environ.get(wv, ""))
                except ValueError:
                    raise ValueError(f"process_rank='auto': {rv}={os.environ.get(rv)!r} / {wv}="
                                     f"{os.environ.get(wv)!r} are not numbers") from None
                if w != tp:
                    raise ValueError(f"process_rank='auto': {wv}={w} processes but tp is {tp}: one process per "
                                     f"tensor-parallel rank")
                process_rank = r
                break
        else:
            raise ValueError("process_rank='auto': no launcher's rank variable is set (looked for "
                             + ", ".join(rv for rv, _ in _LAUNCHERS) + "); pass process_rank=N")
    if isinstance(process_rank, bool) or not isinstance(process_rank, (int, np.integer)):
        raise ValueError(f"process_rank must be a rank number, 'auto' or None, got {process_rank!r}")
    if not 0 <= process_rank < tp:
        raise ValueError(f"process_rank {process_rank} is outside tp {tp} (ranks 0..{tp - 1})")
    return int(process_rank)


def launch_id_from_env() -> Optional[str]:
    """The launch id every rank of one launch derives alike from its environment (module docstring), or None."""
    if os.environ.get("MLA_LAUNCH_ID"):
        return os.environ["MLA_LAUNCH_ID"]
    if os.environ.get("MASTER_PORT"):
        key = "|".join(os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"))
        return "torch-" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return None


def shared_launch_id() -> str:
    """A fresh launch id drawn by rank 0 and broadcast over torch.distributed's default process group; a collective
    call: every rank must make it. Pass the result as DumpWriter(launch_id=...)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("shared_launch_id(): torch.distributed is not initialised; pass launch_id= or set "
                         "MLA_LAUNCH_ID in every rank's environment")
    box = [secrets.token_hex(16) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---------------------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------------------

def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _default_device() -> str:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.get_device_name()
    except Exception:  # a broken CUDA setup must not stop a capture
        pass
    return "cpu"


class DumpWriter:
    """Writes one dump (module docstring). Arguments:
    path          FILE.h5 (with process_rank: this process writes FILE.rank{r}.h5)
    config        HF config.json: dict, transformers config object, or path
    mode          prefill | decode | chunked;  form: mha | absorbed (default: mha, decode absorbed)
    tp            tensor-parallel ranks;  tokens: new tokens per sequence;  batch: sequences
    context       cached tokens per sequence (one value for all, or one each); decode and chunked only
    input_norm    the layer starts at h (probes h, x = RMSNorm(h), ..., h_out)
    layers        layers the dump holds (probe(layer=...) in 0..layers-1)
    layer_index   which layer of the real model /layer0 holds
    engine, engine_dtype (fp32 | bf16 | fp16: the activations' dtype), engine_options, device, command
    probe_level   full (default: data stored) | sketch | stats
    process_rank  None | r | "auto";  launch_id: see the module docstring
    kv_cache_dtype, kv_cache_scale   how the system stores its latent cache: "fp8_e4m3" with the per-tensor scale
                  (a positive float) its codes are multiplied by; None: as the activations. Root attributes, and
                  run_options keys too (a folded journal keeps them); replay calibrates kv_cache and what reads the
                  cache with the reference's cache rows rounded to q(x / scale) * scale.
    """

    def __init__(self, path, config, mode: str = "prefill", tp: int = 1, engine: str = "capture",
                 engine_dtype: str = "bf16", tokens: Optional[int] = None, batch: int = 1, context=None,
                 input_norm: bool = False, layer_index: Optional[int] = None, process_rank=None,
                 form: Optional[str] = None, layers: int = 1, position_offset: int = 0,
                 launch_id: Optional[str] = None, probe_level: str = "full", device: Optional[str] = None,
                 engine_options: str = "", command: Optional[str] = None, kv_cache_dtype: Optional[str] = None,
                 kv_cache_scale: Optional[float] = None):
        self._closed = True  # until the journal exists
        self._lock = threading.RLock()  # hooks on several threads may record at once
        cfg, origin = config_dict(config)
        self.dims = parse_hf_config(cfg, origin)
        for what, v in [("tp", tp), ("batch", batch), ("layers", layers)]:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{what} must be a positive integer, got {v!r}")
        if tokens is None or isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 1:
            raise ValueError(f"tokens must be the positive number of new tokens per sequence, got {tokens!r}")
        if self.dims.heads % tp:
            raise ValueError(f"model '{self.dims.name}' has {self.dims.heads} attention heads, which tp {tp} does "
                             f"not divide (heads % tp must be 0)")
        if engine_dtype not in ENGINE_DTYPES:
            raise ValueError(f"engine_dtype '{engine_dtype}' (expected fp32, bf16 or fp16)")
        if probe_level not in hashing.LEVELS:
            raise ValueError(f"probe_level '{probe_level}' (expected stats, sketch or full)")
        if position_offset < 0:
            raise ValueError(f"position_offset must be >= 0, got {position_offset}")
        if layer_index is not None and (not isinstance(layer_index, (int, np.integer)) or layer_index < 0):
            raise ValueError(f"layer_index must be a layer number >= 0, got {layer_index!r}")
        self.tp, self.batch, self.layers, self.tokens = int(tp), int(batch), int(layers), int(tokens)
        self.mode = mode
        self.input_norm = bool(input_norm) or self.layers > 1
        self.form = default_form(mode) if form is None else ("absorbed" if form == "mqa" else form)
        self.context = self._check_context(context)
        self.keys = max(self.context, default=0) + self.tokens  # DSA's idx_scores width (inputs() may widen it)
        self.graph = build_graph(self.dims, self.tokens * self.batch, mode, form, self.input_norm, keys=self.keys)
        self.position_offset = int(position_offset)
        self.probe_level = probe_level
        self.process_rank = _resolve_process_rank(process_rank, self.tp)
        if self.process_rank is not None:
            launch_id = launch_id or launch_id_from_env()
            if not launch_id:
                raise ValueError(f"process_rank={self.process_rank}: the ranks of one capture need a common launch "
                                 f"id: pass launch_id=..., set MLA_LAUNCH_ID, launch under torchrun, or use "
                                 f"shared_launch_id()")
        self.set_path = os.fspath(path)
        self.path = rank_dump_path(self.set_path, self.process_rank) if self.process_rank is not None else self.set_path

        model = dict(cfg)
        model.setdefault("name", self.dims.name)
        run_options = {"mode": mode, "form": self.form, "tp": self.tp, "layers": self.layers, "tokens": self.tokens,
                       "batch": self.batch, "context": list(self.context), "seed": 0,
                       "position_offset": self.position_offset, "input_norm": self.input_norm,
                       "probe_level": probe_level, "input": "captured"}
        if layer_index is not None:
            run_options["layer_index"] = int(layer_index)
        if kv_cache_dtype not in (None, "auto", "fp8_e4m3"):
            raise ValueError(f"kv_cache_dtype '{kv_cache_dtype}' (expected fp8_e4m3, or None: as the activations)")
        if kv_cache_dtype == "fp8_e4m3":
            if isinstance(kv_cache_scale, bool) or not isinstance(kv_cache_scale, (int, float, np.floating, np.integer)) \
                    or not np.isfinite(kv_cache_scale) or kv_cache_scale <= 0:
                raise ValueError(f"kv_cache_dtype fp8_e4m3 needs kv_cache_scale, the positive per-tensor scale its "
                                 f"codes are multiplied by; got {kv_cache_scale!r}")
            run_options["kv_cache_dtype"] = kv_cache_dtype
            run_options["kv_cache_scale"] = float(kv_cache_scale)
        elif kv_cache_scale is not None:
            raise ValueError("kv_cache_scale is given without kv_cache_dtype='fp8_e4m3'")
        self.meta = {
            "engine": engine, "engine_options": engine_options, "engine_dtype": engine_dtype,
            "device": device if device is not None else _default_device(), "model": model,
            "run_options": run_options, "tp": self.tp, "mode": mode, "seed": 0, "inject": "",
            "probe_level": probe_level,
            "command": command if command is not None else shlex.join(getattr(sys, "orig_argv", sys.argv)),
            "process_rank": -1 if self.process_rank is None else self.process_rank,
            "processes": 0 if self.process_rank is None else self.tp,
            "launch_id": launch_id if self.process_rank is not None else "",
            "created_utc": _utc_now(), "tool_version": f"python {__version__}", "git_sha": "",
        }
        if layer_index is not None:
            self.meta["layer_index"] = int(layer_index)
        if kv_cache_dtype == "fp8_e4m3":
            self.meta["kv_cache_dtype"], self.meta["kv_cache_scale"] = kv_cache_dtype, float(kv_cache_scale)
        self._inputs = None
        self._committed: Dict[Tuple[int, str], int] = {}  # ranks 0..n-1 of a probe are in the journal
        self._pending: Dict[Tuple[int, str], Dict[int, tuple]] = {}
        self._stage_of_rank: Dict[int, Tuple[int, str]] = {}
        self.last_probe = ""
        # What the journal holds, kept for close() (the fold of the journal, without reading it back): the probes
        # by (layer, name) in commit order, each rank's record with its data held in memory (while the process's
        # open writers hold less than HOLD_BYTES) or else its place in the journal; each rank's last stage marker.
        self._written: Dict[Tuple[int, str], Probe] = {}
        self._spilled: Dict[Tuple[int, str, int], Tuple[int, Tuple[int, ...]]] = {}
        self._held_bytes = 0
        own = -1 if self.process_rank is None else self.process_rank
        self._last_stage = ["" if own >= 0 else "not started"] * max(self.tp, 1)
        if own >= 0:
            self._last_stage[own] = "not started"
        self._header_meta = ""

        if self.process_rank is not None:
            # The set owns the plain name now: an older dump of one process there would be read instead of the set.
            for p in (self.set_path, jr.journal_path(self.set_path)):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        self._journal = jr.Writer(jr.journal_path(self.path))
        self._journal.append(jr.HEADER, self._header_payload())
        self._journal.header_end = self._journal.size
        self._journal.sync()
        self._closed = False
        # From here on the journal is the truth about this path: an older dump there must not be mistaken for it.
        try:
            os.unlink(self.path)
            jr.sync_dir(self.path)
        except FileNotFoundError:
            pass

    def _header_payload(self) -> list:
        """The header record of the meta and inputs as they stand (the meta's JSON kept for close())."""
        parts = jr.encode_header_parts(self.meta, self._inputs)
        self._header_meta = jr.header_meta_text(self.meta)
        return parts

    def _check_context(self, context) -> List[int]:
        if context is None:
            return []
        ctx = [int(context)] if isinstance(context, (int, np.integer)) else [int(c) for c in context]
        if len(ctx) not in (0, 1, self.batch):
            raise ValueError(f"context has {len(ctx)} values for batch {self.batch} (give one value, or one per "
                             f"sequence; sequences of different lengths are batch 1 of their total tokens, their "
                             f"contexts given to inputs() as context_lens)")
        if any(c < 0 for c in ctx):
            raise ValueError(f"context values must be >= 0, got {ctx}")
        if self.mode == "prefill" and any(ctx):
            raise ValueError("context is for decode and chunked modes; prefill starts with an empty cache")
        return ctx

    def _context_lens(self, B: int) -> Optional[List[int]]:
        """The writer's context for B sequences (None: it gives another number of values)."""
        if not self.context:
            return [0] * B
        if len(self.context) == 1:
            return self.context * B
        return list(self.context) if len(self.context) == B else None

    # --- inputs ------------------------------------------------------------------------------------------------

    def inputs(self, x, positions=None, seq_lens=None, context_lens=None, block_table=None, kv_cache=None,
               num_blocks: Optional[int] = None, index_cache=None) -> None:
        """/inputs: x [T, H] (h when input_norm, else the attention input), positions [T], seq_lens [B],
        context_lens [B], block_table [B, max_blocks] page ids, kv_cache [layers, num_blocks, 64, L+R] (or one layer's
        [num_blocks, 64, L+R]), and for a DSA model (index_topk) index_cache [layers, num_blocks, 64, Di], the
        indexer's keys of the cached tokens (required with cached context). Omitted ones follow from the run:
        seq_lens tokens each, context_lens the context, positions offset + t (prefill) or context + t, a block table
        of consecutive pages plus a spare."""
        with self._lock:
            self._set_inputs(x, positions, seq_lens, context_lens, block_table, kv_cache, num_blocks, index_cache)

    def _set_inputs(self, x, positions, seq_lens, context_lens, block_table, kv_cache, num_blocks,
                    index_cache=None) -> None:
        self._check_open()
        d, T = self.dims, self.tokens * self.batch
        xv, _ = tensor_values(x, "inputs: x")
        xv = _fit_shape(xv, (T, d.hidden), "inputs: x", f"[{T}, {d.hidden}] (tokens x batch, hidden_size)")
        sl = _int_array(seq_lens, "seq_lens", 1) if seq_lens is not None else np.full(self.batch, self.tokens, np.int32)
        B = sl.size
        # Sequences of different lengths are one run of T tokens (batch 1) whose inputs carry the real layout, as
        # `mla-bisect run --input` reads them.
        if B != self.batch and self.batch != 1:
            raise ValueError(f"inputs: seq_lens has {B} sequences, the run has batch {self.batch} (sequences of "
                             f"different lengths: batch=1, tokens=their total)")
        if B == 0:
            raise ValueError("inputs: seq_lens is empty (one entry per sequence)")
        if (sl <= 0).any():
            raise ValueError(f"inputs: seq_lens: sequence {int(np.argmax(sl <= 0))} has no new tokens")
        if int(sl.sum()) != T:
            raise ValueError(f"inputs: seq_lens add up to {int(sl.sum())} tokens, x has {T}")
        if context_lens is not None:
            cl = _int_array(context_lens, "context_lens", 1)
            if cl.size != B:
                raise ValueError(f"inputs: context_lens has {cl.size} values, the run has batch {B}")
            if self.context and list(cl) != self._context_lens(B):
                raise ValueError(f"inputs: context_lens {list(map(int, cl))} differ from the writer's context "
                                 f"{self.context}")
            if self.mode == "prefill" and cl.any():
                raise ValueError("inputs: context_lens must be 0 in prefill mode (the cache starts empty)")
        else:
            if self._context_lens(B) is None:
                raise ValueError(f"inputs: the writer's context {self.context} does not give one value per sequence "
                                 f"of seq_lens {[int(n) for n in sl]}: pass context_lens")
            cl = np.asarray(self._context_lens(B), dtype=np.int32)
        if (cl < 0).any():
            raise ValueError(f"inputs: context_lens: negative for sequence {int(np.argmax(cl < 0))}")
        if positions is not None:
            pos = _int_array(positions, "positions", None)
            if pos.size != T:
                raise ValueError(f"inputs: positions has {pos.size} values, x has {T} tokens")
        else:
            base = cl if self.mode != "prefill" else np.full(B, self.position_offset, np.int32)
            pos = np.concatenate([b + np.arange(n, dtype=np.int32) for b, n in zip(base, sl)]).astype(np.int32)
        kv = None
        if kv_cache is not None:
            kv, _ = tensor_values(kv_cache, "inputs: kv_cache")
            if kv.ndim == 3:
                kv = kv[None]
            if kv.ndim != 4 or kv.shape[2] != PAGE_SIZE or kv.shape[3] != d.cache_row:
                raise ValueError(f"inputs: kv_cache shape {list(kv.shape)}, expected [layers, num_blocks, {PAGE_SIZE}, "
                                 f"{d.cache_row}] (kv_lora_rank + qk_rope_head_dim)")
            if kv.shape[0] != self.layers:
                raise ValueError(f"inputs: kv_cache holds {kv.shape[0]} layers, the dump has {self.layers}")
            if block_table is None:
                raise ValueError("inputs: kv_cache needs its block_table (which pages hold which sequence's rows)")
        elif cl.any():
            raise ValueError(f"inputs: context_lens {[int(c) for c in cl]} has cached tokens, so kv_cache is required "
                             f"(the cache rows they are attended from)")
        if block_table is not None:
            bt = _int_array(block_table, "block_table", 2)
            if bt.shape[0] != B:
                raise ValueError(f"inputs: block_table has {bt.shape[0]} rows, the run has batch {B}")
        else:
            pages = [(int(c) + int(n) + PAGE_SIZE - 1) // PAGE_SIZE for c, n in zip(cl, sl)]
            max_blocks, spare = max(pages) + 1, sum(pages)
            bt = np.full((B, max_blocks), spare, dtype=np.int32)
            nxt = 0
            for s, p in enumerate(pages):
                bt[s, :p] = np.arange(nxt, nxt + p)
                nxt += p
        if num_blocks is None:
            num_blocks = kv.shape[1] if kv is not None else int(bt.max()) + 1
        num_blocks = int(num_blocks)
        if kv is not None and kv.shape[1] != num_blocks:
            raise ValueError(f"inputs: kv_cache has {kv.shape[1]} pages, num_blocks is {num_blocks}")
        if not 0 < num_blocks <= (1 << 30):
            raise ValueError(f"inputs: num_blocks {num_blocks} is out of range")
        index = None
        if index_cache is not None:
            if not d.has_dsa:
                raise ValueError(f"inputs: index_cache given, but model '{d.name}' has no indexer (no index_topk)")
            index, _ = tensor_values(index_cache, "inputs: index_cache")
            if index.ndim == 3:
                index = index[None]
            want = (self.layers, num_blocks, PAGE_SIZE, d.index_head_dim)
            if tuple(index.shape) != want:
                raise ValueError(f"inputs: index_cache shape {list(index.shape)}, expected {list(want)} (layers, "
                                 f"num_blocks, page, index_head_dim)")
        elif d.has_dsa and cl.any():
            raise ValueError(f"inputs: context_lens {[int(c) for c in cl]} has cached tokens and model '{d.name}' "
                             f"selects keys with DSA's indexer, so index_cache is required (the indexer's keys of "
                             f"those tokens)")
        max_blocks = bt.shape[1]
        for s in range(B):
            need = (int(cl[s]) + int(sl[s]) + PAGE_SIZE - 1) // PAGE_SIZE
            if need > max_blocks:
                raise ValueError(f"inputs: block_table: sequence {s} needs {need} pages, the table has {max_blocks} "
                                 f"columns")
        if bt.size and (bt.min() < 0 or bt.max() >= num_blocks):
            bad = int(bt.reshape(-1)[np.argmax((bt < 0) | (bt >= num_blocks))])
            raise ValueError(f"inputs: block_table: page id {bad} outside [0, {num_blocks})")
        bad = np.flatnonzero(pos < 0)
        if bad.size:
            raise ValueError(f"inputs: positions: token {int(bad[0])} at position {int(pos[bad[0]])} is negative")
        # Positions are the rope's (a prefill may start anywhere: a system prompt cached elsewhere, position_ids
        # offset); a token's cache row is at slot context + t of its sequence, whatever its position. The dump's
        # readers bound positions by the table's columns: extra columns holding each row's last page id (never read
        # through: no sequence has rows there) cover them.
        cols = int(pos.max()) // PAGE_SIZE + 1 if pos.size else 0
        if cols > max_blocks:
            bt = np.concatenate([bt, np.repeat(bt[:, -1:], cols - max_blocks, axis=1)], axis=1)
        self._inputs = {"x": xv, "positions": pos, "seq_lens": sl, "context_lens": cl, "block_table": bt,
                        "num_blocks": num_blocks, "kv_cache": kv, "index_cache": index,
                        "token_seq": np.repeat(np.arange(B, dtype=np.int32), sl)}
        if not self.context and cl.any():  # the run's context follows the inputs' (as `run --input` takes it)
            uniform = B == self.batch and len(set(sl.tolist())) == 1
            self.context = ([int(cl[0])] if len(set(cl.tolist())) == 1 else [int(c) for c in cl]) if uniform else []
            self.meta["run_options"]["context"] = list(self.context)
        # DSA's idx_scores holds the longest context plus the run's tokens; where the run options' context does not
        # say it (sequences that differ in new tokens: batch 1 of their T tokens, no context of its own),
        # run_options.keys does.
        keys = int(cl.max()) + self.tokens
        if keys != self.keys:
            if any(n == "idx_scores" for _, n in list(self._committed) + list(self._pending)):
                raise ValueError(f"inputs: idx_scores was recorded with {self.keys} keys before inputs(), the "
                                 f"inputs give {keys} (their longest context plus tokens)")
            self.keys = keys
            self.graph = build_graph(self.dims, self.tokens * self.batch, self.mode, self.form, self.input_norm,
                                     keys=keys)
            self.meta["run_options"]["keys"] = keys
        self._journal.replace_header(self._header_payload())

    # --- probes ------------------------------------------------------------------------------------------------

    def probe(self, name: str, tensor, rank: Optional[int] = None, layer: int = 0, dtype: Optional[str] = None,
              level: Optional[str] = None) -> None:
        """Records probe `name` of `layer` on tp rank `rank` (default: this process's rank, or 0 at tp 1) from the
        rank's local shard. dtype overrides the tensor's own (e.g. "bf16" for float32 data holding bf16 values)."""
        with self._lock:
            self._probe(name, tensor, rank, layer, dtype, level)

    def _probe(self, name, tensor, rank, layer, dtype, level) -> None:
        self._check_open()
        spec = self.graph.find(name)
        if spec is None:
            raise ValueError(f"unknown probe '{name}': not in this capture's stage graph ({self.mode}, "
                             f"{self.form} attention, {'q LoRA' if self.dims.has_q_lora else 'no q LoRA'}"
                             f"{', input_norm' if self.input_norm else ''}; probes: {', '.join(self.graph.names)})")
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.layers:
            raise ValueError(f"probe '{name}': layer {layer!r} outside the dump's layers 0..{self.layers - 1}")
        layer = int(layer)
        if rank is None:
            if self.process_rank is not None:
                rank = self.process_rank
            elif self.tp == 1:
                rank = 0
            else:
                raise ValueError(f"probe '{name}' layer {layer}: rank= is required at tp {self.tp}")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.tp:
            raise ValueError(f"probe '{name}' layer {layer}: rank {rank!r} outside tp {self.tp}")
        rank = int(rank)
        if self.process_rank is not None and rank != self.process_rank:
            raise ValueError(f"probe '{name}' layer {layer}: rank {rank}, but this process records rank "
                             f"{self.process_rank} only (process_rank)")
        where = f"probe '{name}' layer {layer} rank {rank}"
        values, native = tensor_values(tensor, where)
        if dtype is not None and dtype not in hashing.DTYPES:
            raise ValueError(f"{where}: dtype '{dtype}' (expected one of {', '.join(hashing.DTYPES)})")
        dt = dtype or native
        local = spec.local_shape(self.tp)
        values = _fit_shape(values, local, where,
                            f"the rank's local shape {list(local)} ({spec.contract} probe {list(spec.shape)} at tp "
                            f"{self.tp})")
        lvl = level or self.probe_level
        if lvl not in hashing.LEVELS:
            raise ValueError(f"{where}: level '{lvl}' (expected stats, sketch or full)")
        req = probe_request(spec, self.tp, rank)
        try:
            rec = hashing.compute_record(values, dt, req["tokens"], req["heads"], req["col_offset"],
                                         hashing.probe_key(name), lvl)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        payload = (jr.encode_probe_parts(layer, rank, spec, rec), rec)
        key = (layer, name)
        committed = self._committed.get(key, 0)
        if self.process_rank is not None or rank <= committed:
            self._commit(key, rank, spec, payload)
            pend = self._pending.get(key, {})
            while self._committed.get(key, 0) in pend:
                r = self._committed[key]
                self._commit(key, r, spec, pend.pop(r))
            if not pend:
                self._pending.pop(key, None)
        else:
            self._pending.setdefault(key, {})[rank] = payload  # waits for ranks committed..rank-1 of this probe

    def _commit(self, key, rank, spec: ProbeSpec, payload: tuple) -> None:
        layer, name = key
        parts, rec = payload
        j = self._journal
        if self._stage_of_rank.get(rank) != (layer, spec.stage):
            j.append(jr.STAGE, jr.encode_stage(layer, spec.stage, rank))
            self._stage_of_rank[rank] = (layer, spec.stage)
            if rank >= len(self._last_stage):
                self._last_stage += ["not started"] * (rank + 1 - len(self._last_stage))
            self._last_stage[rank] = f"layer {layer} stage {spec.stage}"
        j.append(jr.PROBE, parts)
        end = j.size - 4  # the payload's end: the data, when there is any, is its last field
        if self.process_rank is None:
            self._committed[key] = max(self._committed.get(key, 0), rank + 1)
        self.last_probe = f"layer {layer} probe {name} rank {rank}"
        self._remember(key, rank, spec, rec, end - j.header_end)

    def _remember(self, key, rank: int, spec: ProbeSpec, rec: dict, data_end: int) -> None:
        """The record as the journal's fold reads it back (_fold): the first record of a probe gives its metadata,
        a rank recorded again replaces the earlier record. data_end: where the record's data ends in the journal,
        from the end of its header."""
        p = self._written.get(key)
        if p is None:
            p = self._written[key] = Probe(layer=key[0], name=spec.name, stage=spec.stage, contract=spec.contract,
                                           shape=tuple(int(d) for d in spec.shape), order=int(spec.order),
                                           heads_axis=int(spec.heads_axis), rope_from=int(spec.rope_from),
                                           engine_dtype=rec["dtype"])
        old = p.ranks.get(rank)
        if old is not None and old.data is not None:
            self._held_bytes -= old.data.nbytes
            _unhold(old.data.nbytes)
        self._spilled.pop((key[0], key[1], rank), None)
        T = p.shape[0] if p.shape else 0

        def vec(v):
            return None if v is None else np.asarray(v, dtype=np.float32).reshape(-1)

        def rows(v):
            v = vec(v)
            return v.reshape(T, -1) if v is not None and v.size and T else None

        data = rec["data"]
        if data is not None:
            data = np.asarray(data, dtype=np.float32)
            if _hold(data.nbytes):
                self._held_bytes += data.nbytes
            else:
                self._spilled[(key[0], key[1], rank)] = (data_end - data.nbytes, tuple(data.shape))
                data = None
        tl = vec(rec["token_l2"])
        p.ranks[rank] = Record(shape=tuple(int(d) for d in rec["shape"]), dtype=rec["dtype"], l2=float(rec["l2"]),
                               absmax=float(rec["absmax"]), mean=float(rec["mean"]), std=float(rec["std"]),
                               nan=int(rec["nan"]), inf=int(rec["inf"]), checksum=int(rec["checksum"]),
                               level=rec["level"], token_l2=tl if tl is not None and tl.size else None,
                               head_l2=rows(rec["head_l2"]), sketch=rows(rec["sketch"]), data=data)

    def _written_dump(self, status: str) -> Dump:
        """The Dump the journal holds (what _fold makes of it in mode finish), from what the writer kept: data
        not held in memory is a _JournalData, read from the journal as the HDF5 file is written."""
        meta = json.loads(self._header_meta)
        attrs = _attrs_from_meta(meta)
        inputs = None
        if self._inputs is not None:
            i = self._inputs
            inputs = Inputs(x=i["x"], positions=i["positions"], seq_lens=i["seq_lens"],
                            context_lens=i["context_lens"], block_table=i["block_table"],
                            num_blocks=int(i["num_blocks"]), kv_cache=i["kv_cache"], index_cache=i.get("index_cache"))
        probes: Dict[Tuple[int, str], Probe] = {}
        for key, p in self._written.items():
            q = Probe(layer=p.layer, name=p.name, stage=p.stage, contract=p.contract, shape=p.shape, order=p.order,
                      heads_axis=p.heads_axis, rope_from=p.rope_from, engine_dtype=p.engine_dtype)
            for r, rec in sorted(p.ranks.items()):
                spilled = self._spilled.get((key[0], key[1], r))
                if spilled is not None:
                    off, shape = spilled
                    data = _JournalData(self._journal.fd, self._journal.header_end + off, shape)
                    rec = Record(**{**rec.__dict__, "data": data})
                q.ranks[r] = rec
            probes[key] = q
        ordered = dict(sorted(probes.items(), key=lambda kv: (kv[1].layer, kv[1].order)))
        last_stage = list(self._last_stage)
        attrs["status"] = status
        attrs["last_stage"] = last_stage
        return Dump(path=self.path, attrs=attrs, status=status, last_stage=last_stage, inputs=inputs,
                    probes=ordered)

    # --- closing -----------------------------------------------------------------------------------------------

    def close(self, status: str = "complete") -> None:
        """Writes FILE.h5 (status "complete" unless given) and removes the journal. Idempotent."""
        with self._lock:
            self._close(status)

    def _close(self, status: str) -> None:
        if self._closed:
            return
        if status != "complete" and not status.startswith("stopped"):
            raise ValueError(f"close(status={status!r}): a dump's status is 'complete' or 'stopped: <where>'")
        if self._pending:
            waiting = "; ".join(f"layer {l} {n} rank {sorted(p)} without rank {self._committed.get((l, n), 0)}"
                                for (l, n), p in sorted(self._pending.items()))
            warnings.warn(f"{self.path}: probes recorded without their lower ranks were left out: {waiting}")
            if status == "complete":
                status = f"stopped: probes recorded without their lower ranks: {waiting}"
        j = self._journal
        j.append(jr.FINISH, jr.encode_finish(status))
        # The journal on disk first (as the C++ writer does before its HDF5 file; its writeback started as the records
        # were appended); then, where the file is written from memory alone, its cached pages are let go, so that
        # the HDF5 file's pages reuse them.
        j.sync()
        if not self._spilled:
            jr.drop_cache(j.fd)
        d = self._written_dump(status)
        write_h5(d, self.path)
        del d
        self._let_go()
        j.remove()
        self._closed = True

    def _let_go(self) -> None:
        """The records kept for close() dropped, their data's share of HOLD_BYTES given back."""
        self._written, self._spilled = {}, {}
        if getattr(self, "_held_bytes", 0):
            _unhold(self._held_bytes)
            self._held_bytes = 0

    def __del__(self):
        # Dropped without close(): the journal stays for recovery (it reads as stopped once its lock is released).
        j = getattr(self, "_journal", None)
        if j is not None and not getattr(self, "_closed", True):
            j.close()
            self._closed = True
        self._let_go()

    def __enter__(self):
        return self

    def __exit__(self, etype, exc, tb):
        if self._closed:
            return False
        if etype is None:
            self.close()
        else:
            where = f"after {self.last_probe}" if self.last_probe else "before the first probe"
            self.close(f"stopped: {where} ({etype.__name__}: {exc})")
        return False

    def _check_open(self):
        if self._closed:
            raise ValueError(f"{self.path}: the dump writer is closed")


# ---------------------------------------------------------------------------------------------------------------
# Folding a journal
# ---------------------------------------------------------------------------------------------------------------

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
    """The Dump a journal holds (probes/dump_journal.cpp fold). mode: finish (the writer's own close), recover (its writer
    died: status "stopped: after <last probe>" unless it finished), live (its writer runs: "running: ...")."""
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


# ---------------------------------------------------------------------------------------------------------------
# HDF5
# ---------------------------------------------------------------------------------------------------------------

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
            raise DumpError(f"{w}: shape {list(rshape)}, expected {local} ({p.contract} probe {list(shape)} at tp {tp})")
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


# ---------------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------------

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


def _exists_with_journal(path: str) -> bool:
    jpath = jr.journal_path(path)
    return os.path.exists(path) or os.path.exists(jpath) or bool(jr.abandoned_temps(jpath))


def _rank_files_beside(path: str) -> Dict[int, str]:
    r0 = rank_dump_path(path, 0)
    d, name0 = os.path.split(r0)
    at = name0.rfind(".rank0")
    prefix, suffix = name0[:at + 5], name0[at + 6:]
    found = {}
    try:
        names = os.listdir(d or ".")
    except OSError:
        return found
    for name in names:
        if name.endswith(".journal") and len(name) > len(".journal"):
            name = name[:-len(".journal")]
        if len(name) <= len(prefix) + len(suffix) or not name.startswith(prefix) or not name.endswith(suffix):
            continue
        digits = name[len(prefix):len(name) - len(suffix)]
        if digits.isdigit() and len(digits) <= 6:
            found[int(digits)] = rank_dump_path(path, int(digits))
    return dict(sorted(found.items()))


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
