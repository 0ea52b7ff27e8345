"""Data-parallel ranks that read the same data: what must differ and does not.

Ranks of one role (same shard and stage, other data: :mod:`..layout`) are there to train
on different batches. When two or more of them hold bit-identical local gradients and
loss at a step, they computed the same thing from the same batch: a sampler that does not
shard, a seed that picks the same indices on every rank. The job trains on a fraction of
its data while every check passes, so nothing else would say it.

Where a rank records no local gradient (no gradient reducer the probe sees), the loss
alone is compared, and the same ranks must tie on two steps in a row.

This is a warning, never a verdict: no pause, no incident. It is kept in the detector's
state (the first step and which ranks, and how many steps showed it) for the status,
coverage.json and the launch line.

How it can be wrong: a job that gives every rank the same batch on purpose (a debugging
run; ``cluster.compare: "replicas"`` says so, and then nothing is warned), or a step whose
gradients are all zero (skipped: at least one compared value must be finite and non-zero).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.coordinator.logic.align.aligner import StepView
from rankscope.coordinator.logic.detectors.common import kind_mask
from rankscope.coordinator.logic.detectors.replica import signatures
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import Kind
from rankscope.text.spans import rank_span

NAME = "same_data"
_KINDS = frozenset({int(Kind.GRAD_LOCAL), int(Kind.LOSS)})
_SHOWN = 16


class SameDataDetector:
    name = NAME

    def judge(self, view: StepView, state: dict[str, Any]) -> list[Verdict]:
        if view.replicas_mode or view.ranks.shape[0] < 2:
            return []
        cols = np.flatnonzero(kind_mask(view.kind, _KINDS))
        if not cols.shape[0]:
            return []
        sets = view.sets
        groups = [np.arange(view.ranks.shape[0])] if sets is None or sets.whole else sets.role_groups()
        found = []
        for rows in groups:
            found += _same(view, rows, cols)
        if found and not (view.kind[cols] == int(Kind.GRAD_LOCAL)).any():
            # The loss alone: a model whose head starts at zero gives every input the same
            # loss at its first step, so the same ranks must tie at the next step too.
            held, state["held"] = state.get("held"), {"step": view.step, "sets": found}
            if not held or held["step"] != view.step - 1 or held["sets"] != found:
                return []
            if "first" not in state:
                state["first"] = {"step": held["step"], "sets": found[:_SHOWN]}
                state["steps"] = 1
        if found:
            first = state.setdefault("first", {"step": view.step, "sets": found[:_SHOWN]})
            state["steps"] = state.get("steps", 0) + 1
            state["last_step"] = view.step
            if first["step"] != view.step:
                state["last_sets"] = found[:_SHOWN]
        return []


def _same(view: StepView, rows: np.ndarray, cols: np.ndarray) -> list[list[int]]:
    """Rank sets among ``rows`` whose every compared record is equal, bit for bit."""
    c = cols[view.present[rows][:, cols].all(axis=0)]
    if not c.shape[0]:
        return []
    # Ranks that read different data differ already in one column: a sort of that column
    # alone leaves only the ranks that tie on it to hash over every column (a clean step of
    # thousands of ranks costs one sort, not a signature of every record).
    bits = np.ascontiguousarray(view.stats[rows, c[0], :]).view(np.uint64)
    key = bits[:, 0] ^ (bits[:, 1] << np.uint64(1)) ^ (bits[:, 2] << np.uint64(2)) ^ (bits[:, 3] << np.uint64(3))
    _, where, counts = np.unique(key, return_inverse=True, return_counts=True)
    tied = counts[where] >= 2
    if not tied.any():
        return []
    rows = rows[tied]
    vals = view.stats[rows][:, c, :]
    live = np.isfinite(vals) & (vals != 0)
    if not live.any():
        return []
    sig = signatures(view, c, rows)
    _, which, counts = np.unique(sig, axis=0, return_inverse=True, return_counts=True)
    which = which.reshape(-1)
    return [sorted(int(view.ranks[rows[i]]) for i in np.flatnonzero(which == k))
            for k in np.flatnonzero(counts >= 2)]


def summary(states: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the status and coverage say, over the detector's state of several groups; None
    when no ranks read the same data."""
    seen = [s for s in states if s.get("first")]
    if not seen:
        return None
    first = min(seen, key=lambda s: s["first"]["step"])["first"]
    sets = [g for s in seen for g in s["first"]["sets"]][:_SHOWN]
    return {"first_step": first["step"], "sets": sets, "steps": max(s.get("steps", 0) for s in seen),
            "last_step": max(s.get("last_step", first["step"]) for s in seen),
            "line": line(first["step"], sets)}


def line(step: int, sets: list[list[int]]) -> str:
    who = "; ".join(rank_span(g) for g in sets)
    return (f"{who} read the same data at step {step}: their loss and local gradients (where recorded) are bit-identical, so the "
            "data-parallel ranks train on one rank's batches (a sampler that does not shard, or the same seed "
            "picking the same samples); not an incident, the job runs on")
