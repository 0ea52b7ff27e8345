"""The last few judged steps of each group, kept so an incident can show its proof.

The aligner drops a step once it is judged (keeping one as ``prev``). The report
wants more: the named tensor on every rank over the steps around the divergence, and
for a NaN, which records went non-finite after the first one. Keeping references to
the last judged StepViews costs no copy on the ingest path; they are bounded in steps
and in cells (ranks x columns), so a 1024-rank job keeps fewer steps, never more
memory. Extraction runs once per incident and returns JSON-ready dicts.
"""
from __future__ import annotations

import collections
from typing import Any

import numpy as np

from rankscope.coordinator.logic.align.aligner import NO_EXEC, StepView
from rankscope.coordinator.logic.detectors.common import MAX_EVIDENCE_RANKS, nanmedian0, num, set_medians
from rankscope.coordinator.logic.detectors.outlier import log_values
from rankscope.wire.records import NO_CRC, PRE_REDUCTION_KINDS, STAT_COLUMNS, Kind

#: Steps kept per group; a verdict's step and a few either side fit with room to spare
#: for the steps ranks finish before they block at the pause.
KEEP_STEPS = 10
#: Ranks x columns summed over the kept steps of one group (~70 bytes each). Past it the
#: oldest steps go first; the newest two always stay.
MAX_CELLS = 1_000_000
#: Fields of one rank's record in a tensor window, in order.
WINDOW_FIELDS = (*STAT_COLUMNS, "nan", "inf", "numel", "crc32")
#: Rows of the non-finite chain; the rest is counted, not listed.
MAX_CHAIN_RECORDS = 60
MAX_CHAIN_RANKS = 16

#: A rank's deviation where its comparable records hold NaN/Inf (JSON has no Inf): the
#: report's heatmap and the console's grid and model tree draw it as non-finite.
NONFINITE_DEVIATION = 1e9

_PRE = frozenset(int(k) for k in PRE_REDUCTION_KINDS)


def _kind_name(kind: int) -> str | None:
    return Kind(kind).name.lower() if kind >= 0 else None


class RecentSteps:
    def __init__(self, keep_steps: int = KEEP_STEPS, max_cells: int = MAX_CELLS) -> None:
        self.keep_steps, self.max_cells = keep_steps, max_cells
        self._groups: dict[str, collections.deque[StepView]] = {}
        self._cells: dict[str, int] = {}

    def add(self, view: StepView) -> None:
        q = self._groups.setdefault(view.group, collections.deque())
        if q and view.step <= q[-1].step:  # steps went back: a new run reuses the job id
            q.clear()
            self._cells[view.group] = 0
        q.append(view)
        cells = self._cells.get(view.group, 0) + view.present.size
        while len(q) > self.keep_steps or (len(q) > 2 and cells > self.max_cells):
            cells -= q.popleft().present.size
        self._cells[view.group] = cells

    def views(self, group: str) -> list[StepView]:
        return list(self._groups.get(group, ()))

    def all_views(self) -> dict[str, list[StepView]]:
        """Every group's kept views, oldest first."""
        return {g: list(q) for g, q in self._groups.items()}

    def proof(self, verdict: dict[str, Any]) -> dict[str, Any]:
        """The verdict's tensor on every rank over the steps around it, and (NaN origin)
        where the non-finite values went: an incident report's proof."""
        group, step = verdict.get("group"), verdict.get("step")
        if not group or not isinstance(step, int):
            return {}
        focus = [r for r in [verdict.get("rank"), *verdict.get("ties", [])] if isinstance(r, int)]
        out = {"tensor_window": self.tensor_window(group, verdict.get("tensor"), step, focus)}
        if verdict.get("detector") == "nan_origin":
            out["nonfinite_chain"] = self.nonfinite_chain(group, step)
        return {k: v for k, v in out.items() if v is not None}

    def tensors(self, group: str, step: int | None = None) -> dict[str, Any] | None:
        """Every tensor of one kept step (the newest when ``step`` is None or not kept), in
        execution order, with its worst deviation across ranks: the largest |log norm -
        median of the rank's set| (NONFINITE_DEVIATION where a rank has NaN/Inf) and the
        rank it is on. None when nothing is kept."""
        views = self.views(group)
        if not views:
            return None
        v = next((x for x in views if x.step == step), views[-1])
        cols = np.arange(v.present.shape[1])
        y = log_values(v, cols)
        sets = v.sets
        med = set_medians(y, None if sets is None or sets.whole else sets.role_groups())[0]
        with np.errstate(invalid="ignore"):
            d = np.abs(y - med)
        d = np.where(np.isfinite(d), d, -1.0)
        d[v.present & ((v.nan > 0) | (v.inf > 0))] = NONFINITE_DEVIATION
        worst = d.argmax(axis=0) if d.shape[0] else np.zeros(cols.shape[0], np.int64)
        dev = d.max(axis=0) if d.shape[0] else np.full(cols.shape[0], -1.0)
        order = np.argsort(np.where(v.present, v.exec, NO_EXEC).min(axis=0), kind="stable")
        return {"group": group, "step": v.step, "steps": [x.step for x in views],
                "tensors": [{"name": v.keys.names[c], "kind": _kind_name(int(v.kind[c])),
                             "deviation": None if dev[c] < 0 else float(dev[c]),
                             "rank": None if dev[c] < 0 else int(v.ranks[worst[c]])} for c in order.tolist()]}

    def tensor_window(self, group: str, tensor: str | None, step: int, focus: list[int],
                      before: int = 4, after: int = 3) -> dict[str, Any] | None:
        """One tensor on every rank (focus ranks first, at most MAX_EVIDENCE_RANKS) over
        the kept steps in ``[step - before, step + after]``, with the group median of
        each statistic per step. None when the tensor is unknown or no step is kept."""
        if not tensor:
            return None
        views = [v for v in self.views(group) if step - before <= v.step <= step + after]
        if not views:
            return None
        try:
            col = views[-1].keys.names.index(tensor)
        except ValueError:
            return None
        ids = sorted({int(r) for v in views for r in v.ranks})
        ranks = list(dict.fromkeys([r for r in focus if r in ids] + ids))[:MAX_EVIDENCE_RANKS]
        values: list[list[Any]] = [[None] * len(views) for _ in ranks]
        median: list[Any] = []
        kind = -1
        for j, v in enumerate(views):
            if col >= v.present.shape[1] or not v.present[:, col].any():
                median.append(None)
                continue
            kind = max(kind, int(v.kind[col]))
            pos = {int(r): i for i, r in enumerate(v.ranks)}
            for i, r in enumerate(ranks):
                row = pos.get(r)
                if row is not None and v.present[row, col]:
                    values[i][j] = _record(v, row, col)
            rows = np.flatnonzero(v.present[:, col])
            med = nanmedian0(np.where(np.isfinite(v.stats[rows, col, :]), v.stats[rows, col, :], np.nan))
            median.append([None if not np.isfinite(m) else num(m) for m in med])
        return {"tensor": tensor, "kind": _kind_name(kind), "steps": [v.step for v in views], "ranks": ranks,
                "fields": list(WINDOW_FIELDS), "values": values, "median": median,
                "ranks_in_group": len(ids)}

    def nonfinite_chain(self, group: str, step: int) -> dict[str, Any] | None:
        """Every record with a NaN/Inf from ``step`` on, in (step, execution) order: the
        first one and where it spread (which tensors, on which ranks, at which step)."""
        rows: list[dict[str, Any]] = []
        for v in self.views(group):
            if v.step < step:
                continue
            bad = v.present & ((v.nan > 0) | (v.inf > 0))
            cols = np.flatnonzero(bad.any(axis=0))
            ex = np.where(bad[:, cols], v.exec[:, cols], NO_EXEC).min(axis=0) if cols.shape[0] else []
            for c, first in sorted(zip(cols.tolist(), np.asarray(ex).tolist()), key=lambda t: t[1]):
                hit = np.flatnonzero(bad[:, c])
                ranks = sorted(int(v.ranks[r]) for r in hit)
                kind = int(v.kind[c])
                rows.append({
                    "step": v.step, "tensor": v.keys.names[c], "kind": _kind_name(kind),
                    "before_reduction": kind in _PRE, "exec_index": None if first == NO_EXEC else int(first),
                    "ranks": ranks[:MAX_CHAIN_RANKS], "rank_count": len(ranks),
                    "nan": int(v.nan[hit, c].sum()), "inf": int(v.inf[hit, c].sum()),
                    "numel": int(v.numel[hit[0], c]),
                })
        if not rows:
            return None
        return {"from_step": step, "records": rows[:MAX_CHAIN_RECORDS],
                "more": max(0, len(rows) - MAX_CHAIN_RECORDS)}


def _record(v: StepView, row: int, col: int) -> list[Any]:
    crc = int(v.crc[row, col])
    return [num(x) for x in v.stats[row, col]] + [
        int(v.nan[row, col]), int(v.inf[row, col]), int(v.numel[row, col]),
        None if crc == NO_CRC else f"{crc & 0xFFFFFFFF:08x}"]
