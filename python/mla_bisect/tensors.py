"""Tensors in: the float32 values and dtype name of a numpy array or torch tensor, fitted to the shape a probe or
input wants."""
from typing import Optional, Tuple

import numpy as np

from . import hashing


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
