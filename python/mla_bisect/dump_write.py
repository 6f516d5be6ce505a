"""DumpWriter: writes one dump from Python through the journal (mla_bisect.dump's docstring says what it records,
how it survives a crash, and how the ranks of one capture write theirs)."""
import json
import os
import shlex
import sys
import threading
import time
import warnings
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import __version__
from . import hashing
from . import journal as jr
from .dump_h5 import _JournalData, write_h5
from .dump_journal import _attrs_from_meta
from .dump_ranks import _resolve_process_rank, launch_id_from_env, rank_dump_path
from .dump_types import Dump, Inputs, Probe, Record
from .graph import PAGE_SIZE, ProbeSpec, build_graph, config_dict, default_form, parse_hf_config, probe_request
from .tensors import _fit_shape, _int_array, tensor_values

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
    """Writes one dump (mla_bisect.dump's docstring). Arguments:
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
    process_rank  None | r | "auto";  launch_id: see mla_bisect.dump's docstring
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
            if isinstance(kv_cache_scale, bool) \
                    or not isinstance(kv_cache_scale, (int, float, np.floating, np.integer)) \
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
