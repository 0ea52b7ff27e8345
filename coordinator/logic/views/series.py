"""Per-rank curves for the report: loss, gradient norm and deviation per judged step.

Kept small and bounded (the last ``max_steps`` judged steps per group) because the
coordinator otherwise drops judged steps; the report's heatmap and curves read this.
A value a rank did not report is None; one it reported as NaN/Inf is the string
``"nan"``/``"inf"``/``"-inf"``: the report marks the two differently, because a
non-finite value is usually the event the incident is about. The last few judged
steps themselves are kept too (:class:`RecentSteps`) for the incident's proof.
"""
from __future__ import annotations

import collections
from typing import Any

import numpy as np

from rankscope.coordinator.logic.align.aligner import StepView
from rankscope.coordinator.logic.detectors.common import set_medians
from rankscope.coordinator.logic.detectors.outlier import log_values
from rankscope.coordinator.logic.views.recent import NONFINITE_DEVIATION, RecentSteps
from rankscope.wire.records import Kind


def _jsonable(a: np.ndarray, present: np.ndarray) -> list[float | str | None]:
    return [None if not p else float(x) if np.isfinite(x) else str(float(x)) for x, p in zip(a, present)]


def _deviations(dev: np.ndarray, width: int) -> list[float | None]:
    """A step's deviation per rank as JSON: NONFINITE_DEVIATION for a rank with NaN/Inf,
    None for one that sent nothing (a shorter row, from before ranks joined, is padded).
    Rounded to 4 decimals (a colour needs two): a grid of 256 ranks x 64 steps in full
    precision is 340 KB of JSON that the console encodes every second. Converted as one
    array (a loop over 1,024 ranks holds the ingest thread a millisecond a step)."""
    dev = np.asarray(dev, dtype=np.float64)
    out: list[float | None] = np.round(dev, 4).tolist()
    for i in np.flatnonzero(~np.isfinite(dev)).tolist():
        out[i] = None if np.isnan(dev[i]) else NONFINITE_DEVIATION
    return out + [None] * (width - len(out))


class SeriesRecorder:
    def __init__(self, max_steps: int = 512) -> None:
        self.max_steps = max_steps
        self._groups: dict[str, collections.deque] = {}
        self._ranks: dict[str, list[int]] = {}
        self.recent = RecentSteps()

    def add(self, view: StepView) -> None:
        stats, present = view.stats, view.present
        loss_cols = np.flatnonzero(view.kind == Kind.LOSS)
        n_ranks = view.ranks.shape[0]
        loss, loss_in = np.full(n_ranks, np.nan), np.zeros(n_ranks, bool)
        if loss_cols.shape[0]:
            c = loss_cols[0]
            loss, loss_in = np.where(present[:, c], stats[:, c, 2], np.nan), present[:, c].copy()
        g_cols = np.flatnonzero(view.kind == Kind.GRAD_LOCAL)
        gnorm, g_in = np.full(n_ranks, np.nan), np.zeros(n_ranks, bool)
        if g_cols.shape[0]:
            n = np.where(present[:, g_cols], stats[:, g_cols, 3], 0.0)
            g_in = present[:, g_cols].any(axis=1)
            with np.errstate(invalid="ignore", over="ignore"):
                gnorm = np.where(g_in, np.sqrt(np.sum(n * n, axis=1)), np.nan)
        # Deviation: the largest |log ratio| of a rank's loss/grad/activation norm to the
        # median of the ranks it compares with over this step's columns (0 = exactly typical).
        cached = view.cache.get("log_norms")
        if cached is None:
            cols = np.flatnonzero(np.isin(view.kind, (Kind.LOSS, Kind.GRAD_LOCAL, Kind.FORWARD)))
            y = log_values(view, cols)
            sets = view.sets
            med = set_medians(y, None if sets is None or sets.whole else sets.role_groups())[0]
        else:
            cols, y, med = cached  # med: each row's set median, (R, C)
        dev = np.zeros(view.ranks.shape[0])
        if cols.shape[0] and view.ranks.shape[0] > 1:
            with np.errstate(invalid="ignore"):
                d = np.abs(y - med)
            d = np.where(np.isfinite(d), d, 0.0)
            dev = d.max(axis=1)
            bad = (view.nan[:, cols] + view.inf[:, cols] > 0).any(axis=1)
            dev[bad] = np.inf
        dev[~view.reported[:n_ranks]] = np.nan  # no record is no data, not "typical"
        self.append(view.group, view.ranks.tolist(), (view.step, (loss, loss_in), (gnorm, g_in), dev))
        self.recent.add(view)

    def append(self, group: str, ranks: list[int], row: tuple) -> None:
        """One judged step's row: (step, (loss, present), (grad norm, present), deviation),
        each array over ``ranks`` (also how merged ingest shards' rows come in)."""
        q = self._groups.setdefault(group, collections.deque(maxlen=self.max_steps))
        self._ranks[group] = ranks
        q.append(row)

    def last(self, group: str) -> tuple[list[int], tuple]:
        """The newest row of ``group`` and the ranks it is over."""
        return self._ranks[group], self._groups[group][-1]

    def tail(self, steps: int, since: dict[str, int] | None = None) -> dict[str, Any]:
        """Per group, the newest ``steps`` judged steps' deviation of every rank: the live
        console's grid (NONFINITE_DEVIATION for NaN/Inf, None for no record). ``since``:
        per group, the newest step the asker already holds; only later steps are sent for
        it (the console keeps the window, so a poll moves one step's column, not 64)."""
        out = {}
        for label, q in self._groups.items():
            held = (since or {}).get(label)
            rows = []
            for row in reversed(q):  # from the newest: a poll reads one or two rows, not 512
                if len(rows) >= steps or (isinstance(held, int) and row[0] <= held):
                    break
                rows.append(row)
            rows.reverse()
            width = len(self._ranks[label])
            # Converted when asked, not kept: the console asks for each step once, and one
            # step's row of 256 ranks converts in ~10 us.
            devs = [_deviations(row[3], width) for row in rows]
            out[label] = {"ranks": self._ranks[label], "steps": [s for s, *_ in rows], "deviation": devs}
        return out

    def to_dict(self, group: str | None = None) -> dict[str, Any]:
        out = {}
        for label, q in self._groups.items():
            if group is not None and label != group:
                continue
            ranks = self._ranks[label]
            width = len(ranks)

            def pad(a: np.ndarray, fill: Any = np.nan) -> np.ndarray:
                return a if a.shape[0] == width else np.r_[a, np.full(width - a.shape[0], fill)]

            def values(pair: tuple[np.ndarray, np.ndarray]) -> list[float | str | None]:
                return _jsonable(pad(pair[0]), pad(pair[1], False))

            out[label] = {
                "ranks": ranks, "steps": [s for s, *_ in q],
                "loss": [values(x) for _, x, _, _ in q],
                "grad_norm": [values(x) for _, _, x, _ in q],
                "deviation": [_deviations(x, width) for *_, x in q],
            }
        return out
