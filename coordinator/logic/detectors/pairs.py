"""Two ranks that should compare, and disagree: which one is wrong?

With two data-parallel replicas (common with tensor or pipeline parallelism) a median
cannot pick the odd one out. Two pieces of evidence need no majority:

- **history**: each rank's change against its own recent level (an EWMA of the log
  value). A rank whose local gradients were scaled x50 jumped; its replica did not.
- **tensor-parallel peers**: the other ranks of each candidate's data replica (same
  batch, other shard) hold the same kind of value for their shard. A rank far from its
  own peers while the other candidate is close to its peers is the one that moved; a
  victim's peers agree with it.

Where a rank has tensor-parallel peers they decide (a history of two alone cannot tell a
rank's fault from its replica's harder batch); elsewhere (pure data parallel 2, pipeline
stages) its own history does. A column is judged only once it has learned how far its two
ranks usually are apart: a disagreement with evidence counts from half that floor (never
below ``ratio``), one without from the floor, and then the verdict names nobody. Values
are logs (:func:`.outlier.log_values`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankscope.coordinator.logic.detectors.common import nanmedian0, num

#: Steps of a rank's own history before its change can speak for or against it.
PAIR_MIN_HISTORY = 3


@dataclass
class PairFinding:
    """Flags of decided culprits (R, C) over the judged columns, the evidence of each
    flagged cell, and the pairs left undecided: (column index, row a, row b, evidence)."""

    flag: np.ndarray
    evidence: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    undecided: list[tuple[int, int, int, dict[str, Any]]] = field(default_factory=list)


def judge_pairs(y: np.ndarray, pairs: list[np.ndarray], peers: dict[int, np.ndarray], level: np.ndarray,
                count: np.ndarray, floor: np.ndarray, learned: np.ndarray, log_ratio: float,
                log_hist_ratio: float) -> PairFinding:
    """``y``: (R, C) log values; ``pairs``: rows of each two-row set; ``peers``: row ->
    its tensor-parallel peers' rows; ``level``/``count``: each cell's own EWMA level and
    steps of history (before this step); ``floor``: (C,) the floor learned for half the
    gap between two ranks of a column, and ``learned``: whether the column has one yet
    (nothing is judged before: two values and no history say nothing of a column's noise)."""
    out = PairFinding(np.zeros(y.shape, bool))
    # Evidence lets a gap half the learned floor count, never less than the ratio.
    bar = np.maximum(log_ratio, floor / 2)
    for rows in pairs:
        a, b = int(rows[0]), int(rows[1])
        ya, yb = y[a], y[b]
        fin = np.isfinite(ya) & np.isfinite(yb) & learned
        if not fin.any():
            continue
        half = np.where(fin, np.abs(ya - yb) / 2, 0.0)
        up = np.sign(ya - yb)
        ta, tb = _from_peers(y, a, peers), _from_peers(y, b, peers)
        t_ok = np.isfinite(ta) & np.isfinite(tb)
        # Each candidate close to its own tensor-parallel peers: their replicas' batches
        # differ, no rank does.
        near_a, near_b = np.abs(np.where(t_ok, ta, 0.0)), np.abs(np.where(t_ok, tb, 0.0))
        explained = t_ok & (near_a <= log_ratio) & (near_b <= log_ratio)
        by_peers = _one_of(np.where(t_ok, np.maximum(ta, 0.0), 0.0), np.where(t_ok, np.maximum(tb, 0.0), 0.0),
                           log_ratio, t_ok)
        by_peers[by_peers != up] = 0
        # Without peers, its own history: the one that rose (and is the higher of the two),
        # if only one did; a value that collapses on one rank (a loss near zero) is routine.
        hist_ok = ~t_ok & (count[a] >= PAIR_MIN_HISTORY) & (count[b] >= PAIR_MIN_HISTORY)
        da, db = np.where(hist_ok, ya - level[a], 0.0), np.where(hist_ok, yb - level[b], 0.0)
        by_hist = _one_of(np.maximum(da, 0.0), np.maximum(db, 0.0), log_hist_ratio, hist_ok)
        by_hist[by_hist != up] = 0
        culprit = np.where(t_ok, by_peers, by_hist)
        named = fin & (culprit != 0) & (half > bar)
        for j in np.flatnonzero(named):
            row, other = (a, b) if culprit[j] > 0 else (b, a)
            out.flag[row, j] = True
            out.evidence[(row, j)] = _evidence(y, j, row, other, level, bool(hist_ok[j]), bool(by_hist[j]),
                                               bool(by_peers[j]), ta if row == a else tb, tb if row == a else ta)
        for j in np.flatnonzero(fin & ~named & ~explained & (half > floor)):
            out.undecided.append((int(j), a, b, {
                "rule": "two ranks that should compare disagree, and neither their own history nor their "
                        "tensor-parallel peers tell which is wrong",
                "values_log": [num(ya[j]), num(yb[j])], "ratio": num(math.exp(2 * half[j])),
                "threshold_ratio": num(math.exp(2 * floor[j]))}))
    return out


def _one_of(xa: np.ndarray, xb: np.ndarray, bar: float, ok: np.ndarray) -> np.ndarray:
    """Per column +1 (a) / -1 (b) / 0: the one beyond ``bar`` while the other stays
    within half of it."""
    out = np.zeros(xa.shape, np.int64)
    out[ok & (xa > bar) & (xb <= xa / 2)] = 1
    out[ok & (xb > bar) & (xa <= xb / 2)] = -1
    return out


def _from_peers(y: np.ndarray, row: int, peers: dict[int, np.ndarray]) -> np.ndarray:
    """(C,) a rank's value over the median of its tensor-parallel peers' (logs; NaN: none)."""
    rows = peers.get(row)
    if rows is None or not rows.shape[0]:
        return np.full(y.shape[1], np.nan)
    with np.errstate(invalid="ignore"):
        return y[row] - nanmedian0(y[rows])


def _evidence(y: np.ndarray, j: int, row: int, other: int, level: np.ndarray, hist_ok: bool, by_hist: bool,
              by_peers: bool, t_row: np.ndarray, t_other: np.ndarray) -> dict:
    how = " and ".join(w for w, on in (("its own history", by_hist), ("its tensor-parallel peers", by_peers)) if on)
    ev: dict[str, Any] = {
        "rule": f"pair: two replicas disagree and {how} single it out",
        "ratio_to_other_replica": num(math.exp(y[row, j] - y[other, j])),
    }
    if hist_ok:
        ev["own_change"] = num(math.exp(y[row, j] - level[row, j]))
        ev["other_replica_change"] = num(math.exp(y[other, j] - level[other, j]))
    if np.isfinite(t_row[j]) and np.isfinite(t_other[j]):
        ev["ratio_to_own_peers"] = num(math.exp(t_row[j]))
        ev["other_replica_ratio_to_its_peers"] = num(math.exp(t_other[j]))
    return ev
