"""One process per rank: the name of rank R's file (FILE.rank<R>.h5) and the rank files beside a dump's name; the
process's rank from its launcher's environment; the launch id the ranks of one capture agree on (mla_bisect.dump's
docstring, Ranks)."""
import hashlib
import os
import secrets
from typing import Dict, Optional

import numpy as np


def rank_dump_path(path: str, rank: int) -> str:
    """FILE.h5 -> FILE.rank<R>.h5: rank R's file of a one-process-per-rank capture whose name is FILE.h5."""
    d, base = os.path.split(path)
    stem, ext = os.path.splitext(base)
    if not stem:  # ".h5" alone: std::filesystem treats it as a stem without extension
        stem, ext = ext, ""
    return os.path.join(d, f"{stem}.rank{rank}{ext}")


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
    """The launch id every rank of one launch derives alike from its environment (mla_bisect.dump's
    docstring, Ranks), or None."""
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
