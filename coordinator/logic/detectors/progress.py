"""Progress: ranks that miss a step's deadline or lag their group (crashes and hangs are
judged by :mod:`rankscope.coordinator.logic.incidents.failures`).

For every finding the step named is the first step the rank did not complete
(its newest reported step + 1), which is what a user needs to look at: a rank
killed in step 12 reported step 11 last.
"""
from __future__ import annotations

from typing import Any

from rankscope.config.detectors import ProgressSettings
from rankscope.coordinator.logic.align.aligner import (
    LIVE_STATES,
    Group,
    RankRecord,
    RankState,
    StepView,
)
from rankscope.coordinator.logic.detectors.common import MAX_EVIDENCE_RANKS
from rankscope.coordinator.logic.align.pace import Pace
from rankscope.coordinator.logic.verdict import Verdict


class ProgressDetector:
    name = "progress"

    def __init__(self, settings: ProgressSettings) -> None:
        self.settings = settings
        self._lag_scan = Pace()  # per group label

    def _verdict(self, recs: list[RankRecord], group: str, job: str, evidence: dict[str, Any]) -> Verdict:
        # The first diverging rank is the one that stopped earliest; equal stops are ties.
        first = min(r.last_step for r in recs)
        tied = sorted(r.rank for r in recs if r.last_step == first)
        evidence["last_step"] = {str(r.rank): r.last_step for r in recs[:MAX_EVIDENCE_RANKS]}
        return Verdict(detector=self.name, rank=tied[0], step=first + 1, tensor=None, exec_index=None,
                       kind=None, group=group, evidence=evidence, ties=tied[1:], job=job)

    def missing(self, view: StepView, records: list[RankRecord], deadline_s: float) -> list[Verdict]:
        """Live ranks that had not reported ``view.step`` when it was judged."""
        if not view.missing:
            return []
        miss = [r for r in records if r.rank in set(view.missing)]
        reported = int(view.reported.sum())
        ev = {
            "rule": f"missing step {view.step} after {deadline_s:g} s" if view.by_deadline
            else f"missing step {view.step} while too many steps were pending",
            "missing": sorted(view.missing)[:MAX_EVIDENCE_RANKS], "reported": reported,
            "live": int(view.live.sum()),
            "heartbeat_step": {str(r.rank): r.heartbeat_step for r in miss[:MAX_EVIDENCE_RANKS]},
        }
        return [self._verdict(miss, view.group, view.job, ev)]

    def lagging(self, group: Group, now: float | None = None) -> list[Verdict]:
        """Live ranks more than ``lag_steps`` behind the group's newest; with ``now``, at
        most every :data:`~..pace.MEMBER_SCAN_S` per group (without: every call, e.g. at the
        job's end)."""
        lag_steps = self.settings.lag_steps
        if lag_steps is None or (now is not None and not self._lag_scan.due(group.label, now)):
            return []
        live = [m for m in group.members if m.state in LIVE_STATES]
        if len(live) < 2:
            return []
        newest = max(m.last_step for m in live)
        behind = [m for m in live if newest - m.last_step > lag_steps]
        if not behind:
            return []
        ev = {"rule": f"more than {lag_steps} steps behind the group", "group_newest_step": newest,
              "lagging": sorted(m.rank for m in behind)[:MAX_EVIDENCE_RANKS],
              "never_reported": sorted(m.rank for m in behind if m.state is RankState.EXPECTED)[:MAX_EVIDENCE_RANKS]}
        return [self._verdict(behind, group.label, group.job, ev)]
