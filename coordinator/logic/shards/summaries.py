"""What ingest shards tell the verdict side besides verdicts: the steps they judged and
the report's curves, merged into what one core would have kept.

One core marks each judged step's ranks in its coverage and adds a curve row (loss, grad
norm, deviation per rank) to its series. With K shards each judges the same steps over a
share of the kinds, so the verdict side keeps each shard's coverage (a step is watched
only where every shard judged it: :class:`~.coverage.ShardedCoverage`) and joins a step's
rows once every shard sent its own: the loss from the shard that holds the LOSS kind, the
grad norm from the one holding local grads, the deviation the largest over the shards (it
is a maximum over columns, and every column is one shard's). The proof around a verdict
(:meth:`~.recent.RecentSteps.proof`) is asked of the shards when an incident is written
and joined by :func:`merge_proofs`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.coordinator.logic.views.coverage import ShardedCoverage
from rankscope.coordinator.logic.views.recent import MAX_CHAIN_RECORDS
from rankscope.coordinator.logic.views.series import SeriesRecorder
from rankscope.coordinator.logic.shards.shard import ShardFindings

#: Steps whose rows wait for the other shards; past it the oldest are given up (a shard
#: that lost them is then "not seen" for those steps in the coverage as well).
MAX_HELD = 1024


class ShardSummaries:
    def __init__(self, count: int, coverage: ShardedCoverage, series: SeriesRecorder) -> None:
        self.count, self.coverage, self.series = count, coverage, series
        self._held: dict[tuple[str, int], dict[int, tuple[list[int], tuple]]] = {}
        self.steps_judged = 0  # steps whose every shard's row arrived

    def add(self, f: ShardFindings) -> None:
        for job, step, ranks in f.covered:
            self.coverage.judged_by(f.shard, job, int(step), ranks)
        for group, ranks, row in f.rows:
            parts = self._held.setdefault((group, int(row[0])), {})
            parts[f.shard] = (list(ranks), row)
            if len(parts) == self.count:
                del self._held[(group, int(row[0]))]
                self.series.append(group, *combine_rows([parts[i] for i in range(self.count)]))
                self.steps_judged += 1
        while len(self._held) > MAX_HELD:
            del self._held[next(iter(self._held))]


def combine_rows(parts: list[tuple[list[int], tuple]]) -> tuple[list[int], tuple]:
    """Each shard's row of one step -> the row one core gives (over the first's ranks)."""
    ranks, (step, *_) = parts[0]
    n = len(ranks)
    loss, loss_in = np.full(n, np.nan), np.zeros(n, bool)
    grad, grad_in = np.full(n, np.nan), np.zeros(n, bool)
    dev = np.full(n, np.nan)
    for theirs, (_, (l, li), (g, gi), d) in parts:
        if theirs != ranks:  # a shard that knows the ranks in another order: align by id
            pos = {r: i for i, r in enumerate(theirs)}
            at = np.array([pos.get(r, -1) for r in ranks], np.int64)
            l, li, g, gi, d = (_take(a, at, fill) for a, fill in
                               ((l, np.nan), (li, False), (g, np.nan), (gi, False), (d, np.nan)))
        l, li, g, gi, d = (np.asarray(a)[:n] for a in (l, li, g, gi, d))
        k = len(li)
        loss[:k] = np.where(~loss_in[:k] & li, l, loss[:k])
        loss_in[:k] |= li
        # A kind is one shard's, so a rank's local grads are in one shard's norm; were
        # they in two, the norms of the parts make the norm of the whole.
        grad[:k] = np.where(gi, np.where(grad_in[:k], np.hypot(grad[:k], g), g), grad[:k])
        grad_in[:k] |= gi
        dev[:k] = np.fmax(dev[:k], d)
    return ranks, (step, (loss, loss_in), (grad, grad_in), dev)


def _take(a: Any, at: np.ndarray, fill: Any) -> np.ndarray:
    a = np.asarray(a)
    ok = (at >= 0) & (at < a.shape[0])
    out = np.full(at.shape[0], fill, dtype=a.dtype)
    out[ok] = a[at[ok]]
    return out


def merge_proofs(proofs: list[dict[str, Any]], owner: int | None = None) -> dict[str, Any]:
    """Each shard's proof of one verdict -> one core's. The tensor window is the window of
    the shard holding the verdict's kind (``owner``; else the first that has the tensor);
    the non-finite chain is every shard's records in (step, execution) order, as one
    core lists them (each shard's first MAX_CHAIN_RECORDS hold the first of them all)."""
    out: dict[str, Any] = {}
    order = ([owner] if owner is not None and 0 <= owner < len(proofs) else []) + list(range(len(proofs)))
    window = next((proofs[i]["tensor_window"] for i in order if proofs[i].get("tensor_window")), None)
    if window is not None:
        out["tensor_window"] = window
    chains = [p["nonfinite_chain"] for p in proofs if p.get("nonfinite_chain")]
    if chains:
        rows = sorted((r for c in chains for r in c["records"]),
                      key=lambda r: (r["step"], np.inf if r["exec_index"] is None else r["exec_index"]))
        total = sum(len(c["records"]) + c["more"] for c in chains)
        out["nonfinite_chain"] = {"from_step": chains[0]["from_step"], "records": rows[:MAX_CHAIN_RECORDS],
                                  "more": max(0, total - MAX_CHAIN_RECORDS)}
    return out


#: Aligner counters that count records: every record goes to one shard, so they add up.
#: The others count steps or rank-steps, which every shard sees (each holds its share of
#: every step): the largest shard's figure is the job's.
_ADDED_COUNTERS = frozenset({"records", "late_records", "unknown_name_records", "bad_names"})


def merge_counters(counters: list[dict[str, int]]) -> dict[str, int]:
    """The aligner counters one core would show, from each shard's own."""
    out: dict[str, int] = {}
    for c in counters:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v if k in _ADDED_COUNTERS else max(out.get(k, 0), v)
    return out
