"""Weights changed outside the optimizer: between one step's end and the next one's start.

Each rank records every parameter's CRC-32 twice a step: as the step starts
(``Sentinel.param.<name>``) and once its optimizer is done (``Sentinel.param_end.<name>``).
Nothing a training loop does between those two points should touch a weight, so a
parameter whose start-of-step value differs from its value at the end of the step before
was changed by something else: a stray ``set_data``, a bad checkpoint load, memory
corruption. That needs no majority: a rank that did it is named on its own, in any
layout, with two replicas or none. A change every rank of the job makes at the same step
(a max-norm clip everyone applies, weights loaded everywhere) is deliberate and not a
finding.
"""
from __future__ import annotations

import numpy as np

from rankscope.coordinator.logic.align.aligner import StepView
from rankscope.coordinator.logic.detectors.common import first_flagged, make_verdict, stats_dict
from rankscope.coordinator.logic.detectors.named import param_pairs
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import NO_CRC

RULE = ("parameter changed between the end of the last step and the start of this one, outside the optimizer "
        "(CRC-32 at the step's start differs from the one after the last update)")


def moved_cells(view: StepView) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(moved, start columns, end columns): ``moved`` is (R, P), True where a rank's
    parameter changed outside the optimizer and not every rank's did; None when there is
    nothing to compare (no previous step, or no parameter recorded at both points)."""
    prev = view.prev
    if prev is None or prev.step != view.step - 1:
        return None
    starts, ends = param_pairs(view.keys)
    k_now, k_prev = view.present.shape[1], prev.present.shape[1]
    keep = (starts < k_now) & (ends < k_prev)
    if not keep.any() or prev.ranks.shape[0] > view.ranks.shape[0] or \
            not np.array_equal(prev.ranks, view.ranks[: prev.ranks.shape[0]]):
        return None
    starts, ends = starts[keep], ends[keep]
    r = prev.ranks.shape[0]
    now_crc, then_crc = view.crc[:r, starts], prev.crc[:, ends]
    both = view.present[:r, starts] & prev.present[:, ends] & (now_crc != NO_CRC) & (then_crc != NO_CRC)
    changed = both & (now_crc != then_crc)
    # Per parameter: some ranks changed it, not all of those that hold it.
    partial = changed.any(axis=0) & ~(changed | ~both).all(axis=0)
    moved = np.zeros(view.present[:, starts].shape, bool)
    moved[:r] = changed & partial[None, :]
    return moved, starts, ends


def movers(view: StepView) -> np.ndarray:
    """(R,) rows that changed a weight outside the optimizer before this step."""
    got = moved_cells(view)
    if got is None:
        return np.zeros(view.ranks.shape[0], bool)
    return got[0].any(axis=1)


class ParamMovedDetector:
    name = "param_moved"

    def judge(self, view: StepView, state: dict) -> list[Verdict]:
        got = moved_cells(view)
        if got is None or not got[0].any():
            return []
        moved, starts, ends = got
        flag = np.zeros_like(view.present)
        flag[:, starts] = moved
        row, col, ties = first_flagged(view, flag)  # type: ignore[misc]
        j = int(np.flatnonzero(starts == col)[0])
        prev = view.prev
        end = int(ends[j])
        evidence = {
            "rule": RULE,
            "crc32_at_start": f"{int(view.crc[row, col]) & 0xFFFFFFFF:08x}",
            "crc32_after_last_update": f"{int(prev.crc[row, end]) & 0xFFFFFFFF:08x}",  # type: ignore[union-attr]
            "stats": stats_dict(view, row, col), "stats_after_last_update": stats_dict(prev, row, end),  # type: ignore[arg-type]
            "parameters_changed": int(moved[row].sum()),
            "ranks_that_changed_it": sorted(int(view.ranks[r]) for r in np.flatnonzero(moved[:, j])),
        }
        return [make_verdict(self.name, view, row, col, ties, evidence)]
