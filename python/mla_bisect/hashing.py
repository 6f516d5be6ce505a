"""Probe records computed in numpy exactly as the C++ side computes them (core/probe/probe.cpp compute_probe_record,
core/probe/probe_hash.h): stats, per-token and per-head L2 maps, the sketch, and the checksum over raw bit patterns.

Exactness: the checksum is bit for bit the C++ one; l2/mean/std/absmax and token_l2/head_l2 are summed
left to right in float64 as the C++ loops do (numpy's cumulative sums are sequential), so they match bit for bit
too (np.add.accumulate, which adds in order, over each block; the running sums carried from block to block); the sketch
is a float64 matrix product (summation order differs from the C++ loop: equal to float rounding). The checksum, a
sum mod 2^64 that is linear in its terms, is taken as a uint64 matrix-vector product and column sums (checksum).
The C extension (_hashing_ext.c, compiled on first use: _ext) runs every loop, the sketch's too, in the C++ order.

Checksum bits per dtype: fp32 the float's 32-bit pattern; bf16 / fp16 the 16-bit pattern the C++ conversions
(to_bf16_bits / to_fp16_bits of core/model/tensor.cpp: round to nearest even, NaN made quiet) give for the
stored float32 value; fp8_e4m3 / fp8_e5m2 (a Python-side extension, the 8-bit analogue) the 8-bit code of the
stored value in OCP float8 e4m3fn / e5m2 (exact: an fp8 value converts to float32 without rounding), NaN
canonicalised to sign|0x7f (e4m3) or sign|0x7e (e5m2). The term of each element is multiplier(row, col) *
(2 * bits + 1) mod 2^64 for every dtype, so the 8-bit checksum keeps the 16/32-bit one's guarantees.
"""
import concurrent.futures
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading

import numpy as np

SKETCH_DIM = 32
SKETCH_SCALE = np.float32(0.17677669529663687)  # 1/sqrt(32) as float32, as kSketchScale
CHECKSUM_STEP = np.uint64(0x9E3779B97F4A7C16)
CHECKSUM_BASE = np.uint64(0xD1B54A32D192ED03)
LEVELS = ("stats", "sketch", "full")  # ProbeLevel enumerators 0, 1, 2
DTYPES = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2")

_U = np.uint64
_ROW_CHUNK_ELEMS = 1 << 22  # elements per block of rows (bounds temporaries to tens of MB)


def fnv1a(data: bytes, h: int = 1469598103934665603) -> int:
    for b in data:
        h ^= b
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def probe_key(name: str) -> int:
    """Seed of a probe's sketch matrix: FNV-1a of its name (core/probe/probe.cpp probe_key)."""
    return fnv1a(name.encode())


def splitmix64(x):
    x = np.asarray(x, dtype=_U)
    with np.errstate(over="ignore"):
        x = x + _U(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U(30))) * _U(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U(27))) * _U(0x94D049BB133111EB)
    return x ^ (x >> _U(31))


def sketch_coeffs(key: int, col_offset: int, cols: int) -> np.ndarray:
    """[cols, 32] float32: sketch_coeff(key, col_offset + c, lane), +-1/sqrt(32) by the sign bit of a counter hash."""
    c = np.arange(col_offset, col_offset + cols, dtype=_U)[:, None]
    lane = np.arange(SKETCH_DIM, dtype=_U)[None, :]
    with np.errstate(over="ignore"):
        h = splitmix64(_U(key) ^ splitmix64(c * _U(SKETCH_DIM) + lane))
    return np.where((h >> _U(63)) != 0, SKETCH_SCALE, -SKETCH_SCALE).astype(np.float32)


def _pow_mod64(base, e):
    r = np.ones_like(e)
    b = np.full_like(e, base)
    e = e.copy()
    with np.errstate(over="ignore"):
        while e.any():
            r = np.where(e & _U(1), r * b, r)
            b = b * b
            e >>= _U(1)
    return r


def _checksum_weights(cols: int):
    """(power, step) per column: A^(col >> 3) and step * (col & 7), mod 2^64."""
    col = np.arange(cols, dtype=_U)
    with np.errstate(over="ignore"):
        return _pow_mod64(CHECKSUM_BASE, col >> _U(3)), CHECKSUM_STEP * (col & _U(7))


def checksum(bits: np.ndarray) -> int:
    """Sum mod 2^64 of (H(row) * A^(col >> 3) + step * (col & 7)) * (2 * bits + 1) over bits viewed as [rows, cols].

    The sum is linear mod 2^64, so it is taken as sum_r H(r) * (sum_c A^(c>>3) * (2 b + 1)) + sum_c step_c *
    (sum_r (2 b + 1)): a matrix-vector product and column sums in uint64 (wrapping), the same bits as the
    element-by-element sum."""
    rows, cols = bits.shape
    power, step = _checksum_weights(cols)
    power_sum = power.sum(dtype=_U)
    total = _U(0)
    chunk = max(1, _ROW_CHUNK_ELEMS // max(cols, 1))
    with np.errstate(over="ignore"):
        colsum = np.zeros(cols, dtype=_U)
        for r0 in range(0, rows, chunk):
            b = bits[r0:r0 + chunk].astype(_U)
            h = splitmix64(np.arange(r0, r0 + b.shape[0], dtype=_U)) | _U(1)
            per_row = _U(2) * (b @ power) + power_sum  # sum_c A^(c>>3) * (2 b + 1)
            total = total + (h * per_row).sum(dtype=_U)
            colsum += b.sum(axis=0, dtype=_U)
        total = total + (step * (_U(2) * colsum + _U(rows))).sum(dtype=_U)
    return int(total)


# --- bit patterns ----------------------------------------------------------------------------------------------

def to_bf16_bits(v: np.ndarray) -> np.ndarray:
    """core/model/tensor.cpp to_bf16_bits over float32 values: round to nearest even, NaN -> (u >> 16) | 0x40."""
    u = np.ascontiguousarray(v, dtype=np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    with np.errstate(over="ignore"):
        r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), r).astype(np.uint16)


def to_fp16_bits(v: np.ndarray) -> np.ndarray:
    """core/model/tensor.cpp to_fp16_bits over float32 values (round to nearest even, NaN -> sign|0x7e00)."""
    f = np.ascontiguousarray(v, dtype=np.float32)
    x = f.view(np.uint32)
    sign = (x >> np.uint32(16)) & np.uint32(0x8000)
    ax = x & np.uint32(0x7FFFFFFF)
    # normal range
    mant = ax & np.uint32(0x7FFFFF)
    with np.errstate(over="ignore"):
        exp = (ax >> np.uint32(23)) - np.uint32(127 - 15)
        h = (exp << np.uint32(10)) | (mant >> np.uint32(13))
    rest = mant & np.uint32(0x1FFF)
    up = (rest > np.uint32(0x1000)) | ((rest == np.uint32(0x1000)) & ((h & np.uint32(1)) == 1))
    with np.errstate(over="ignore"):
        normal = h + up.astype(np.uint32)
    # subnormal or zero: round |f| * 2^24 to nearest even
    with np.errstate(over="ignore", invalid="ignore"):
        sub = np.rint(np.abs(f) * np.float32(16777216.0)).astype(np.float32)
    sub = np.where(ax < np.uint32(0x38800000), sub, 0).astype(np.uint32)
    out = np.where(ax < np.uint32(0x38800000), sub, normal)
    out = np.where(ax >= np.uint32(0x477FF000), np.uint32(0x7C00), out)
    out = np.where(ax > np.uint32(0x7F800000), np.uint32(0x7E00), out)
    return (sign | out).astype(np.uint16)


def _fp8_table(exp_bits: int) -> np.ndarray:
    """float32 value of each of the 256 codes of OCP float8 e4m3fn (exp_bits 4) or e5m2 (exp_bits 5)."""
    mant_bits = 7 - exp_bits
    bias = (1 << (exp_bits - 1)) - 1
    out = np.empty(256, dtype=np.float32)
    for code in range(256):
        s = -1.0 if code & 0x80 else 1.0
        e = (code >> mant_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << mant_bits) - 1)
        if exp_bits == 4 and e == 15 and m == 7:
            val = float("nan")
        elif exp_bits == 5 and e == 31:
            val = float("inf") * s if m == 0 else float("nan")
        elif e == 0:
            val = s * m / (1 << mant_bits) * 2.0 ** (1 - bias)
        else:
            val = s * (1 + m / (1 << mant_bits)) * 2.0 ** (e - bias)
        out[code] = val
    return out


_FP8 = {"fp8_e4m3": _fp8_table(4), "fp8_e5m2": _fp8_table(5)}
_FP8_NAN = {"fp8_e4m3": 0x7F, "fp8_e5m2": 0x7E}


def fp8_to_float(codes: np.ndarray, dtype: str) -> np.ndarray:
    return _FP8[dtype][np.asarray(codes, dtype=np.uint8)]


def to_fp8_bits(v: np.ndarray, dtype: str):
    """The fp8 code of each float32 value. Returns (codes, bad): bad is a flat index of a value the format cannot
    hold exactly (codes are then meaningless), or -1."""
    table = _FP8[dtype]
    finite_codes = np.array([c for c in range(256) if not np.isnan(table[c])], dtype=np.uint8)
    keys = table[finite_codes].view(np.uint32)
    order = np.argsort(keys)
    keys, finite_codes = keys[order], finite_codes[order]
    f = np.ascontiguousarray(v, dtype=np.float32)
    u = f.view(np.uint32)
    pos = np.clip(np.searchsorted(keys, u), 0, len(keys) - 1)
    found = keys[pos] == u
    nan = np.isnan(f)
    codes = np.where(nan, np.uint8(_FP8_NAN[dtype]) | ((u >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8),
                     finite_codes[pos])
    bad = np.flatnonzero(~(found | nan).reshape(-1))
    return codes.astype(np.uint8), (int(bad[0]) if bad.size else -1)


def checksum_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """The raw patterns the checksum covers for float32 `values` recorded as `dtype` (module docstring)."""
    if dtype == "bf16":
        u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        if not (u & np.uint32(0xFFFF)).any():  # bf16 values already (a bf16 tensor): the high half is the pattern,
            hi = (u >> np.uint32(16)).astype(np.uint16)  # unless a NaN needs its quiet bit set
            nan = (hi & np.uint16(0x7FFF)) > np.uint16(0x7F80)
            return hi if not nan.any() else to_bf16_bits(values)
        return to_bf16_bits(values)
    if dtype == "fp16":
        return to_fp16_bits(values)
    if dtype in _FP8:
        codes, bad = to_fp8_bits(values, dtype)
        if bad >= 0:
            raise ValueError(f"value {values.reshape(-1)[bad]!r} at flat index {bad} is not an {dtype} value")
        return codes
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


# --- the record --------------------------------------------------------------------------------------------------

def _seq_sum(a: np.ndarray, axis: int) -> np.ndarray:
    """Left-to-right float64 sum along `axis` (the C++ loops' order; np.sum would sum pairwise)."""
    if a.shape[axis] == 0:
        return np.zeros(np.delete(a.shape, axis), dtype=np.float64)
    return np.take(np.cumsum(a, axis=axis, dtype=np.float64), -1, axis=axis)


def _running_sum(a: np.ndarray, start: float, buf: np.ndarray) -> float:
    """start + a[0] + a[1] + ... summed left to right in float64 (the C++ loop's order), through buf."""
    if a.size == 0:
        return start
    first = a[0]
    a[0] = start + first  # the previous blocks' sum carried into the first term, as the sequential loop does
    np.add.accumulate(a, out=buf[:a.size])
    a[0] = first
    return float(buf[a.size - 1])


# --- the C extension -----------------------------------------------------------------------------------------------
# _hashing_ext.c, next to this file, compiled on first use with the system C compiler ($CC, else cc) into a cache
# outside the package ($MLA_BISECT_CACHE, else $XDG_CACHE_HOME/mla-bisect or ~/.cache/mla-bisect, folder ext/; the
# file name carries a hash of the source, the compiler and the platform) and loaded with ctypes. Where there is no
# compiler or anything fails, compute_record stays in numpy, silently. MLA_BISECT_NO_EXT=1 keeps it in numpy.

_EXT_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_hashing_ext.c")
_EXT_FLAGS = ["-O3", "-std=c99", "-fPIC", "-shared", "-fno-fast-math", "-fno-finite-math-only"]
_EXT_STATE = {}
_EXT_LOCK = threading.Lock()
_PARALLEL_ELEMS = 1 << 18  # tensors from this size on are split over the worker threads


def _ext_cache_dir() -> str:
    root = os.environ.get("MLA_BISECT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "mla-bisect")
    return os.path.join(root, "ext")


def _build_ext():
    with open(_EXT_SOURCE, "rb") as f:
        src = f.read()
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        return None
    tag = hashlib.sha256(src + repr((cc, _EXT_FLAGS, platform.machine(), platform.system(),
                                    sys.implementation.cache_tag)).encode()).hexdigest()[:16]
    out_dir = _ext_cache_dir()
    lib = os.path.join(out_dir, f"hashing_{tag}.so")
    if not os.path.exists(lib):
        os.makedirs(out_dir, exist_ok=True)
        tmp = f"{lib}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            r = subprocess.run(cc.split() + _EXT_FLAGS + ["-o", tmp, _EXT_SOURCE, "-lm"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=120)
            if r.returncode != 0 or not os.path.exists(tmp):
                return None
            os.replace(tmp, lib)  # atomic: concurrent processes each build, one file wins
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    h = ctypes.CDLL(lib)
    if h.mla_hash_abi() != 1:
        return None
    i64, u64, dp, fp = ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p
    h.mla_sketch_coeffs.argtypes = [u64, i64, i64, dp]
    h.mla_sketch_coeffs.restype = None
    h.mla_seq_stats.argtypes = [fp, i64, dp, dp]
    h.mla_seq_stats.restype = None
    h.mla_rows.argtypes = [fp, i64, i64, i64, ctypes.c_int, dp, i64, dp, fp, fp, fp]
    h.mla_rows.restype = u64
    return h


def _ext():
    """The loaded C extension, or None (numpy path). Built once per process, on first use."""
    if "lib" not in _EXT_STATE:
        with _EXT_LOCK:
            if "lib" not in _EXT_STATE:
                lib = None
                if os.environ.get("MLA_BISECT_NO_EXT", "") in ("", "0"):
                    try:
                        lib = _build_ext()
                    except Exception:  # no compiler, no writable cache, a failed load: numpy does the work
                        lib = None
                _EXT_STATE["lib"] = lib
    return _EXT_STATE["lib"]


def _threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 4))


def _pool():
    if "pool" not in _EXT_STATE:
        with _EXT_LOCK:
            if "pool" not in _EXT_STATE:
                n = _threads()
                _EXT_STATE["pool"] = (concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="mla-hash")
                                      if n > 1 else None)
    return _EXT_STATE["pool"]


_DTYPE_CODE = {"fp32": 0, "bf16": 1, "fp16": 2}


def _compute_record_c(values, dtype, T, C, heads, col_offset, key, level) -> dict:
    """compute_record through the C extension (ctypes releases the GIL: the sequential sums and blocks of rows run
    on worker threads side by side; each row's values are the same on any split, the checksum is a sum mod 2^64)."""
    lib = _ext()
    n = values.size
    code = _DTYPE_CODE.get(dtype, 3)
    bits8 = None
    if code == 3:
        bits8 = np.ascontiguousarray(checksum_bits(values, dtype), dtype=np.uint8)  # raises on a value fp8 lacks
    heads = heads if heads > 0 else 0
    token_l2 = np.empty(T, dtype=np.float32)
    head_l2 = np.empty((T, heads), dtype=np.float32) if heads > 0 else None
    coeff = sk = None
    if level != "stats":
        coeff = np.empty((C, SKETCH_DIM), dtype=np.float64)
        lib.mla_sketch_coeffs(_U(key), col_offset, C, coeff.ctypes.data)
        sk = np.empty((T, SKETCH_DIM), dtype=np.float32)
    stats = np.zeros(3, dtype=np.float64)
    counts = np.zeros(2, dtype=np.int64)
    ptr = values.ctypes.data
    args = (code, None if bits8 is None else bits8.ctypes.data, heads, None if coeff is None else coeff.ctypes.data,
            token_l2.ctypes.data, None if head_l2 is None else head_l2.ctypes.data, None if sk is None else sk.ctypes.data)

    def rows(r0, r1):
        return lib.mla_rows(ptr, C, r0, r1, *args)

    pool = _pool() if n >= _PARALLEL_ELEMS else None
    if pool is None:
        lib.mla_seq_stats(ptr, n, stats.ctypes.data, counts.ctypes.data)
        total = rows(0, T)
    else:
        seq = pool.submit(lib.mla_seq_stats, ptr, n, stats.ctypes.data, counts.ctypes.data)
        parts = max(1, min(T, 4 * _threads()))
        edges = [T * i // parts for i in range(parts + 1)]
        futs = [pool.submit(rows, a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
        seq.result()
        total = sum(f.result() for f in futs) & 0xFFFFFFFFFFFFFFFF
    return _record(values, dtype, level, float(stats[0]), float(stats[1]), float(stats[2]), int(counts[0]),
                   int(counts[1]), int(total), token_l2, head_l2, sk)


def compute_record(values: np.ndarray, dtype: str, tokens: int, heads: int, col_offset: int, key: int,
                   level: str = "full") -> dict:
    """compute_probe_record of core/probe/probe.cpp: values is the rank's float32 shard (its local shape), viewed as
    [tokens, cols]. Returns a dict with the fields of a rank record. Runs in the C extension where it loads (see
    _ext), else in numpy: the same record either way."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    n = values.size
    T = tokens if tokens > 0 else 1
    C = n // T
    if C > 0 and n == T * C and (heads <= 0 or C % heads == 0) and _ext() is not None:
        return _compute_record_c(values, dtype, T, C, heads, col_offset, key, level)
    return _compute_record_np(values, dtype, T, C, heads, col_offset, key, level)


def _record(values, dtype, level, s, sq, amax, total_nan, total_inf, checksum_value, token_l2, head_l2, sk) -> dict:
    finite = values.size - total_nan - total_inf
    mean = s / finite if finite else 0.0
    std = float(np.sqrt(max(0.0, sq / finite - mean * mean))) if finite else 0.0
    return {
        "shape": tuple(int(d) for d in values.shape),
        "dtype": dtype,
        "l2": float(np.sqrt(sq)),
        "absmax": amax,
        "mean": mean,
        "std": std,
        "nan": total_nan,
        "inf": total_inf,
        "checksum": checksum_value,
        "level": level,
        "token_l2": token_l2,
        "head_l2": head_l2,
        "sketch": sk,
        "data": values if level == "full" else None,
    }


def _compute_record_np(values, dtype, T, C, heads, col_offset, key, level) -> dict:
    n = values.size
    m = values.reshape(T, C)
    bits = checksum_bits(m, dtype)

    total_nan = total_inf = 0
    s = sq = 0.0
    amax = 0.0
    token_l2 = np.zeros(T, dtype=np.float32)
    head_l2 = np.zeros((T, heads), dtype=np.float32) if heads > 0 else None
    chunk = max(1, _ROW_CHUNK_ELEMS // max(C, 1))
    sk = coeff = None
    if level != "stats":
        coeff = sketch_coeffs(key, col_offset, C).astype(np.float64)
        sk = np.empty((T, SKETCH_DIM), dtype=np.float32)
    buf = np.empty(min(T, chunk) * C, dtype=np.float64)
    row_buf = np.empty((min(T, chunk), C), dtype=np.float64)
    for r0 in range(0, T, chunk):
        blk32 = m[r0:r0 + chunk]
        rows = blk32.shape[0]
        blk = blk32.astype(np.float64)
        flat = blk.reshape(-1)
        if sk is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                sk[r0:r0 + rows] = (blk @ coeff).astype(np.float32)
        sqr = blk * blk
        if np.isfinite(blk32).all():
            fin, fin_sq = flat, sqr.reshape(-1)
        else:
            nan = np.isnan(flat)
            inf = np.isinf(flat)
            total_nan += int(nan.sum())
            total_inf += int(inf.sum())
            ok = ~(nan | inf)
            fin, fin_sq = flat[ok], sqr.reshape(-1)[ok]
        if fin.size:
            # Running sums continue from the previous block, left to right as the C++ loop.
            s = _running_sum(fin, s, buf)
            sq = _running_sum(fin_sq, sq, buf)
            amax = max(amax, float(np.abs(blk32).max() if fin is flat else np.abs(fin).max()))
        rb = row_buf[:rows]
        np.add.accumulate(sqr, axis=1, out=rb)
        token_l2[r0:r0 + rows] = np.sqrt(rb[:, -1]).astype(np.float32)
        if heads > 0:
            X = C // heads
            hb = rb.reshape(rows, heads, X)
            np.add.accumulate(sqr.reshape(rows, heads, X), axis=2, out=hb)
            head_l2[r0:r0 + rows] = np.sqrt(hb[:, :, -1]).astype(np.float32)
    return _record(values, dtype, level, s, sq, amax, total_nan, total_inf, checksum(bits), token_l2, head_l2, sk)
