"""Watchpoints checked again over the steps the coordinator still keeps (MindInsight's
"recheck"): a rule made after the fact answers for the recent past, not only from the next
step on.

Each kept step of each comparison group goes, oldest first, through a watchpoint detector
of its own with a state of its own, so the recheck neither raises an incident nor moves the
running detector's state (an initial-weight rule's "first seen", a change rule's previous
step). Per step the first hit in execution order is listed, as the running detector gives
one verdict a step. How far back it reaches is what ``RecentSteps`` keeps (its step and
cell limits); the answer says which steps were checked. Pure logic over kept step views.
"""
from __future__ import annotations

from typing import Any

from rankscope.config.watchpoints import WatchpointRule
from rankscope.coordinator.logic.detectors.watchpoints import WatchpointDetector
from rankscope.coordinator.logic.align.slots import StepView

#: Hits listed at most (the earliest ones): the page shows a list, not a dump.
MAX_HITS = 500


def recheck(groups: dict[str, list[StepView]], rules: tuple[WatchpointRule, ...]) -> dict[str, Any]:
    """``{"hits": [...], "steps": [first, last] | None, "checked": n}`` for ``rules`` over
    each group's kept views (oldest first)."""
    hits: list[dict[str, Any]] = []
    steps: list[int] = []
    for group, views in groups.items():
        det, state = WatchpointDetector(rules), {}
        for view in views:
            steps.append(view.step)
            for v in det.judge(view, state):
                ev = v.evidence
                hits.append({"group": group, "job": v.job, "step": v.step, "rank": v.rank, "ties": v.ties,
                             "tensor": v.tensor, "exec_index": v.exec_index, "rules_hit": ev.get("rules_hit", []),
                             "condition": ev.get("condition"), "parameter": ev.get("parameter"),
                             "threshold": ev.get("threshold"), "actual": ev.get("actual")})
    hits.sort(key=lambda h: (h["step"], -1 if h["exec_index"] is None else h["exec_index"], h["rank"]))
    return {"hits": hits[:MAX_HITS], "more": max(0, len(hits) - MAX_HITS),
            "steps": [min(steps), max(steps)] if steps else None, "checked": len(set(steps))}
