"""The dump journal, FILE.h5.journal, byte for byte as probes/journal.h/.cpp write and read it: an append-only file
of CRC'd records that the C++ reader (read_dump, `mla-bisect inspect`) folds into FILE.h5 when its writer died.

Record:  [u32 magic 0x4A4C4D41][u32 type][u64 length][payload][u32 crc32 (zlib's) of the payload], little-endian.
Types:   1 header (magic string, version 1, the meta as JSON, the inputs), 2 probe, 3 stage marker, 4 finish.
A reader keeps every intact record up to the first truncated one or one that fails its CRC. The writer holds an
exclusive flock on the journal for its whole life: a reader that cannot take the lock knows the writer is alive.
"""
import errno
import fcntl
import json
import mmap
import os
import stat
import struct
import sys
import threading
import zlib
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

RECORD_MAGIC = 0x4A4C4D41
VERSION = 2  # 2: the header's inputs carry DSA's index cache (a layer count, then one tensor a layer)
HEADER_MAGIC = b"mla-bisect-journal"
HEADER, PROBE, STAGE, FINISH, WEIGHT = 1, 2, 3, 4, 5  # WEIGHT: a layer weight's record, the probe payload
_HEAD = struct.Struct("<IIQ")
_LEVELS = ("stats", "sketch", "full")


class FormatError(ValueError):
    """A record whose CRC is good but whose payload does not parse."""


def journal_path(dump_path: str) -> str:
    return dump_path + ".journal"


# --- encoding --------------------------------------------------------------------------------------------------

_LITTLE = sys.byteorder == "little"


def _le(a: np.ndarray, dtype) -> np.ndarray:
    """`a` as a contiguous little-endian array of `dtype` (no copy when it already is one)."""
    a = np.ascontiguousarray(np.asarray(a if a is not None else [], dtype=dtype)).reshape(-1)
    return a if _LITTLE else a.astype(np.dtype(dtype).newbyteorder("<"))


_BIG = 1 << 16  # parts of a payload from this size on are written from their own buffer


class _Out:
    """A payload as a list of parts: packed fields (bytes) and arrays (little-endian, contiguous, not copied)."""

    def __init__(self):
        self.parts = []

    def u32(self, v): self.parts.append(struct.pack("<I", v))
    def i32(self, v): self.parts.append(struct.pack("<i", v))
    def u64(self, v): self.parts.append(struct.pack("<Q", v))
    def i64(self, v): self.parts.append(struct.pack("<q", v))
    def f64(self, v): self.parts.append(struct.pack("<d", v))

    def str(self, s):
        b = s.encode() if isinstance(s, str) else bytes(s)
        self.u64(len(b))
        self.parts.append(b)

    def vec(self, arr, dtype):
        a = _le(arr, dtype)
        self.u64(a.size)
        self.parts.append(a)

    def tensor(self, arr):
        if arr is None:
            self.vec([], np.int64)
            self.vec([], np.float32)
            return
        a = np.asarray(arr, dtype=np.float32)
        self.vec(a.shape, np.int64)
        self.vec(a, np.float32)

    def take(self) -> bytes:
        return b"".join(self.parts)

    def buffers(self) -> list:
        """The payload as few buffers: runs of small parts joined, arrays of 64 KiB or more left as they are."""
        out, small = [], []
        for p in self.parts:
            if isinstance(p, np.ndarray) and p.nbytes >= _BIG:
                if small:
                    out.append(b"".join(small))
                    small = []
                out.append(p)
            else:
                small.append(p)
        if small:
            out.append(b"".join(small))
        return out


def encode_header(meta: dict, inputs: Optional[dict]) -> bytes:
    """meta: the JSON object the C++ header carries (engine ... git_sha); inputs: the /inputs arrays or None."""
    return _header(meta, inputs).take()


def encode_header_parts(meta: dict, inputs: Optional[dict]) -> list:
    """encode_header's payload as buffers (Writer.append takes them; the arrays are not copied)."""
    return _header(meta, inputs).buffers()


def header_meta_text(meta: dict) -> str:
    """The header's metadata JSON (a transformers config may hold odd values: they are written as strings)."""
    return json.dumps(meta, separators=(",", ":"), default=str)


def _header(meta: dict, inputs: Optional[dict]) -> _Out:
    o = _Out()
    o.str(HEADER_MAGIC)
    o.u32(VERSION)
    o.str(header_meta_text(meta))
    o.u32(1 if inputs is not None else 0)
    if inputs is not None:
        o.tensor(inputs["x"])
        o.vec(inputs["seq_lens"], np.int32)
        o.vec(inputs["context_lens"], np.int32)
        o.vec(inputs["positions"], np.int32)
        o.vec(inputs["token_seq"], np.int32)
        o.vec(inputs["block_table"], np.int32)
        o.i32(int(inputs["block_table"].shape[1]))
        o.i32(int(inputs["num_blocks"]))
        kv = inputs.get("kv_cache")
        o.u64(0 if kv is None else kv.shape[0])
        if kv is not None:
            for layer in kv:
                o.tensor(layer)
        index = inputs.get("index_cache")
        o.u64(0 if index is None else index.shape[0])
        if index is not None:
            for layer in index:
                o.tensor(layer)
    return o


def encode_probe(layer: int, rank: int, spec, rec: dict) -> bytes:
    return _probe(layer, rank, spec, rec).take()


def encode_probe_parts(layer: int, rank: int, spec, rec: dict) -> list:
    """encode_probe's payload as buffers: the record's data (level full), the payload's last field, is the caller's
    float32 array itself, never copied (Writer.append writes it straight from there)."""
    return _probe(layer, rank, spec, rec).buffers()


def _probe(layer: int, rank: int, spec, rec: dict) -> _Out:
    o = _Out()
    o.i32(layer)
    o.i32(rank)
    o.str(spec.name)
    o.str(spec.stage)
    o.str(spec.contract)
    o.vec(spec.shape, np.int64)
    o.i32(spec.order)
    o.i32(spec.heads_axis)
    o.i32(spec.rope_from)
    o.vec(rec["shape"], np.int64)
    o.str(rec["dtype"])
    for k in ("l2", "absmax", "mean", "std"):
        o.f64(rec[k])
    o.i64(rec["nan"])
    o.i64(rec["inf"])
    o.u64(rec["checksum"])
    o.vec(rec["token_l2"], np.float32)
    o.vec(rec["head_l2"], np.float32)
    o.vec(rec["sketch"], np.float32)
    o.u32(_LEVELS.index(rec["level"]))
    o.tensor(rec["data"])
    return o


def encode_stage(layer: int, stage: str, rank: int) -> bytes:
    o = _Out()
    o.i32(layer)
    o.str(stage)
    o.i32(rank)
    return o.take()


def encode_finish(status: str) -> bytes:
    o = _Out()
    o.str(status)
    return o.take()


def frame(rtype: int, payload: bytes) -> bytes:
    return _HEAD.pack(RECORD_MAGIC, rtype, len(payload)) + payload + struct.pack("<I", zlib.crc32(payload))


def _crc(parts, crc: int = 0) -> int:
    for p in parts:
        crc = zlib.crc32(p, crc)
    return crc


# --- decoding --------------------------------------------------------------------------------------------------

class _In:
    def __init__(self, buf, copy):
        self.buf = memoryview(buf)
        self.pos = 0
        self.copy = copy

    def _need(self, k):
        if k > len(self.buf) - self.pos:
            raise FormatError("record ends early")

    def _unpack(self, fmt, size):
        self._need(size)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return v

    def u32(self): return self._unpack("<I", 4)
    def i32(self): return self._unpack("<i", 4)
    def u64(self): return self._unpack("<Q", 8)
    def i64(self): return self._unpack("<q", 8)
    def f64(self): return self._unpack("<d", 8)

    def bytes(self):
        n = self.u64()
        self._need(n)
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def str(self):
        return self.bytes().decode("utf-8", errors="replace")

    def vec(self, dtype):
        n = self.u64()
        size = np.dtype(dtype).itemsize
        if n > (len(self.buf) - self.pos) // size:
            raise FormatError(f"array of {n} runs past the record")
        a = np.frombuffer(self.buf, dtype=np.dtype(dtype).newbyteorder("<"), count=n, offset=self.pos)
        self.pos += n * size
        return a.copy() if self.copy else a

    def tensor(self):
        shape = self.vec(np.int64)
        data = self.vec(np.float32)
        if shape.size == 0 and data.size == 0:
            return None
        if (shape < 0).any():
            raise FormatError("negative extent in a tensor shape")
        if int(np.prod(shape)) != data.size:
            raise FormatError(f"tensor of shape {list(shape)} holds {data.size} values")
        return data.reshape(tuple(int(d) for d in shape))

    def done(self):
        if self.pos != len(self.buf):
            raise FormatError(f"{len(self.buf) - self.pos} unread bytes at the end of a record")


def decode_header(payload) -> dict:
    i = _In(payload, True)
    if i.bytes() != HEADER_MAGIC:
        raise FormatError("not an mla-bisect journal (bad header magic)")
    version = i.u32()
    if version != VERSION:
        raise FormatError(f"journal version {version} (this reader reads {VERSION})")
    try:
        meta = json.loads(i.str())
    except json.JSONDecodeError as e:
        raise FormatError(f"header metadata: {e}") from None
    out = {"meta": meta, "inputs": None}
    if i.u32():
        x = i.tensor()
        seq_lens = i.vec(np.int32)
        context_lens = i.vec(np.int32)
        positions = i.vec(np.int32)
        token_seq = i.vec(np.int32)
        block_table = i.vec(np.int32)
        max_blocks = i.i32()
        num_blocks = i.i32()
        layers = i.u64()
        if layers > (1 << 20):
            raise FormatError("implausible layer count in the header")
        kv = [i.tensor() for _ in range(layers)]
        index_layers = i.u64()
        if index_layers > (1 << 20):
            raise FormatError("implausible index cache layer count in the header")
        index = [i.tensor() for _ in range(index_layers)]
        B = seq_lens.size
        if block_table.size != B * max_blocks:
            raise FormatError("block table size does not match its sequences and columns")
        out["inputs"] = {
            "x": x, "positions": positions, "seq_lens": seq_lens, "context_lens": context_lens,
            "block_table": block_table.reshape(B, max_blocks), "num_blocks": num_blocks, "token_seq": token_seq,
            "kv_cache": np.stack(kv) if kv else None,
            "index_cache": np.stack(index) if index else None,
        }
    i.done()
    return out


def decode_probe(payload, copy=True) -> dict:
    i = _In(payload, copy)
    e = {"layer": i.i32(), "rank": i.i32(), "name": i.str(), "stage": i.str(), "contract": i.str()}
    e["shape"] = tuple(int(d) for d in i.vec(np.int64))
    e["order"] = i.i32()
    e["heads_axis"] = i.i32()
    e["rope_from"] = i.i32()
    rec = {"shape": tuple(int(d) for d in i.vec(np.int64)), "dtype": i.str()}
    for k in ("l2", "absmax", "mean", "std"):
        rec[k] = i.f64()
    rec["nan"] = i.i64()
    rec["inf"] = i.i64()
    rec["checksum"] = i.u64()
    rec["token_l2"] = i.vec(np.float32)
    head_l2 = i.vec(np.float32)
    sketch = i.vec(np.float32)
    level = i.u32()
    if level > 2:
        raise FormatError("bad probe level")
    rec["level"] = _LEVELS[level]
    rec["data"] = i.tensor()
    i.done()
    if e["layer"] < 0 or e["rank"] < 0 or not e["name"]:
        raise FormatError("bad probe record key")
    T = e["shape"][0] if e["shape"] else 0
    rec["head_l2"] = head_l2.reshape(T, -1) if head_l2.size and T else None
    rec["sketch"] = sketch.reshape(T, -1) if sketch.size and T else None
    e["rec"] = rec
    return e


def decode_stage(payload) -> dict:
    i = _In(payload, True)
    e = {"layer": i.i32(), "stage": i.str(), "rank": i.i32()}
    i.done()
    if e["layer"] < 0 or e["rank"] < 0:
        raise FormatError("bad stage marker")
    return e


def decode_finish(payload) -> str:
    i = _In(payload, True)
    s = i.str()
    i.done()
    return s


# --- scanning --------------------------------------------------------------------------------------------------

@dataclass
class Record:
    type: int
    payload: memoryview
    offset: int


@dataclass
class Scan:
    records: List[Record]
    good_bytes: int
    total_bytes: int
    problem: str
    buffer: object  # what the payloads view (keep it alive while they are used)


def scan_fd(fd: int) -> Scan:
    """Every intact record of the journal open at `fd`, up to the first bad one (probes/journal.cpp scan)."""
    total = os.fstat(fd).st_size
    if total == 0:
        return Scan([], 0, 0, "", b"")
    buf = mmap.mmap(fd, total, prot=mmap.PROT_READ)
    view = memoryview(buf)
    records, off, good, problem = [], 0, 0, ""
    while off < total:
        left = total - off
        if left < _HEAD.size:
            problem = f"truncated record header at byte {off}"
            break
        magic, rtype, length = _HEAD.unpack_from(view, off)
        if magic != RECORD_MAGIC:
            problem = f"bad record magic at byte {off}"
            break
        if rtype < 1 or rtype > 5:
            problem = f"unknown record type {rtype} at byte {off}"
            break
        if length > left - _HEAD.size or left - _HEAD.size - length < 4:
            problem = (f"truncated record at byte {off} ({length} payload bytes announced, {left} bytes left)")
            break
        payload = view[off + _HEAD.size:off + _HEAD.size + length]
        (crc,) = struct.unpack_from("<I", view, off + _HEAD.size + length)
        if zlib.crc32(payload) != crc:
            problem = f"CRC mismatch in the record at byte {off}"
            break
        records.append(Record(rtype, payload, off))
        off += _HEAD.size + length + 4
        good = off
    return Scan(records, good, total, problem, buf)


# --- writing ---------------------------------------------------------------------------------------------------

def sync_dir(path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # best effort: some file systems do not open directories
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _lock(fd: int, path: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise ValueError(f"{path}: another running writer is writing this dump (its journal is locked)") from None
        raise ValueError(f"{path}: cannot lock the dump journal: {e.strerror}") from None


def _create_locked(path: str) -> int:
    """A new file at `path` (a writer's own temporary file: any older one of that name is removed first), locked."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
    _lock(fd, path)
    return fd


def temp_path(path: str, pid: int) -> str:
    """The temporary file a writer of process `pid` fills before it becomes the journal at `path`."""
    return f"{path}.tmp.{pid}"


def abandoned_temps(path: str) -> list:
    """The temporary files beside journal `path` (path.tmp.N) whose writer is gone (their flock can be taken)."""
    d = os.path.dirname(os.path.abspath(path))
    prefix = os.path.basename(path) + ".tmp."
    out = []
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for name in names:
        if not name.startswith(prefix) or not name[len(prefix):].isdigit():
            continue
        p = os.path.join(d, name)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                out.append(p)
        except OSError:
            pass
        finally:
            os.close(fd)
    return sorted(out)


_CRC_ASIDE = 1 << 20  # payload bytes from which append() computes the CRC beside the write
_helper_pool = {}  # pid -> executor: a forked child makes its own (the parent's thread is not in it)
_helper_lock = threading.Lock()


def helper():
    """The writers' helper thread (an executor of one): a large record's CRC-32 beside its write."""
    pid = os.getpid()
    pool = _helper_pool.get(pid)
    if pool is None:
        with _helper_lock:
            pool = _helper_pool.get(pid)
            if pool is None:
                import concurrent.futures
                _helper_pool.clear()
                pool = _helper_pool[pid] = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="mla-journal")
    return pool


_writeback = []  # sync_file_range, or None where there is none (looked up on first use)


def start_writeback(fd: int, offset: int = 0, nbytes: int = 0) -> None:
    """Starts writing the file's dirty pages in [offset, offset + nbytes) (nbytes 0: to the end) to the disk, without
    waiting for them (Linux sync_file_range, SYNC_FILE_RANGE_WRITE), so that a later fsync finds the work done. It
    guarantees nothing itself; where the call is missing it does nothing."""
    if not _writeback:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _writeback.append(fn)
    if _writeback[0] is not None:
        _writeback[0](fd, offset, nbytes, 2)  # SYNC_FILE_RANGE_WRITE; an error leaves it to the fsync


def drop_cache(fd: int) -> None:
    """Lets the kernel free the file's cached pages that are on the disk (posix_fadvise DONTNEED; where that is
    missing, nothing)."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError):
        pass


def _write_all(fd: int, bufs) -> None:
    """Writes the buffers in order with writev(2), again from where a short write stopped."""
    views = [v for v in (memoryview(b).cast("B") for b in bufs) if v.nbytes]
    while views:
        n = os.writev(fd, views[:1024])
        while n:
            if n >= views[0].nbytes:
                n -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][n:]
                n = 0


def _append(fd: int, rtype: int, parts: list) -> int:
    """One framed record of payload `parts` (buffers, written as they are) appended to `fd`; returns its size."""
    length = sum(memoryview(p).nbytes for p in parts)
    head = _HEAD.pack(RECORD_MAGIC, rtype, length)
    if length < _CRC_ASIDE:
        _write_all(fd, [head, *parts, struct.pack("<I", _crc(parts))])
    else:
        pending = helper().submit(_crc, parts)
        try:
            _write_all(fd, [head, *parts])
        finally:
            crc = pending.result()
        _write_all(fd, [struct.pack("<I", crc)])
    return _HEAD.size + length + 4


class Writer:
    """The journal is never emptied in place: records go to a temporary file beside it (path.tmp.PID), and the
    first sync() (after the header) fsyncs it and renames it over the journal, so the journal path holds either the
    previous journal (or nothing) or the new one with its header. The writer holds the flock of its file, and of the
    journal it replaces until the rename. append() writes a record's framing and payload with one writev(2) straight
    from the payload's buffers; a payload of 1 MiB or more has its CRC-32 computed on a helper thread meanwhile and
    written after it (a reader takes a record without its CRC for a truncated one and drops it). The kernel keeps
    what was written when the process dies; sync() (fsync) makes it survive the machine."""

    def __init__(self, path: str):
        self.path = path
        self.old_fd = -1
        for attempt in range(4):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                break
            except OSError as e:
                raise ValueError(f"{path}: cannot open the dump journal: {e.strerror}") from None
            _lock(fd, path)
            held = os.fstat(fd)
            try:
                now = os.stat(path)
                if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                    self.old_fd = fd
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # another writer put its journal there meanwhile: again
        else:
            raise ValueError(f"{path}: another running writer is writing this dump")
        for t in abandoned_temps(path):
            try:
                os.unlink(t)
            except OSError:
                pass
        self.tmp = temp_path(path, os.getpid())
        try:
            self.fd = _create_locked(self.tmp)
        except OSError as e:
            self._close_old()
            raise ValueError(f"{self.tmp}: cannot create the dump journal: {e.strerror}") from None
        except ValueError:
            self._close_old()
            raise
        self.published = False
        self.header_end = 0  # end of the header record
        self.size = 0        # bytes written: the offset of the next record

    def _close_old(self) -> None:
        if self.old_fd >= 0:
            os.close(self.old_fd)
            self.old_fd = -1

    def _publish(self) -> None:
        placed = False
        if self.old_fd < 0:
            try:  # no journal was there: link() puts this one in place only if none appeared meanwhile
                os.link(self.tmp, self.path)
                os.unlink(self.tmp)
                placed = True
            except FileExistsError:
                raise ValueError(f"{self.path}: another running writer started writing this dump") from None
            except OSError:
                pass  # a file system without hard links: rename
        if not placed:
            os.rename(self.tmp, self.path)
        self.published = True
        self._close_old()

    def append(self, rtype: int, payload) -> int:
        """Appends one record; payload: bytes, or a list of buffers (encode_*_parts) that are written as they are.
        Returns the record's offset in the file."""
        start = self.size
        n = _append(self.fd, rtype, [payload] if isinstance(payload, (bytes, bytearray)) else payload)
        self.size += n
        if n >= _CRC_ASIDE:
            start_writeback(self.fd, start, n)  # on the disk by the time sync() asks for it
        return start

    def sync(self) -> None:
        os.fsync(self.fd)
        if not self.published:
            self._publish()
        sync_dir(self.path)

    def replace_header(self, payload) -> None:
        """A new header record in front of every record after the old one, swapped in atomically: the new journal
        is written beside the old one, locked, fsynced and renamed over it, so a reader sees one or the other.
        payload: bytes or a list of buffers, as append() takes it."""
        if not self.published:
            self.sync()
        tmp = temp_path(self.path, os.getpid())
        fd = _create_locked(tmp)
        try:
            header = _append(fd, HEADER, [payload] if isinstance(payload, (bytes, bytearray)) else payload)
            off, size = self.header_end, self.size
            while off < size:
                chunk = os.pread(self.fd, min(1 << 24, size - off), off)
                if not chunk:
                    raise OSError(errno.EIO, f"{self.path}: the journal ends at byte {off} of {size}")
                _write_all(fd, [chunk])
                off += len(chunk)
            os.fsync(fd)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        os.close(self.fd)  # the old inode is unlinked: a reader holding it sees st_nlink 0 and lets it be
        self.fd = fd
        self.size = header + (self.size - self.header_end)
        self.header_end = header
        sync_dir(self.path)

    def remove(self) -> None:
        try:
            os.unlink(self.path if self.published else self.tmp)
        except FileNotFoundError:
            pass
        sync_dir(self.path)
        self.close()

    def close(self) -> None:
        self._close_old()
        if self.fd >= 0 and not self.published:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
            self.published = True
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
