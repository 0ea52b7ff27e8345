"""NaN/Inf origin: the rank whose record went non-finite first.

After an AllReduce every rank holds the NaN, so "which ranks have a NaN" names the
whole group. The origin shows only in records measured before any collective
(PRE_REDUCTION_KINDS: activations, local grads, local loss), so those are searched
first; only if none is non-finite (e.g. a parameter corrupted in place) are the
replicated kinds searched.

A collective hands a NaN on to every rank of its group: a tensor-parallel AllReduce to the
other shards, a pipeline send to the next stage. A rank whose first non-finite record is
a collective's output while its own input to that call was finite only received it, and
is passed over for the ranks that did not (:func:`receivers`), whatever their shard,
stage or execution order.

A rank that produced a NaN and died (or hung) before its records of that step left it
is absent from the step, while every rank seen holds the NaN the reduction gave it. The
ranks seen are then all receivers: the absent ranks are named, the only ones that could
have fed the reduction, and the evidence says it was inferred.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from rankscope.coordinator.logic.align.aligner import NO_EXEC, StepView
from rankscope.coordinator.logic.detectors.common import (
    first_flagged,
    group_values,
    kind_mask,
    make_verdict,
    stats_dict,
)
from rankscope.coordinator.logic.detectors.loss_scale import OVERFLOW, SCALED, gradient_columns
from rankscope.coordinator.logic.detectors.loss_scale import nonfinite as nonfinite_mask
from rankscope.coordinator.logic.detectors.named import call_inputs, collective_io
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import PRE_REDUCTION_KINDS

_PRE = frozenset(int(k) for k in PRE_REDUCTION_KINDS)
_RULE = "first non-finite record"
_BEFORE = " before reduction"


def before_reduction(v: Verdict) -> bool:
    """Whether a NaN-origin verdict was found among records taken before any reduction."""
    return str(v.evidence.get("rule", "")).endswith(_BEFORE)


class NanOriginDetector:
    name = "nan_origin"

    def __init__(self, kinds: frozenset[int] | None = None) -> None:
        self.kinds = kinds  # None: every kind

    def judge(self, view: StepView, state: dict) -> list[Verdict]:
        if view.cache.get(OVERFLOW):
            return []  # gradients a loss scale caught (detectors.loss_scale), nothing else
        bad = nonfinite_mask(view)
        if self.kinds is not None:
            bad = bad & kind_mask(view.kind, self.kinds)[None, :]  # a new array: the cached mask stays whole
        if view.cache.get(SCALED):  # a gradient's Inf may be the loss scale's: the other records first
            outside = bad & ~gradient_columns(view)[None, :]
            bad = outside if outside.any() else bad
        if not bad.any():
            return []
        pre = bad & kind_mask(view.kind, _PRE)[None, :]
        before = bool(pre.any())
        flag = pre if before else bad
        got = receivers(view, flag, bad)
        if got.any() and (flag.any(axis=1) & ~got).any():
            flag = flag & ~got[:, None]
        row, col, ties = first_flagged(view, flag)  # type: ignore[misc]
        nonfinite = (view.nan[:, col] + view.inf[:, col]).astype(float)
        absent = None if before else _unseen_senders(view, bad)
        if absent is not None:
            return [_inferred(view, row, col, absent, nonfinite)]
        evidence = {
            "rule": _RULE + (_BEFORE if before else " (no pre-reduction record is non-finite)"),
            "nan_count": int(view.nan[row, col]), "inf_count": int(view.inf[row, col]),
            "numel": int(view.numel[row, col]), "stats": stats_dict(view, row, col),
            "group_nonfinite_counts": group_values(view, col, nonfinite, [row]),
            "ranks_nonfinite_this_step": int(bad.any(axis=1).sum()),
        }
        if got.any():
            evidence["received_through_a_collective"] = sorted(int(view.ranks[r]) for r in np.flatnonzero(got))
        return [make_verdict(self.name, view, row, col, ties, evidence)]


def receivers(view: StepView, flag: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """(R,) rows whose first flagged record is a collective's output while every input
    they gave that call was finite: the value came to them from the group."""
    out = np.zeros(view.ranks.shape[0], bool)
    rows = np.flatnonzero(flag.any(axis=1))
    if not rows.shape[0]:
        return out
    first = np.argmin(np.where(flag[rows], view.exec[rows], NO_EXEC), axis=1)
    for r, c in zip(rows.tolist(), first.tolist()):
        io = collective_io(view.keys, c)
        if io is None or io.io != "output":
            continue
        ins = [i for i in call_inputs(view.keys, io) if i < flag.shape[1] and view.present[r, i]]
        out[r] = bool(ins) and not bad[r, ins].any()
    return out


def _unseen_senders(view: StepView, bad: np.ndarray) -> np.ndarray | None:
    """Rows that sent nothing of this step, when every row that did holds a non-finite
    record after the reduction: those rows are all receivers."""
    seen = view.reported
    absent = np.flatnonzero(~seen)
    if not absent.shape[0] or not seen.any() or not bad[seen].any(axis=1).all():
        return None
    return absent[np.argsort(view.ranks[absent], kind="stable")]


def _inferred(view: StepView, row: int, col: int, absent: np.ndarray, nonfinite: np.ndarray) -> Verdict:
    seen_on = int(view.ranks[row])
    names = ", ".join(str(int(view.ranks[r])) for r in absent)
    evidence = {
        "rule": f"{_RULE}: inferred, every rank seen received it through the reduction and rank(s) {names} "
                "sent no records of this step",
        "seen_first_on": seen_on, "stats_seen": stats_dict(view, row, col),
        "nan_count": int(view.nan[row, col]), "inf_count": int(view.inf[row, col]),
        "numel": int(view.numel[row, col]),
        "group_nonfinite_counts": group_values(view, col, nonfinite, [row]),
        "ranks_unseen_this_step": [int(view.ranks[r]) for r in absent],
    }
    v = make_verdict(NanOriginDetector.name, view, row, col, [], evidence)
    return dataclasses.replace(v, rank=int(view.ranks[absent[0]]), ties=[int(view.ranks[r]) for r in absent[1:]])
