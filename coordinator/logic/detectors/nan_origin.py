"""NaN/Inf origin: the rank whose record went non-finite first.

After an AllReduce every rank holds the NaN, so "which ranks have a NaN" names the
whole group. The origin shows only in records measured before any collective
(PRE_REDUCTION_KINDS: activations, local grads, local loss), so those are searched
first; only if none is non-finite (e.g. a parameter corrupted in place) are the
replicated kinds searched.
"""
from __future__ import annotations

from rankscope.coordinator.logic.aligner import StepView
from rankscope.coordinator.logic.detectors.common import (
    first_flagged,
    group_values,
    kind_mask,
    make_verdict,
    stats_dict,
)
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
        bad = view.present & ((view.nan > 0) | (view.inf > 0))
        if self.kinds is not None:
            bad &= kind_mask(view.kind, self.kinds)[None, :]
        if not bad.any():
            return []
        pre = bad & kind_mask(view.kind, _PRE)[None, :]
        flag = pre if pre.any() else bad
        row, col, ties = first_flagged(view, flag)  # type: ignore[misc]
        nonfinite = (view.nan[:, col] + view.inf[:, col]).astype(float)
        evidence = {
            "rule": _RULE + (_BEFORE if flag is pre else " (no pre-reduction record is non-finite)"),
            "nan_count": int(view.nan[row, col]), "inf_count": int(view.inf[row, col]),
            "numel": int(view.numel[row, col]), "stats": stats_dict(view, row, col),
            "group_nonfinite_counts": group_values(view, col, nonfinite, [row]),
            "ranks_nonfinite_this_step": int(bad.any(axis=1).sum()),
        }
        return [make_verdict(self.name, view, row, col, ties, evidence)]
