"""Statistics of a host array: msProbe's Max/Min/Mean/Norm plus NaN/Inf counts and CRC-32.

NumPy only, so a rank (``rankscope.probe.tensors.stats``, which adds the MindSpore side) and the
coordinator reading dumped tensors offline (``rankscope analyze``) compute one thing one way.
The hot path touches the data in four SIMD/BLAS passes (max, min, dot with ones for the
sum, dot with itself for the norm) and never copies float32/float64 data. NaN/Inf
counting, the slow part, only runs when max or min is not finite: a finite max and min
prove there is no NaN and no Inf.
"""
from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from rankscope.wire.records import NO_CRC

#: Elements per chunk in the one-pass path: 256 KiB of float32 stays in L2.
_CHUNK = 1 << 16
_ones_cache: dict[np.dtype, np.ndarray] = {}


class TensorStats:
    """Statistics of one tensor. ``max``/``min`` keep the tensor's own kind (bool, int,
    float) for dump.json; :meth:`row` gives the float64 form for a StepBatch."""

    __slots__ = ("dtype", "shape", "max", "min", "mean", "norm", "nan", "inf", "numel", "crc")

    def __init__(self, dtype: str, shape: list[int], mx: Any, mn: Any, mean: float | None,
                 norm: float | None, nan: int, inf: int, numel: int, crc: int = NO_CRC) -> None:
        self.dtype, self.shape = dtype, shape
        self.max, self.min, self.mean, self.norm = mx, mn, mean, norm
        self.nan, self.inf, self.numel, self.crc = nan, inf, numel, crc

    def row(self) -> tuple[float, float, float, float]:
        return (_f(self.max), _f(self.min), _f(self.mean), _f(self.norm))

    def entry(self, data_name: str | None = None) -> dict:
        """The dump.json dict msProbe writes for a tensor, plus rankscope's counts."""
        e = {"type": "mindspore.Tensor", "dtype": self.dtype, "shape": self.shape,
             "Max": self.max, "Min": self.min, "Mean": self.mean, "Norm": self.norm,
             "nan_count": self.nan, "inf_count": self.inf}
        if self.crc != NO_CRC:
            e["md5"] = f"{self.crc:08x}"  # msProbe's md5 summary mode stores a CRC-32 there
        if data_name is not None:
            e["data_name"] = data_name
        return e


def _f(v: Any) -> float:
    return math.nan if v is None else float(v)


def _ones(n: int, dtype: np.dtype) -> np.ndarray:
    buf = _ones_cache.get(dtype)
    if buf is None or buf.shape[0] < n:
        buf = np.ones(max(n, 4096), dtype)
        _ones_cache[dtype] = buf
    return buf[:n]


NP_TO_MS = {"float32": "Float32", "float64": "Float64", "float16": "Float16", "int8": "Int8",
             "int16": "Int16", "int32": "Int32", "int64": "Int64", "uint8": "UInt8",
             "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64", "bool": "Bool"}


def array_stats(arr: np.ndarray, dtype_name: str, crc: bool = False) -> TensorStats:
    """Statistics of a host array whose MindSpore dtype is ``dtype_name``."""
    shape = list(arr.shape)
    n = int(arr.size)
    checksum = crc32_of(arr) if crc else NO_CRC
    if n == 0:
        return TensorStats(dtype_name, shape, None, None, None, None, 0, 0, 0, checksum)
    flat = arr.reshape(-1)
    kind = arr.dtype.kind
    if kind == "b":
        return TensorStats(dtype_name, shape, bool(flat.any()), bool(flat.all()), None, None,
                           0, 0, n, checksum)
    if dtype_name == "BFloat16":  # raw bits -> float32 exactly (bf16 is float32's top half)
        flat = (flat.astype(np.uint32) << 16).view(np.float32)
        kind = "f"
    if kind in "iu":
        mx, mn = int(flat.max()), int(flat.min())
        wide = flat.astype(np.float64)
        return TensorStats(dtype_name, shape, mx, mn, float(wide.sum()) / n,
                           float(math.sqrt(np.dot(wide, wide))), 0, 0, n, checksum)
    if kind != "f":  # complex and anything exotic: shape only, never a wrong number
        return TensorStats(dtype_name, shape, None, None, None, None, 0, 0, n, checksum)
    if flat.dtype == np.float16:
        flat = flat.astype(np.float32)
    if not flat.flags.c_contiguous:
        flat = np.ascontiguousarray(flat)
    if n > _CHUNK * 4:
        mx, mn, total, sq = _chunked(flat)
    else:
        mx, mn = float(flat.max()), float(flat.min())
        total = float(np.dot(flat, _ones(n, flat.dtype)))
        sq = float(np.dot(flat, flat))
    nan = inf = 0
    if not (math.isfinite(mx) and math.isfinite(mn)):
        nan = int(np.count_nonzero(np.isnan(flat)))
        inf = int(np.count_nonzero(np.isinf(flat)))
    if math.isinf(sq) and not inf and not nan:  # float32 overflow of the sum of squares
        sq = float(np.dot(flat.astype(np.float64), flat.astype(np.float64)))
    return TensorStats(dtype_name, shape, mx, mn, total / n, math.sqrt(sq), nan, inf, n, checksum)


def _chunked(flat: np.ndarray) -> tuple[float, float, float, float]:
    """The four reductions chunk by chunk, so each chunk is read from memory once and
    the other three passes hit the cache: one memory pass instead of four for large
    tensors. Partial sums accumulate in float64."""
    ones = _ones(_CHUNK, flat.dtype)
    mx, mn, total, sq = -math.inf, math.inf, 0.0, 0.0
    nanfound = False
    for i in range(0, flat.shape[0], _CHUNK):
        c = flat[i:i + _CHUNK]
        cmx, cmn = float(c.max()), float(c.min())
        if cmx != cmx or cmn != cmn:  # NaN: max/min propagate it, like the one-shot path
            nanfound = True
        mx, mn = max(mx, cmx), min(mn, cmn)
        total += float(np.dot(c, ones[:c.shape[0]]))
        sq += float(np.dot(c, c))
    if nanfound:
        mx = mn = math.nan
    return mx, mn, total, sq


def crc32_of(arr: np.ndarray) -> int:
    """CRC-32 of an array's bytes, now."""
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return zlib.crc32(memoryview(arr).cast("B")) & 0xFFFFFFFF
