"""Per-tensor statistics of MindSpore tensors: msProbe's Max/Min/Mean/Norm plus NaN/Inf
counts and CRC-32, computed on a host array by :mod:`rankscope.files.array_stats`.

Why NumPy and not MindSpore ops: on CPU ``Tensor.asnumpy()`` is a zero-copy view of
the tensor's memory, while every PyNative op costs a dispatch of ~0.5 ms here (four
ops per tensor is what makes msProbe ~7x slower). The hot path therefore reads the
host view in a few SIMD/BLAS passes and never copies float32/float64 data.

On an accelerator ``asnumpy`` would move the whole tensor; :func:`device_stats`
computes the same scalars device-side and returns one small tensor, so callers can
stack many and read them back with a single host transfer at step end.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from rankscope.probe.tensors import device_wait
from rankscope.probe.vitals.probe_clock import CLOCK
from rankscope.files.array_stats import (  # noqa: F401 - the probe's stats are these
    NP_TO_MS,
    TensorStats,
    array_stats,
    crc32_of,
)


def wait_for_device() -> None:
    """Wait until MindSpore has run everything queued. Reading a tensor waits for the ops
    queued on that tensor, but not necessarily for a compiled graph still writing
    parameters in place (an optimizer's ``construct`` runs as one), and the kernel dump's
    files are written by kernels still running. A clean 20,000-step soak still shows a
    rare one-step CRC-32 split of one Adam buffer with this wait in place; the replica
    check holds such a split a step (coordinator.logic.detectors.replica). The training
    thread sleeps through the wait (:mod:`rankscope.probe.tensors.device_wait`)."""
    try:
        from mindspore.graph.api import _pynative_executor  # MindSpore >= 2.9
    except ImportError:
        from mindspore.common.api import _pynative_executor
    t0 = time.perf_counter()
    device_wait.wait(_pynative_executor.sync)
    CLOCK.discount(time.perf_counter() - t0)


def to_numpy(value: Any) -> tuple[np.ndarray, str]:
    """(host array, MindSpore dtype name) for a MindSpore tensor or array-like.

    bfloat16 comes back as its raw uint16 bits (widened later): NumPy's bfloat16
    extension type is slow and cannot be summed with BLAS.
    """
    asnumpy = getattr(value, "asnumpy", None)
    if asnumpy is not None:
        dtype_name = str(value.dtype)
        arr = asnumpy()
    else:
        arr = np.asarray(value)
        dtype_name = NP_TO_MS.get(arr.dtype.name, arr.dtype.name)
    if arr.dtype.name == "bfloat16":
        arr = arr.view(np.uint16)
        dtype_name = "BFloat16"
    return arr, dtype_name


_crc_pool: Any = None


def crc32_later(arr: np.ndarray, private: bool = False) -> Any:
    """CRC-32 of a private copy of ``arr`` on a helper thread; returns a Future.

    zlib releases the GIL on large buffers, so the training thread only pays for the
    copy (~20x faster than the CRC) and the checksum overlaps with the forward pass.
    The copy is what makes it safe: the optimizer updates parameters in place next.
    ``private``: ``arr`` already is such a copy, nobody else's to write.
    """
    global _crc_pool
    if _crc_pool is None:
        from concurrent.futures import ThreadPoolExecutor
        _crc_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rankscope-crc")
    return _crc_pool.submit(crc32_of, arr if private else np.array(arr, copy=True, order="C"))


def tensor_stats(value: Any, crc: bool = False) -> TensorStats:
    """Statistics of a MindSpore tensor (or anything NumPy can view)."""
    arr, dtype_name = to_numpy(value)
    return array_stats(arr, dtype_name, crc)


def is_tensor(value: Any) -> bool:
    """A MindSpore Tensor/Parameter (or a stub tensor) or a NumPy array, without
    importing MindSpore. Checked on the type: reading ``shape``/``dtype`` of a tensor
    still being computed waits for MindSpore's pipeline."""
    t = type(value)
    return (hasattr(t, "asnumpy") and hasattr(t, "shape") and hasattr(t, "dtype")) or t is np.ndarray


def device_stats(value: Any) -> Any:
    """Stats computed on the tensor's device as one float32 tensor
    ``[max, min, mean, norm, nan_count, inf_count]``.

    For accelerators: the caller stacks these and calls ``asnumpy`` once per step
    (one host transfer of scalars instead of one tensor copy each). Float inputs only.
    """
    import mindspore as ms  # lazy: rankscope must import without MindSpore
    from mindspore import ops
    x = value if value.dtype == ms.float32 else value.astype(ms.float32)
    nan = ops.isnan(x).sum().astype(ms.float32)
    nonfinite = ops.logical_not(ops.isfinite(x)).sum().astype(ms.float32)
    return ops.stack([x.max(), x.min(), x.mean(), ops.norm(x), nan, nonfinite - nan])


def device_stats_batch(values: list[Any]) -> np.ndarray:
    """``device_stats`` of many tensors, read back with a single host transfer: (n, 6)."""
    from mindspore import ops
    return ops.stack([device_stats(v) for v in values]).asnumpy().astype(np.float64)


def stats_from_device_row(row: np.ndarray, dtype_name: str, shape: list[int]) -> TensorStats:
    """Turn one row read back from :func:`device_stats` into TensorStats."""
    n = int(np.prod(shape)) if shape else 1
    return TensorStats(dtype_name, list(shape), float(row[0]), float(row[1]), float(row[2]),
                       float(row[3]), int(row[4]), int(row[5]), n)
