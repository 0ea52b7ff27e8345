"""One msProbe dump.json as the rows a watched rank would have streamed.

Row names are the ones msProbe's own compare prints (``{entry}.input.{i}``,
``{entry}.input.{kwarg}``, ``{entry}.output.{i}``, ``{entry}.parameters.{name}``,
``{entry}.{param}`` for a ``parameters_grad`` entry, ``.{j}`` for nested sequences), in the
file's order, which is msProbe's execution order. A leaf is a tensor when it carries
msProbe's statistics (``Max``/``Min``/``Mean``/``Norm``); anything else (ints, shapes,
dtypes) is not a row.

What a dump cannot say is not invented: msProbe's statistics give no NaN or Inf count, so
a tensor whose statistics are NaN counts one NaN, one whose Max or Min is infinite one
Inf ("at least one"). The ``md5`` summary's checksum is not compared: a reduction's result
is not bit-identical across ranks on every backend (gloo's all_reduce left one rank's
output a few last bits off in a clean PyTorch job, with the statistics equal), so replicas
are compared by the bits of their statistics, and md5 stays for ``msprobe compare``.

Kinds, from the entry's name: ``parameters_grad`` -> a rank's own gradient
(GRAD_LOCAL), ``.backward`` and a graph kernel under ``Gradients`` -> BACKWARD,
``.debug`` (``save``) -> SAVED, rankscope's own ``Sentinel.<kind>.`` records by their
kind, the rest FORWARD, a module's ``parameters`` included. Which columns the ranks must
hold bit for bit is learned across ranks (:mod:`.replicas`), not taken from a name: in a
tensor-parallel job the shards of one weight differ by design.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rankscope.wire.records import NO_CRC, Kind

DUMP_FILE = "dump.json"
STAT_KEYS = ("Max", "Min", "Mean", "Norm")
#: rankscope's own records in a dump it wrote: ``Sentinel.<what>.`` -> kind.
SENTINEL_KINDS = {"param": Kind.PARAM, "param_end": Kind.PARAM, "opt_state": Kind.OPT_STATE,
                  "loss": Kind.LOSS, "grad_local": Kind.GRAD_LOCAL, "grad_reduced": Kind.GRAD_REDUCED,
                  "collective": Kind.FORWARD}
_NAN = float("nan")
#: A dump.json larger than this is refused rather than read into memory.
MAX_FILE_BYTES = 2 << 30


class DumpReadError(Exception):
    """A dump.json that cannot be read; the message says what is wrong with it."""


@dataclass
class RankStep:
    """One rank's rows of one step, column by column (the StepBatch columns, names as text)."""

    names: list[str]
    kinds: np.ndarray  # uint8
    stats: np.ndarray  # float64 (n, 4)
    nan: np.ndarray  # int64
    inf: np.ndarray  # int64
    numel: np.ndarray  # int64
    crc: np.ndarray  # int64
    framework: str = ""
    task: str = ""
    level: str = ""

    def __len__(self) -> int:
        return len(self.names)


def read_rank_step(folder: str | os.PathLike) -> RankStep:
    """The rows of ``folder/dump.json``; DumpReadError naming the file and the fault."""
    path = Path(folder) / DUMP_FILE
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise DumpReadError(f"{path}: {size} bytes, over the {MAX_FILE_BYTES >> 20} MiB read at once")
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        raise DumpReadError(f"{path}: no dump.json") from None
    except OSError as exc:
        raise DumpReadError(f"{path}: unreadable ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DumpReadError(f"{path}: not whole JSON ({str(exc)[:80]}): truncated or damaged") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise DumpReadError(f"{path}: no \"data\" map: not an msProbe dump.json")
    rows = _Rows()
    for entry, body in doc["data"].items():
        if isinstance(body, dict):
            rows.entry(str(entry), body)
    return rows.freeze(str(doc.get("framework") or ""), str(doc.get("task") or ""), str(doc.get("level") or ""))


class _Rows:
    def __init__(self) -> None:
        self.names: list[str] = []
        self.kinds: list[int] = []
        self.stats: list[tuple[float, float, float, float]] = []
        self.nan: list[int] = []
        self.inf: list[int] = []
        self.numel: list[int] = []
        self.crc: list[int] = []

    def entry(self, name: str, body: dict) -> None:
        kind = entry_kind(name)
        if ".parameters_grad." in f"{name}.":
            for pname, value in body.items():
                self.walk(f"{name}.{pname}", value, kind, single=True)
            return
        for key, value in body.items():
            if key == "input_args" or key == "input":
                self.walk(f"{name}.input", value, kind)
            elif key == "input_kwargs" and isinstance(value, dict):
                for k, v in value.items():
                    self.walk(f"{name}.input.{k}", v, kind, single=True)
            elif key == "output":
                self.walk(f"{name}.output", value, kind)
            elif key == "parameters" and isinstance(value, dict):
                # Not taken for replicated by name: shards of one weight differ by design.
                for k, v in value.items():
                    self.walk(f"{name}.parameters.{k}", v, kind, single=True)
            elif name.endswith(".debug"):
                self.walk(f"{name}.{key}", value, kind, single=True)
        if _is_tensor(body):  # a save() entry of one tensor, or a Sentinel record
            self.leaf(name, body, kind)

    def walk(self, name: str, value: Any, kind: int, single: bool = False) -> None:
        if isinstance(value, dict):
            if _is_tensor(value):
                self.leaf(name, value, kind)
            else:
                for k, v in value.items():
                    self.walk(f"{name}.{k}", v, kind, single=True)
        elif isinstance(value, list):
            if single and len(value) == 1:
                self.walk(name, value[0], kind, single=True)
            else:
                for i, v in enumerate(value):
                    self.walk(f"{name}.{i}", v, kind, single=True)

    def leaf(self, name: str, leaf: dict, kind: int) -> None:
        get = leaf.get
        stats = (_number(get("Max")), _number(get("Min")), _number(get("Mean")), _number(get("Norm")))
        # NaN is the one value unequal to itself; None (a statistic msProbe did not take) is not NaN.
        nan = int(any(v != v for v in stats if v is not None))
        hi, lo = stats[0], stats[1]
        inf = int((hi is not None and math.isinf(hi)) or (lo is not None and math.isinf(lo)))
        shape = get("shape")
        try:
            numel = math.prod(shape) if isinstance(shape, list) else 0
        except TypeError:
            numel = 0
        self.names.append(name)
        self.kinds.append(kind)
        self.stats.append(tuple(_NAN if v is None else v for v in stats))
        self.nan.append(nan)
        self.inf.append(inf)
        self.numel.append(int(numel))
        self.crc.append(NO_CRC)

    def freeze(self, framework: str, task: str, level: str) -> RankStep:
        n = len(self.names)
        return RankStep(self.names, np.asarray(self.kinds, np.uint8),
                        np.asarray(self.stats, np.float64).reshape(n, 4), np.asarray(self.nan, np.int64),
                        np.asarray(self.inf, np.int64), np.asarray(self.numel, np.int64),
                        np.asarray(self.crc, np.int64), framework, task, level)


def entry_kind(name: str) -> int:
    """The record kind of a dump.json entry, from its name alone."""
    parts = name.split(".")
    if parts[0] == "Sentinel" and len(parts) > 1:
        return int(SENTINEL_KINDS.get(parts[1], Kind.FORWARD))
    if "parameters_grad" in parts:
        return int(Kind.GRAD_LOCAL)
    if "backward" in parts or "Gradients" in name:
        return int(Kind.BACKWARD)
    if parts[-1] == "debug":
        return int(Kind.SAVED)
    return int(Kind.FORWARD)


def _is_tensor(leaf: dict) -> bool:
    return any(k in leaf for k in STAT_KEYS) and not isinstance(leaf.get("Max"), (dict, list))


def _number(v: Any) -> float | None:
    """A statistic as msProbe wrote it: a number, a bool, NaN/Infinity, or their strings."""
    if type(v) is float:
        return v
    if isinstance(v, (int, float)):  # bools too
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None
