"""MindInsight watchpoints (seeds/002) as rules evaluated on every rank at every step.

MindInsight checked one process; here each rule is one vectorised predicate over the
aligned (ranks x tensors) statistics, so a hit on any rank is found in the same pass
and the hit list is ordered by execution as MindInsight ordered it. What each
condition can measure from statistics is described in watchpoint_rules.py.
"""
from __future__ import annotations

import fnmatch
from typing import Any, Iterator

import numpy as np

from rankscope.config.watchpoints import Condition as C
from rankscope.config.watchpoints import WatchpointRule
from rankscope.coordinator.logic.align.aligner import StepView
from rankscope.coordinator.logic.detectors.common import (
    first_flagged,
    group_values,
    kind_mask,
    make_verdict,
    num,
    stats_dict,
)
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import NO_CRC

_OVERFLOW = {C.TO, C.WO, C.GE}
_RANGE = {C.TR, C.AR}
_STAT_INDEX = {"max": 0, "min": 1, "mean": 2}


def _prev_cols(view: StepView, cols: np.ndarray, attr: str, fill: Any) -> tuple[np.ndarray, np.ndarray]:
    """The previous judged step's values for the same rows/columns (padded when it was smaller)."""
    r = view.ranks.shape[0]
    prev = view.prev
    shape = (r, cols.shape[0]) if attr != "stats" else (r, cols.shape[0], 4)
    vals, pres = np.full(shape, fill, float if attr == "stats" else np.int64), np.zeros((r, cols.shape[0]), bool)
    if prev is None:
        return vals, pres
    pr, pk = prev.present.shape
    rows, ok = min(r, pr), cols < pk
    src = getattr(prev, attr)
    vals[:rows, ok] = src[:rows][:, cols[ok]]
    pres[:rows, ok] = prev.present[:rows][:, cols[ok]]
    return vals, pres


class WatchpointDetector:
    name = "watchpoint"

    def __init__(self, rules: tuple[WatchpointRule, ...]) -> None:
        self.rules = tuple(rules)
        self._name_masks: dict[tuple[int, str], np.ndarray] = {}

    def set_rules(self, rules: tuple[WatchpointRule, ...]) -> None:
        self.rules, self._name_masks = tuple(rules), {}

    def _columns(self, view: StepView, rule: WatchpointRule) -> np.ndarray:
        mask = kind_mask(view.kind, rule.kinds)
        if rule.names:
            k = mask.shape[0]
            cache_key = (id(view.keys), rule.id)
            names = self._name_masks.get(cache_key, np.zeros(0, bool))
            if names.shape[0] < k:  # match only names not seen before: fnmatch per new name, once
                new = [any(fnmatch.fnmatchcase(view.keys.names[i], p) for p in rule.names)
                       for i in range(names.shape[0], k)]
                names = self._name_masks[cache_key] = np.r_[names, np.array(new, bool)]
            mask &= names[:k]
        return np.flatnonzero(mask)

    def _hits(self, view: StepView, rule: WatchpointRule, cols: np.ndarray,
              state: dict) -> Iterator[tuple[str, float | None, np.ndarray, np.ndarray]]:
        """Yield (parameter, threshold, hit (R, C), actual value (R, C)) for one rule."""
        pres = view.present[:, cols]
        st = view.stats[:, cols, :]
        numel = view.numel[:, cols]
        cond = rule.condition
        with np.errstate(invalid="ignore", divide="ignore"):
            rms = np.where(numel > 0, st[:, :, 3] / np.sqrt(np.maximum(numel, 1)), np.nan)
            all_zero = pres & (st[:, :, 0] == 0) & (st[:, :, 1] == 0) & (numel > 0)
            if cond in _OVERFLOW:
                bad = view.nan[:, cols] + view.inf[:, cols]
                yield "overflow", None, pres & (bad > 0), bad.astype(float)
                return
            if cond is C.WNC:
                crc_prev, seen = _prev_cols(view, cols, "crc", NO_CRC)
                st_prev, _ = _prev_cols(view, cols, "stats", np.nan)
                crc = view.crc[:, cols]
                rtol = rule.param("rtol", 0.0) or 0.0
                same_stats = np.all(np.abs(st - st_prev) <= rtol * np.abs(st_prev), axis=2)
                unchanged = np.where((crc != NO_CRC) & (crc_prev != NO_CRC), crc == crc_prev, same_stats)
                yield "rtol", rtol, pres & seen & unchanged, np.abs(st[:, :, 3] - st_prev[:, :, 3])
                return
            if cond in (C.WCL, C.WCS):
                st_prev, seen = _prev_cols(view, cols, "stats", np.nan)
                offset = rule.param("offset", 1e-9) or 0.0
                ratio = np.abs(st[:, :, 3] - st_prev[:, :, 3]) / (np.abs(st_prev[:, :, 3]) + offset)
                key = "change_ratio_gt" if cond is C.WCL else "change_ratio_lt"
                t = rule.param(key)
                hit = ratio > t if cond is C.WCL else ratio < t
                yield key, t, pres & seen & hit, ratio
                return
            first_seen = pres
            if cond is C.WI:  # initial weight: only the first step each (rank, tensor) is seen
                seen = state.setdefault("wi_seen", {}).setdefault(rule.id, np.zeros((0, 0), bool))
                r, k = view.present.shape
                if seen.shape[0] < r or seen.shape[1] < k:
                    grown = np.zeros((max(r, seen.shape[0]), max(k, seen.shape[1])), bool)
                    grown[: seen.shape[0], : seen.shape[1]] = seen
                    seen = state["wi_seen"][rule.id] = grown
                first_seen = pres & ~seen[:r][:, cols]
                seen[:r][:, cols] |= pres
            for key, t in rule.params:
                if key in ("offset", "rtol"):
                    continue
                if key == "zero_pct_ge":
                    yield key, t, first_seen & all_zero, np.where(all_zero, 100.0, np.nan)
                elif key.startswith("range_"):
                    rng = st[:, :, 0] - st[:, :, 1]
                    yield key, t, pres & (rng > t if key == "range_gt" else rng < t), rng
                else:
                    stat, op = key.rsplit("_", 1)
                    val = rms if stat == "rms" else st[:, :, _STAT_INDEX[stat]]
                    yield key, t, first_seen & (val > t if op == "gt" else val < t), val

    def judge(self, view: StepView, state: dict) -> list[Verdict]:
        flag = np.zeros_like(view.present)
        fired: list[tuple[WatchpointRule, str, float | None, np.ndarray, np.ndarray, np.ndarray]] = []
        for rule in self.rules:
            cols = self._columns(view, rule)
            if cols.shape[0] == 0:
                continue
            for key, t, hit, actual in self._hits(view, rule, cols, state):
                if hit.any():
                    flag[:, cols] |= hit
                    fired.append((rule, key, t, cols, hit, actual))
        if not fired:
            return []
        row, col, ties = first_flagged(view, flag)  # type: ignore[misc]
        for rule, key, t, cols, hit, actual in fired:
            j = np.flatnonzero(cols == col)
            if j.shape[0] and hit[row, j[0]]:
                j = int(j[0])
                evidence = {
                    "rule": rule.to_dict(), "condition": rule.condition.value, "parameter": key,
                    "threshold": t, "actual": num(actual[row, j]), "stats": stats_dict(view, row, col),
                    "group_values": group_values(view, col, actual[:, j], [row]),
                    "rules_hit": sorted({r.id for r, *_ in fired}),
                }
                return [make_verdict(self.name, view, row, col, ties, evidence)]
        return []
