"""What detectors read from column names, parsed once per column and kept with the job's
key table: which columns are a collective's input or output, and which parameter record
of a step's start belongs to which record of the previous step's end."""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

from rankscope.coordinator.logic.align.columns import KeyTable
from rankscope.wire.collective_names import CollectiveIO, parse_collective

PARAM_START = "Sentinel.param."
PARAM_END = "Sentinel.param_end."


@dataclass
class _Parsed:
    upto: int = 0
    collective: dict[int, CollectiveIO] = field(default_factory=dict)
    #: call -> {"input": [cols], "output": [cols]}
    calls: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)  # parameter name -> step-start column
    ends: dict[str, int] = field(default_factory=dict)  # parameter name -> step-end column
    pairs: tuple[np.ndarray, np.ndarray] | None = None


_CACHE: "weakref.WeakKeyDictionary[KeyTable, _Parsed]" = weakref.WeakKeyDictionary()


def _parsed(keys: KeyTable) -> _Parsed:
    p = _CACHE.get(keys)
    if p is None:
        p = _CACHE[keys] = _Parsed()
    n = len(keys.names)
    if p.upto < n:
        for col in range(p.upto, n):
            name = keys.names[col]
            if "#" in name:
                continue  # a repeated call's column: the first call's pairs stand for it
            io = parse_collective(name)
            if io is not None:
                p.collective[col] = io
                p.calls.setdefault(io.call, {}).setdefault(io.io, []).append(col)
            elif name.startswith(PARAM_END):
                p.ends[name[len(PARAM_END):]] = col
                p.pairs = None
            elif name.startswith(PARAM_START):
                p.starts[name[len(PARAM_START):]] = col
                p.pairs = None
        p.upto = n
    return p


def collective_io(keys: KeyTable, col: int) -> CollectiveIO | None:
    return _parsed(keys).collective.get(col)


def call_inputs(keys: KeyTable, io: CollectiveIO) -> list[int]:
    """The input columns of the collective call an output column belongs to."""
    return _parsed(keys).calls.get(io.call, {}).get("input", [])


def reduced_inputs(keys: KeyTable, kinds: np.ndarray, reduced_kind: int) -> np.ndarray:
    """Input columns of every collective call whose output is of ``reduced_kind`` (reduced
    gradients): a rank's own gradients, whatever kind their record was given (a reducer's
    AllReduce kernel inside a jit step keeps no Cell scope, so its input reads as forward)."""
    out = []
    width = kinds.shape[0]
    for sides in _parsed(keys).calls.values():
        outs = [c for c in sides.get("output", []) if c < width]
        if outs and all(int(kinds[c]) == reduced_kind for c in outs):
            out += [c for c in sides.get("input", []) if c < width]
    return np.array(sorted(out), np.int64)


def replicated_outputs(keys: KeyTable, width: int) -> np.ndarray:
    """Columns (< width) holding a collective's output that every rank of its group must
    hold bit for bit (a tensor-parallel AllReduce's result)."""
    return np.array(sorted(c for c, io in _parsed(keys).collective.items() if c < width and io.replicated_output),
                    np.int64)


def param_pairs(keys: KeyTable) -> tuple[np.ndarray, np.ndarray]:
    """(step-start columns, the matching step-end columns) of every parameter recorded at both."""
    p = _parsed(keys)
    if p.pairs is None:
        both = sorted(set(p.starts) & set(p.ends))
        p.pairs = (np.array([p.starts[n] for n in both], np.int64), np.array([p.ends[n] for n in both], np.int64))
    return p.pairs
