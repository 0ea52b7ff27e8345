"""The consistent cut: one step every live rank of a job pauses before.

"Pause every rank at its next boundary" deadlocks data parallelism whenever the ranks
are not at the same boundary: the ones that stop leave a rank that already entered the
next step waiting in its gradient AllReduce until the collective times out. So a pause
names a step ``S``: every rank runs until the boundary that would start ``S`` and holds
there. ``S`` must be one no rank has started yet, judged from what each rank says it
started (heartbeats), the steps it handed over and its newest sync point. Those reports
are late by a heartbeat, so a rank can be past ``S`` when the order arrives: it then
holds at its next boundary (or waits in the collective the others will not enter), says
what it started, and :meth:`CutKeeper.review` moves ``S`` past it for everybody. ``S``
only grows, so this settles after a round or two.

Ranks that cannot reach ``S`` (lost, finished, stalled, never seen) are left out of the
choice and named, with why, in :meth:`CutKeeper.report`: the cut is then partial.

Pure logic over the aligner's rank records; time is passed in.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from rankscope.coordinator.logic.align.aligner import RankRecord, RankState
from rankscope.wire.sync import IN

_TAKES_PART = (RankState.RUNNING, RankState.PAUSED)


def started(rec: RankRecord, known: bool = False) -> int:
    """The newest step this rank may have begun. Over-estimating costs one more step
    before the pause; under-estimating costs a round of :meth:`CutKeeper.review`.
    ``known``: only what the rank said it began, never a guess from the steps it handed
    over (once the pause is out, a rank that handed over the step before the cut is
    most likely holding, not past it; its own report settles which)."""
    best = rec.started if rec.started is not None else -1
    if rec.sync is not None:
        best = max(best, rec.sync.step)
    held = held_before(rec)
    if held is not None:
        best = max(best, held - 1)  # held at the boundary after this step
    else:
        # Handing a step over proves it began that one, and it may have begun the next.
        best = max(best, rec.last_step + (0 if known else 1))
    return best


def held_before(rec: RankRecord) -> int | None:
    """The step a paused rank holds before (its boundary after ``heartbeat_step``); None
    when it is not paused, or handed over a newer step since it said so."""
    if rec.state is RankState.PAUSED and rec.heartbeat_step is not None and rec.heartbeat_step >= rec.last_step:
        return rec.heartbeat_step + 1
    return None


def why_out(rec: RankRecord, now: float) -> str:
    """Why a rank takes no part in the cut, in the words the operator reads."""
    if rec.state is RankState.LOST:
        d = rec.death or {}
        how = f"signal {d['signal']}" if d.get("signal") else f"exit {d.get('exit_status')}"
        return f"lost after step {rec.last_step} ({how}, {d.get('reason') or 'process ended'})"
    if rec.state is RankState.FINISHED:
        return f"finished after step {rec.last_step}"
    if rec.state is RankState.EXPECTED:
        return "never reported"
    return f"stalled: {where(rec, now)}"


def where(rec: RankRecord, now: float) -> str:
    """Where a rank stands, for a rank that is not where the cut wants it."""
    s = rec.sync
    if s is not None and s.phase == IN:
        return f"inside {s.what} of step {s.step} for {max(0.0, now - s.at):.0f} s (a peer never entered it)"
    if s is not None:
        return f"no step after {rec.last_step}, last left {s.what} of step {s.step}"
    return f"no step after {rec.last_step}"


@dataclass
class Cut:
    """A job's cut: the step every live rank holds before, and how it got there."""

    job: str
    step: int
    why: str  # "divergence", "pause", "step N"
    issued_at: float
    moves: list[int] = field(default_factory=list)  # earlier steps it was moved from


class CutKeeper:
    def __init__(self) -> None:
        self.cuts: dict[str, Cut] = {}

    def get(self, job: str) -> Cut | None:
        return self.cuts.get(job)

    def choose(self, job: str, ranks: Iterable[RankRecord], why: str, now: float, ahead: int = 0) -> int:
        """Set the job's cut: the first step no live rank has begun (plus ``ahead`` steps).
        ``ahead`` counts from the current cut when every live rank holds there (``step N``)."""
        live = [r for r in ranks if r.state in _TAKES_PART]
        old = self.cuts.get(job)
        reachable = max((started(r) for r in live), default=-1) + 1
        if old is not None and not ahead:
            # Pausing a paused job again (or re-sending): the cut only ever moves later.
            if reachable > old.step:
                old.moves.append(old.step)
                old.step = reachable
            return old.step
        if old is not None and live and all(held_before(r) == old.step for r in live):
            step = old.step + ahead
        else:
            step = reachable + max(ahead - 1, 0)  # "run N steps": the N-th boundary from here
        self.cuts[job] = Cut(job, max(step, 0), why, now)
        return self.cuts[job].step

    def clear(self, job: str) -> None:
        self.cuts.pop(job, None)

    def review(self, job: str, ranks: Iterable[RankRecord]) -> int | None:
        """The new cut when some live rank has begun the cut's step (or holds past it), else None."""
        cut = self.cuts.get(job)
        if cut is None:
            return None
        live = [r for r in ranks if r.state in _TAKES_PART]
        need = max((max(started(r, known=True) + 1, held_before(r) or 0) for r in live), default=cut.step)
        if need <= cut.step:
            return None
        cut.moves.append(cut.step)
        cut.step = need
        return need

    def settled(self, job: str, ranks: Iterable[RankRecord]) -> bool:
        """Every live rank holds before the cut's step (none left: settled too)."""
        cut = self.cuts.get(job)
        live = [r for r in ranks if r.state in _TAKES_PART]
        if cut is None:
            return all(r.state is RankState.PAUSED for r in live)
        return all(held_before(r) == cut.step for r in live)

    def report(self, job: str, ranks: Iterable[RankRecord], now: float,
               given_up: bool = False) -> dict[str, Any] | None:
        """The cut as the state, status and incident.json show it: each rank's place, and
        ``partial`` naming every rank that is not held at the cut, with why (``given_up``:
        the pause timed out, so a rank still on its way is not coming either). ``now`` is
        the wall clock (sync points carry wall times)."""
        cut = self.cuts.get(job)
        if cut is None:
            return None
        out: dict[str, Any] = {"step": cut.step, "why": cut.why, "moved_from": list(cut.moves), "ranks": {},
                               "partial": {}}
        for r in ranks:
            if r.state in _TAKES_PART and held_before(r) == cut.step:
                out["ranks"][str(r.rank)] = f"paused before step {cut.step}"
            elif r.state in _TAKES_PART:
                h = held_before(r)
                place = f"paused before step {h}" if h is not None else where(r, now)
                out["ranks"][str(r.rank)] = f"on its way ({place})"
                if given_up:
                    out["partial"][str(r.rank)] = f"did not reach step {cut.step}: {place}"
            else:
                out["ranks"][str(r.rank)] = out["partial"][str(r.rank)] = why_out(r, now)
        out["complete"] = not out["partial"] and all(v.startswith("paused before") for v in out["ranks"].values())
        return out
