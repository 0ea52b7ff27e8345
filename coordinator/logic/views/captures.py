"""Tensor values captured on request, kept for the console (rankscope.wire.capture_values).

A capture is one tensor at one step on a few ranks: opened when the console asks, filled as
the ranks answer. The console reads a window of a 2-D slice of it on two ranks and their
difference: the leading dimensions fixed by ``index``, the last two shown from ``row`` and
``col`` on, at most :data:`WINDOW` by :data:`WINDOW` (a 1-D tensor is one row). Pure logic:
no Ray, no sockets.
"""
from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np

from rankscope.wire import capture_values

#: Captures kept, newest last; an older one's values are dropped (they are on the ranks).
KEEP = 8
#: The side of the window a view shows.
WINDOW = 48


class CaptureBook:
    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._n = 0
        self.entries: collections.OrderedDict[str, dict] = collections.OrderedDict()

    def open(self, tensor: str, ranks: list[int], now: float) -> dict:
        self._n += 1
        entry = {"id": f"cap-{self._n}", "tensor": tensor, "ranks": list(ranks), "asked_at": now, "answers": {}}
        self.entries[entry["id"]] = entry
        while len(self.entries) > self.keep:
            self.entries.popitem(last=False)
        return entry

    def on_answer(self, detail: dict) -> bool:
        """A rank's STATUS ``capture`` (checked by the decoder); False when its capture is gone."""
        entry = self.entries.get(detail.get("id", ""))
        rank = detail.get("rank")
        if entry is None or not isinstance(rank, int) or rank not in entry["ranks"]:
            return False
        answer = {k: detail.get(k) for k in ("step", "shape", "dtype", "numel", "path", "error")}
        answer["values"] = capture_values.decode(detail) if not detail.get("error") else None
        entry["answers"][rank] = answer
        return True

    def rows(self) -> list[dict]:
        """Every kept capture, newest first, without values."""
        return [self._row(e) for e in reversed(self.entries.values())]

    def view(self, cid: str, a: int | None = None, b: int | None = None, index: list[int] | None = None,
             row: int = 0, col: int = 0) -> dict:
        """One capture: its answers, and where two answered with values, the window of rank
        ``a``, rank ``b`` and ``a - b`` (ValueError naming what was wrong)."""
        entry = self.entries.get(cid)
        if entry is None:
            raise ValueError(f"capture: no capture {cid!r} is kept (the newest {self.keep} are)")
        out = self._row(entry)
        got = {r: ans for r, ans in entry["answers"].items() if ans["values"] is not None}
        ranks = sorted(got)
        if len(ranks) < 2 and a is None:
            if len(ranks) == 1:
                out["window"] = self._window(got, ranks[0], None, index, row, col)
            return out
        a = ranks[0] if a is None else a
        b = next((r for r in ranks if r != a), None) if b is None else b
        for who, name in ((a, "a"), (b, "b")):
            if who is not None and who not in got:
                raise ValueError(f"capture {cid}: rank {who} ({name}) sent no values")
        out["window"] = self._window(got, a, b, index, row, col)
        return out

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _row(entry: dict) -> dict:
        answers = {str(r): {k: v for k, v in ans.items() if k != "values"} for r, ans in entry["answers"].items()}
        for r, ans in entry["answers"].items():
            vals = ans["values"]
            answers[str(r)]["sent"] = 0 if vals is None else int(vals.size)
        waiting = [r for r in entry["ranks"] if r not in entry["answers"]]
        return {"id": entry["id"], "tensor": entry["tensor"], "ranks": entry["ranks"], "answers": answers,
                "waiting": waiting}

    def _window(self, got: dict, a: int, b: int | None, index: list[int] | None, row: int, col: int) -> dict:
        ans = got[a]
        shape = [int(d) for d in ans["shape"] or [ans["values"].size]]
        if b is not None and [int(d) for d in got[b]["shape"] or []] != [int(d) for d in ans["shape"] or []]:
            raise ValueError(f"capture: rank {a} has shape {ans['shape']}, rank {b} {got[b]['shape']}")
        lead, (rows, cols) = _split(shape)
        index = list(index or [0] * len(lead))
        if len(index) != len(lead) or not all(isinstance(i, int) and 0 <= i < d for i, d in zip(index, lead)):
            want = (f"one index for each of the first {len(lead)} dimension(s)" if lead else
                    "it has no leading dimension to index: leave index out")
            raise ValueError(f"capture: index {index} does not select a slice of shape {shape} ({want})")
        if not (isinstance(row, int) and isinstance(col, int) and 0 <= row < max(rows, 1) and 0 <= col < max(cols, 1)):
            raise ValueError(f"capture: row {row}, col {col} are outside the {rows} x {cols} slice")
        r1, c1 = min(rows, row + WINDOW), min(cols, col + WINDOW)
        base = int(np.ravel_multi_index(index, lead)) * rows * cols if lead else 0
        grid_a, has_a = _grid(got[a]["values"], base, row, r1, col, c1, cols)
        out: dict[str, Any] = {"shape": shape, "index": index, "rows": [row, r1], "cols": [col, c1],
                               "slices": lead, "a": {"rank": a, "values": _json(grid_a, has_a)}}
        if b is not None:
            grid_b, has_b = _grid(got[b]["values"], base, row, r1, col, c1, cols)
            out["b"] = {"rank": b, "values": _json(grid_b, has_b)}
            out["diff"] = _json(grid_a - grid_b, has_a & has_b)
            out.update(_compare(got[a]["values"], got[b]["values"], shape))
        return out


def _split(shape: list[int]) -> tuple[list[int], tuple[int, int]]:
    """(the leading dimensions an index fixes, the slice's rows and columns)."""
    if not shape:
        return [], (1, 1)
    if len(shape) == 1:
        return [], (1, shape[0])
    return shape[:-2], (shape[-2], shape[-1])


def _grid(values: np.ndarray, base: int, r0: int, r1: int, c0: int, c1: int, cols: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """(the window as float64, where the rank sent values: a large tensor is cut at
    capture_values.MAX_ELEMENTS)."""
    grid = np.zeros((r1 - r0, c1 - c0))
    has = np.zeros(grid.shape, dtype=bool)
    for i, r in enumerate(range(r0, r1)):
        start = base + r * cols + c0
        part = values[start:start + (c1 - c0)]
        grid[i, :part.size] = part.astype(np.float64)
        has[i, :part.size] = True
    return grid, has


def _compare(va: np.ndarray, vb: np.ndarray, shape: list[int]) -> dict:
    """Over every value both sent: how many differ (bits, NaN equal to NaN), and where the
    largest difference is, as an index into the tensor."""
    n = min(va.size, vb.size)
    x, y = va[:n], vb[:n]
    same = (x == y) | (np.isnan(x) & np.isnan(y)) if x.dtype.kind == "f" else x == y
    differing = int(n - np.count_nonzero(same))
    out: dict[str, Any] = {"compared": int(n), "differing": differing, "largest_at": None, "largest": None}
    if differing:
        d = np.abs(x.astype(np.float64) - y.astype(np.float64))
        d[same] = 0.0
        d = np.where(np.isnan(d), np.inf, d)  # a NaN on one side only is the largest of all
        at = int(np.argmax(d))
        out["largest_at"] = [int(i) for i in np.unravel_index(at, shape)] if shape else []
        out["largest"] = _num(float(d[at]))
    return out


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


def _json(grid: np.ndarray, has: np.ndarray) -> list[list[float | str | None]]:
    """Rows of numbers ("nan", "inf" where not finite; None where nothing was sent)."""
    return [[_num(float(v)) if h else None for v, h in zip(row, hrow)] for row, hrow in zip(grid, has)]
