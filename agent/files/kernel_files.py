"""MindSpore's kernel dump on disk, read without MindSpore.

Layout (GRAPH mode, e2e dump, checked on MindSpore 2.10 CPU)::

    <path>/rank_<id>/<net_name>/<graph_id>/<iteration>/
        <OpType>.<op_name>.<task>.<stream>.<timestamp>.<input|output>.<slot>.<format>.<Dtype>.npy
    <path>/rank_<id>/execution_order/ms_execution_order_graph_<graph_id>.csv

``op_name`` is the kernel's full scope name with ``/`` written as ``_``. GPU/Ascend
builds can write ``statistic.csv`` instead of tensors (``saved_data: "statistic"``): one
row per tensor, columns named in its header. MindSpore's writers differ across versions
(a fixed header with counts and no L2 norm; Max/Min/Avg/L2Norm/Count; from 2.4 the common
columns plus one per ``statistic_category`` entry, rows ending in a comma), so columns are
found by name and a missing one is unknown (NaN), never zero.

The record name is msProbe's L2 file name without its timestamp and file suffixes:
``<OpType>.<op_name>.<task>.<stream>.<input|output>.<slot>`` -- stable across steps and
across data-parallel ranks, which run the same graph.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

_FILE = re.compile(r"^(?P<type>[^.]+)\.(?P<op>.+)\.(?P<task>\d+)\.(?P<stream>\d+)\.(?P<ts>\d+)\."
                   r"(?P<io>input|output)\.(?P<slot>\d+)\.(?P<fmt>[^.]+)\.(?P<dtype>[^.]+)\.npy$")


@dataclass(frozen=True)
class KernelTensor:
    """One dumped kernel input or output."""

    op_type: str
    op_name: str  # scope name with "_" for "/"
    task: str
    stream: str
    io: str  # "input" | "output"
    slot: int
    dtype: str
    path: Path | None = None  # the .npy (tensor dumps)
    timestamp: int = 0

    @property
    def record_name(self) -> str:
        return f"{self.op_type}.{self.op_name}.{self.task}.{self.stream}.{self.io}.{self.slot}"

    @property
    def backward(self) -> bool:
        return self.op_name.startswith("Gradients_")


def parse_name(filename: str, path: Path | None = None) -> KernelTensor | None:
    """A dump file name, or None for anything else (Parameter/constant files included)."""
    m = _FILE.match(filename)
    if m is None or m["type"] == "Parameter":  # parameters are read from Python between steps
        return None
    return KernelTensor(m["type"], m["op"], m["task"], m["stream"], m["io"], int(m["slot"]), m["dtype"],
                        path, int(m["ts"]))


def iteration_dirs(root: Path) -> Iterator[tuple[int, int, Path]]:
    """(graph_id, iteration, dir) of every iteration folder under a dump path."""
    for rank_dir in sorted(root.glob("rank_*")):
        for net_dir in sorted(p for p in rank_dir.iterdir() if p.is_dir() and p.name != "execution_order"):
            for graph_dir in sorted(p for p in net_dir.iterdir() if p.is_dir() and p.name.isdigit()):
                for it_dir in sorted((p for p in graph_dir.iterdir() if p.is_dir() and p.name.isdigit()),
                                     key=lambda p: int(p.name)):
                    yield int(graph_dir.name), int(it_dir.name), it_dir


def execution_order(root: Path, graph_id: int) -> dict[str, int]:
    """op_name (``_`` form) -> position in the graph's execution order ({} if absent)."""
    order: dict[str, int] = {}
    for csv_path in root.glob(f"rank_*/execution_order/ms_execution_order_graph_{graph_id}.csv"):
        with open(csv_path, newline="") as fh:
            for i, row in enumerate(csv.reader(fh)):
                if i == 0 or not row:
                    continue  # header: NodeExecutionOrder-FullNameWithScope
                order.setdefault(row[0].replace("/", "_"), len(order))
    return order


@dataclass(frozen=True)
class CsvStats:
    """One statistic.csv row: what rankscope's stats need."""

    tensor: KernelTensor
    shape: tuple[int, ...]
    max: float
    min: float
    mean: float
    norm: float
    nan: int
    inf: int
    numel: int


def read_statistic_csv(path: Path) -> list[CsvStats]:
    """Rows of a GPU/Ascend ``statistic.csv``. Columns are found by header name; a bad
    row is skipped and counted by the caller through the shorter result."""
    out: list[CsvStats] = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                out.append(_csv_row(row))
            except (KeyError, ValueError, TypeError, AttributeError):  # a short or garbled row
                continue
    return out


def _num(row: dict, key: str) -> float:
    v = (row.get(key) or "").strip()
    if not v:
        return math.nan
    return _BOOLS.get(v.lower()) if v.lower() in _BOOLS else float(v)


_BOOLS = {"true": 1.0, "false": 0.0}  # a bool tensor's max/min, as some writers print it


def _count(row: dict, *keys: str) -> int | None:
    vals = [row.get(k) for k in keys]
    if any(v is None or not str(v).strip() for v in vals):
        return None
    return sum(int(float(v)) for v in vals)


def _csv_row(row: dict) -> CsvStats:
    shape_text = (row.get("Shape") or "").strip().strip("()[]\"")
    shape = tuple(int(s) for s in re.split(r"[,\s]+", shape_text) if s)
    numel = _count(row, "Count")
    if numel is None:
        numel = math.prod(shape) if shape else 1
    mx, mn = _num(row, "Max Value"), _num(row, "Min Value")
    nan = _count(row, "NaN Count")
    inf = _count(row, "Negative Inf Count", "Positive Inf Count")
    if nan is None:  # not in this statistic_category: a NaN max/min still says so
        nan = int(math.isnan(mx) or math.isnan(mn))
    if inf is None:
        inf = int(math.isinf(mx) or math.isinf(mn))
    tensor = KernelTensor(row["Op Type"], row["Op Name"].replace("/", "_"), str(row.get("Task ID", "0")).strip(),
                          str(row.get("Stream ID", "0")).strip(), row["IO"].strip().lower(), int(row["Slot"]),
                          (row.get("Data Type") or "").strip(), None, int(float(row.get("Timestamp") or 0)))
    if tensor.io not in ("input", "output"):
        raise ValueError(f"IO {row['IO']!r}")
    return CsvStats(tensor, shape, mx, mn, _num(row, "Avg Value"), _num(row, "L2Norm Value"), nan, inf, numel)


_DESCR = re.compile(r"'descr':\s*'([^']+)'")
_SHAPE = re.compile(r"'shape':\s*\(([^)]*)\)")


def load_npy(path: str) -> np.ndarray:
    """An .npy file as NumPy writes it (format 1.x/2.x, no objects), read-only, from one
    read of the whole file. ``np.load`` parses every header with ``ast`` and reads in
    several calls, which costs more than a small kernel tensor itself; anything unusual
    falls back to it."""
    with open(path, "rb", buffering=0) as fh:
        data = fh.readall()
    if data[:6] != b"\x93NUMPY" or data[6] not in (1, 2):
        return np.load(path, allow_pickle=False)
    if data[6] == 1:
        hlen, start = int.from_bytes(data[8:10], "little"), 10
    else:
        hlen, start = int.from_bytes(data[8:12], "little"), 12
    header = data[start:start + hlen].decode("latin1")
    descr, shape = _DESCR.search(header), _SHAPE.search(header)
    if descr is None or shape is None or "'fortran_order': False" not in header:
        return np.load(path, allow_pickle=False)
    dims = tuple(int(d) for d in shape.group(1).split(",") if d.strip())
    dtype = np.dtype(descr.group(1))
    if dtype.hasobject:
        return np.load(path, allow_pickle=False)
    count = math.prod(dims) if dims else 1
    body = start + hlen
    size = len(data) - body
    if size != count * dtype.itemsize:
        dtype = _as_written(path, dtype, dims, count, size)
    return np.frombuffer(data, dtype=dtype, count=count, offset=body).reshape(dims)


def _as_written(path: str, dtype: np.dtype, dims: tuple, count: int, size: int) -> np.dtype:
    """The float type the body holds when the header's does not fit it.

    MindSpore's CPU kernel dump labels the outputs of kernels a float16 graph (AMP O2)
    runs in float32 ``<f2`` but writes their float32 values: read as the header says,
    half the file parses as noise full of NaN and Inf, a divergence that never happened.
    A float file whose size is a whole other float width per element is that; anything
    else is refused, naming what did not fit."""
    width = size // count if count and size % count == 0 else 0
    if dtype.kind == "f" and width in (2, 4, 8):
        return np.dtype(f"{dtype.byteorder if dtype.byteorder in '<>' else '<'}f{width}")
    raise ValueError(f"{path}: the header says {dtype.str} {dims} ({count * dtype.itemsize} bytes), "
                     f"the file holds {size} bytes")
