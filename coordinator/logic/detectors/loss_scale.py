"""Overflow steps under a loss scale: healthy float16 training, told apart from faults.

Float16 training multiplies the loss by a scale. When the scaled gradients overflow to
Inf, every rank skips that step's update (the reduction hands every rank the Inf) and the
scale is lowered: the first steps of a job do this by design, later ones now and then,
and near the scale's ceiling one rank's batch may overflow while its peers' do not.
None of that is a fault.

A step is an overflow step when the job runs under a loss scale (its ranks send
:data:`~rankscope.wire.records.LOSS_SCALE_RECORD`) and every non-finite value of the step
is a gradient: backward records, local or reduced parameter gradients. Such a step is
counted and shown, and ``view.cache["overflow"]`` tells the detectors after this one
(NaN origin) to leave its gradients alone. A non-finite input, activation, loss, weight or
optimizer state is never an overflow: NaN origin judges it as in any job, from those
records first (under a scale, a gradient's Inf may be the scale's, the others' cannot).

Still a finding, of this detector's own: a scale that keeps falling. ``streak`` overflow
steps in a row after the scale once ran clean, or an overflow at the scale's floor, means
the gradients overflow whatever the scale, so something other than the scale is wrong.
When one rank alone overflowed at every step of the streak, that rank is named; else the
verdict names no rank (every rank runs it: code, data or configuration), and like any
verdict without a culprit it never pauses or stops the job.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from rankscope.config.detectors import LossScaleSettings
from rankscope.coordinator.logic.align.aligner import StepView
from rankscope.coordinator.logic.detectors.common import first_flagged, kind_mask
from rankscope.coordinator.logic.detectors.named import reduced_inputs
from rankscope.coordinator.logic.verdict import JOB_WIDE, Verdict
from rankscope.wire.records import LOSS_SCALE_RECORD, Kind

#: Where a loss-scale overflow shows: what the backward computes.
GRADIENT_KINDS = frozenset({int(Kind.BACKWARD), int(Kind.GRAD_LOCAL), int(Kind.GRAD_REDUCED)})
#: Gradients a rank computed itself, before any reduction spread another rank's Inf.
_OWN_GRADIENTS = frozenset({int(Kind.BACKWARD), int(Kind.GRAD_LOCAL)})
#: The overflow steps kept for status and coverage (the count is kept in full).
RECENT = 16
#: The newest changes of the scale kept (step, scale): the report draws the scale from them.
CHANGES = 64
OVERFLOW = "overflow"  # view.cache key: this step's non-finite gradients are a loss-scale overflow
SCALED = "loss_scaled"  # view.cache key: the job runs under a loss scale
NONFINITE = "nonfinite"  # view.cache key: the (R, K) NaN/Inf mask


class LossScaleDetector:
    name = "loss_scale"

    def __init__(self, settings: LossScaleSettings | None = None) -> None:
        self.settings = settings or LossScaleSettings()

    def judge(self, view: StepView, state: dict[str, Any]) -> list[Verdict]:
        scale = _scale_of(view, state)
        if scale is not None:
            changes = state.setdefault("changes", deque(maxlen=CHANGES))
            if not changes or changes[-1][1] != scale:
                changes.append((view.step, scale))
            state["scale"] = scale
        elif not state.get("scaled"):
            return []
        state["scaled"] = view.cache[SCALED] = True
        bad = nonfinite(view)
        if not bad.any():
            state["streak"], state["settled"], state["alone"] = 0, True, None
            return []
        grads = gradient_columns(view)[None, :]
        if (bad & ~grads).any():
            return []  # a value no backward made: not the scale's business
        view.cache[OVERFLOW] = True
        own = bad & gradient_columns(view, own=True)[None, :]
        over = own.any(axis=1)  # rows whose own gradients overflowed
        state["overflow_steps"] = state.get("overflow_steps", 0) + 1
        recent = state.setdefault("recent", deque(maxlen=RECENT))
        recent.append({"step": view.step, "scale": state.get("scale"),
                       "ranks_overflowed": int(over.sum()), "ranks": int(view.reported.sum())})
        if not state.get("settled"):
            return []  # the scale still searching down from its start: by design
        state["streak"] = state.get("streak", 0) + 1
        alone = _alone(view, over)  # a rank id
        state["alone"] = alone if state["streak"] == 1 else (alone if alone == state.get("alone") else -1)
        if state.get("streak_from") is None or state["streak"] == 1:
            state["streak_from"] = (view.step, state.get("scale"))
        s = self.settings
        at_floor = state.get("scale") is not None and state["scale"] <= s.floor
        if state["streak"] < s.streak and not at_floor:
            return []
        if state.get("said_for") == state["streak_from"][0]:
            return []
        state["said_for"] = state["streak_from"][0]
        return [self._verdict(view, state, bad, at_floor)]

    def _verdict(self, view: StepView, state: dict[str, Any], bad: np.ndarray, at_floor: bool) -> Verdict:
        first, was = state["streak_from"]
        now = state.get("scale")
        why = (f"the loss scale reached its floor ({_num(now)}) and the gradients still overflow" if at_floor else
               f"{state['streak']} overflow steps in a row since step {first}")
        evidence = {
            "rule": f"a loss scale that keeps falling: {why}; the scale went from {_num(was)} to {_num(now)}",
            "streak": int(state["streak"]), "streak_from_step": int(first),
            "scale_then": was, "scale_now": now, "overflow_steps": int(state["overflow_steps"]),
        }
        alone = state.get("alone")
        rows = np.flatnonzero(view.reported)
        hit = np.flatnonzero(view.ranks == alone) if alone is not None and alone >= 0 else ()
        if len(hit):
            row = int(hit[0])
            evidence["overflowed_alone"] = "at every step of the streak only this rank's own gradients " \
                                           "overflowed; its peers' stayed finite"
            flag = np.zeros_like(bad)
            flag[row] = bad[row]
            found = first_flagged(view, flag)
            col = found[1] if found else None
            return _make(view, row, col, [], evidence, decided=True)
        evidence[JOB_WIDE] = "every rank overflowed: the job, not one rank (code, data or configuration)"
        return _make(view, int(rows[0]) if rows.shape[0] else 0, None,
                     [int(r) for r in rows[1:]], evidence, decided=False)


def nonfinite(view: StepView) -> np.ndarray:
    """(R, K) records with a NaN or Inf, computed once a step for the detectors that ask."""
    bad = view.cache.get(NONFINITE)
    if bad is None:
        bad = view.cache[NONFINITE] = view.present & ((view.nan > 0) | (view.inf > 0))
    return bad


def gradient_columns(view: StepView, own: bool = False) -> np.ndarray:
    """(K,) the columns that hold gradients (``own``: a rank's own, before any reduction):
    by kind, and the inputs of a collective whose output is a reduced gradient."""
    mask = kind_mask(view.kind, _OWN_GRADIENTS if own else GRADIENT_KINDS)
    ins = reduced_inputs(view.keys, view.kind, int(Kind.GRAD_REDUCED))
    mask[ins] = True
    return mask


def status_of(state: dict[str, Any]) -> dict[str, Any] | None:
    """What status and coverage show of one group's loss scale, or None without one."""
    if not state.get("scaled"):
        return None
    return {"scale": state.get("scale"), "overflow_steps": int(state.get("overflow_steps", 0)),
            "recent_overflows": list(state.get("recent") or ()), "streak": int(state.get("streak", 0)),
            "scale_changes": [list(c) for c in state.get("changes") or ()]}


def _scale_of(view: StepView, state: dict[str, Any]) -> float | None:
    """The step's scale (the median over the ranks that sent it). Every step of every job
    comes here, most without a scale: columns are looked at once, as they appear."""
    names = view.keys.names
    col = state.get("col")
    if col is None:
        seen = state.get("searched", 0)
        col = next((i for i in range(seen, len(names)) if names[i] == LOSS_SCALE_RECORD), None)
        state["col"], state["searched"] = col, len(names)
    if col is None or col >= view.present.shape[1]:
        return None
    rows = view.present[:, col]
    if not rows.any():
        return None
    vals = view.stats[rows, col, 0]  # Max of a scalar: the scale
    vals = vals[np.isfinite(vals)]
    return float(np.median(vals)) if vals.shape[0] else None


def _alone(view: StepView, over: np.ndarray) -> int | None:
    """The rank whose own gradients overflowed while every other reported rank's stayed
    finite; None otherwise."""
    rows = np.flatnonzero(over)
    return int(view.ranks[rows[0]]) if rows.shape[0] == 1 and int(view.reported.sum()) > 1 else None


def _make(view: StepView, row: int, col: int | None, tie_rows: list[int], evidence: dict[str, Any],
          decided: bool) -> Verdict:
    kind = int(view.kind[col]) if col is not None else -1
    return Verdict(
        detector=LossScaleDetector.name, rank=int(view.ranks[row]), step=view.step,
        tensor=view.keys.names[col] if col is not None else LOSS_SCALE_RECORD,
        exec_index=None, kind=Kind(kind).name.lower() if kind >= 0 else "opt_state", group=view.group,
        evidence=evidence, ties=sorted(int(view.ranks[r]) for r in tie_rows), job=view.job, decided=decided)


def _num(x: Any) -> str:
    return "unknown" if x is None or not math.isfinite(float(x)) else f"{float(x):g}"
