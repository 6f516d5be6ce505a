"""What a dump holds, as read_dump returns it and DumpWriter keeps it: the Dump with its Inputs, its Probes and each
rank's Record (probes/dump.h); the format's name and schema versions; DumpError. The layout on disk is
docs/dump-format.md; mla_bisect.dump describes the whole package side."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

FORMAT = "mla-bisect-dump"
SCHEMA_VERSION = 1  # what this writer writes (no /weights)
READ_SCHEMA_VERSIONS = (1, 2)  # 2: version 1 plus the optional /weights group (C++ runs that record weights)


class DumpError(ValueError):
    """A dump that cannot be read: missing, truncated, foreign, or a rank set whose parts do not belong together."""


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
