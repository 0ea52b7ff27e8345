"""Bit-exact fingerprints of weights and optimizer state, and squared norms of gradients,
at the cost of one read of the tensor and no copy.

Two paths, one per place a tensor lives; a process uses one (``rank_env.device_side``),
and the replicas compared with each other run on the same kind of device:

- **host** (CPU): XXH3-64 (``xxhash``) over the zero-copy host view ``asnumpy`` gives of a
  CPU tensor. XXH3 reads memory as fast as a NumPy dot does here, three times as fast as
  zlib's CRC-32, and no private copy is made: the fingerprint is taken at a moment
  nothing writes the tensor (the step's start, after MindSpore's queue is drained).
- **device** (an accelerator): the tensor's bits, viewed as integers, summed with
  position weights by MindSpore ops where the tensor lives; a step's fingerprints come
  back in one readback of a few scalars per tensor instead of a copy of the model.

Either way a single flipped bit changes the fingerprint. The device sum splits each
32-bit word into 16-bit halves so no product or sum can overflow (exact for tensors up
to 2^30 elements); its weights repeat every :data:`PERIOD` elements, so it does not see
two equal-length stretches that far apart trading places. The host hash sees any change.

Tensors larger than :data:`CHUNK_BYTES` are fingerprinted in chunks (``name@k``) so the
budget (rankscope.probe.vitals.budget) can spread a large weight over several steps.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from xxhash import xxh3_64_intdigest

#: Bytes per fingerprinted piece: a weight this large or larger is split into chunks.
CHUNK_BYTES = 16 << 20
#: The device path's position weights repeat with this period (a prime).
PERIOD = 65521
_MASK = 0xFFFFFFFF


def chunks(nbytes: int, itemsize: int) -> list[tuple[int, int]]:
    """Element ranges ``[a, b)`` of a tensor of ``nbytes``: one for a small tensor."""
    n = nbytes // max(1, itemsize)
    per = max(1, CHUNK_BYTES // max(1, itemsize))
    if n <= per:
        return [(0, n)]
    return [(a, min(n, a + per)) for a in range(0, n, per)]


def chunk_name(name: str, index: int, count: int) -> str:
    """The row name of one piece: the tensor's own name when it is whole."""
    return name if count == 1 else f"{name}@{index}"


def tensor_name(row_name: str) -> str:
    """The tensor a piece's row belongs to (:func:`chunk_name` undone)."""
    return row_name.split("@", 1)[0]


def host_fingerprint(arr: np.ndarray, a: int = 0, b: int | None = None) -> int:
    """Fingerprint of elements ``[a, b)`` of a host array (32 bits, as a CRC-32 field holds)."""
    return hash_bytes(piece_bytes(arr, a, b)[0])


def piece_bytes(arr: np.ndarray, a: int = 0, b: int | None = None) -> tuple[memoryview, bool]:
    """The bytes of elements ``[a, b)`` of a host array, and whether they had to be copied
    (a strided view, rare): the array's own memory otherwise."""
    part = arr.reshape(-1)[a:b]
    copied = not part.flags.c_contiguous
    if copied:
        part = np.ascontiguousarray(part)
    return memoryview(part).cast("B"), copied


def hash_bytes(raw: memoryview) -> int:
    """The host fingerprint of a run of bytes."""
    return xxh3_64_intdigest(raw) & _MASK


#: Elements from which a squared norm is read by several threads: one core does not reach
#: the memory's bandwidth (50M float32 here: 17 ms on one thread, 10.5 ms on two), and the
#: training thread waits for the read (the backward is done, the optimizer not begun), so
#: the other cores are idle then.
PARALLEL_MIN = 1 << 22
NORM_CHUNK = 1 << 21
_pool: list = []  # [pid, executor]


def host_squared_norm(arr: np.ndarray) -> float:
    """Sum of squares in one BLAS pass: NaN or Inf anywhere makes it non-finite, which is
    the non-finite flag the vital signs need (the count is taken only then). A large
    array is read by several threads in chunks fixed by its size alone, summed in order,
    so the same bytes give the same bits on every rank (replicas compare the norm)."""
    flat = arr.reshape(-1)
    if flat.dtype.kind != "f" or not flat.size:
        return 0.0
    if flat.dtype.itemsize < 4:  # float16/bfloat16 bits: widened for BLAS
        flat = flat.astype(np.float32)
    if flat.size < PARALLEL_MIN or _readers() is None:
        return float(np.dot(flat, flat))
    parts = [flat[a:a + NORM_CHUNK] for a in range(0, flat.size, NORM_CHUNK)]
    return float(sum(float(x) for x in _readers().map(_sum_squares, parts)))


def _sum_squares(part: np.ndarray) -> float:
    return float(np.dot(part, part))  # BLAS releases the GIL


def _readers() -> Any:
    """The reading threads of this process (none on a single core); made again in a
    forked child, where the parent's threads do not exist."""
    import os
    if _pool and _pool[0] == os.getpid():
        return _pool[1]
    workers = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if workers < 2:
        return None
    from concurrent.futures import ThreadPoolExecutor
    _pool[:] = [os.getpid(), ThreadPoolExecutor(workers, thread_name_prefix="rankscope-norm")]
    return _pool[1]


# ---------------------------------------------------------------- device path
_INT_OF = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def device_fingerprint(value: Any, a: int = 0, b: int | None = None) -> Any:
    """Fingerprint of elements ``[a, b)`` as a MindSpore int64 tensor ``[low, high]``,
    computed by MindSpore ops where ``value`` lives; fold with :func:`fold`."""
    import mindspore as ms
    from mindspore import ops

    size = int(np.prod(value.shape)) if value.shape else 1
    b = size if b is None else b
    width = _itemsize(value.dtype)
    flat = value.reshape(-1)[a:b] if (a, b) != (0, size) else value.reshape(-1)
    bits = flat.view(getattr(ms, _INT_OF[width])).astype(ms.int64)
    if width == 8:  # 64-bit words: fold to 32 first (both halves count)
        bits = ops.bitwise_xor(bits & 0xFFFFFFFF, ops.floor_divide(bits, 1 << 32) & 0xFFFFFFFF)
    # Floor division by a power of two is an arithmetic shift (MindSpore has no shift op).
    low = bits & 0xFFFF
    high = ops.floor_divide(bits, 1 << 16) & 0xFFFF
    weight = ops.remainder(ops.arange(a, b, dtype=ms.int64), PERIOD) + 1
    return ops.stack([(low * weight).sum(), (high * weight).sum()])


def device_fingerprints(pieces: list[tuple[Any, int, int | None]]) -> list[int]:
    """Fingerprints of many ``(tensor, a, b)`` pieces with one readback."""
    from mindspore import ops
    if not pieces:
        return []
    rows = ops.stack([device_fingerprint(v, a, b) for v, a, b in pieces]).asnumpy()
    return [fold(int(lo), int(hi)) for lo, hi in rows]


def device_squared_norms(values: list[Any]) -> np.ndarray:
    """Squared norms of many float tensors with one readback (float64 on the host)."""
    import mindspore as ms
    from mindspore import ops
    if not values:
        return np.zeros(0)
    sq = [ops.square(v.astype(ms.float32)).sum() for v in values]
    return ops.stack(sq).asnumpy().astype(np.float64)


def fold(low: int, high: int) -> int:
    """The two weighted sums of a device fingerprint as one 32-bit value (mixed so a
    change in either changes the result)."""
    x = (low * 0x9E3779B97F4A7C15 + high * 0xC2B2AE3D27D4EB4F) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 29
    x = (x * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 32)) & _MASK


def _itemsize(dtype: Any) -> int:
    name = str(dtype).lower()
    for size, keys in ((8, ("64",)), (2, ("16",)), (1, ("int8", "uint8", "bool"))):
        if any(k in name for k in keys):
            return size
    return 4
