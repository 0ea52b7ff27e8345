"""What the coordinator saw and judged, per rank and step: the ground under every "no
divergence".

A verdict of "nothing found" is only worth the steps it covers. :class:`Coverage` marks
each (rank, step) whose records were in a judged step, keeps what the ranks said they
dropped, and :func:`describe` says it in one line: "watched steps 0-15 on 4/4 ranks", or
"rank 2 steps 4-9 not seen (212 steps dropped in the rank)". Pure: no clock, no I/O.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterable


class StepRanges:
    """A set of step numbers kept as sorted, disjoint, inclusive ranges (steps arrive
    mostly in order, so this stays a handful of ranges)."""

    def __init__(self) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []

    def add(self, step: int) -> None:
        hi = self._hi
        if hi and hi[-1] == step - 1 and step > 0:  # the next step, the usual case
            hi[-1] = step
            return
        i = bisect.bisect_right(self._lo, step) - 1
        if i >= 0 and self._lo[i] <= step <= self._hi[i]:
            return
        joins_left = i >= 0 and self._hi[i] == step - 1
        joins_right = i + 1 < len(self._lo) and self._lo[i + 1] == step + 1
        if joins_left and joins_right:
            self._hi[i] = self._hi[i + 1]
            del self._lo[i + 1], self._hi[i + 1]
        elif joins_left:
            self._hi[i] = step
        elif joins_right:
            self._lo[i + 1] = step
        else:
            self._lo.insert(i + 1, step)
            self._hi.insert(i + 1, step)

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._lo, self._hi))

    def __len__(self) -> int:
        return sum(h - l + 1 for l, h in zip(self._lo, self._hi))

    def bounds(self) -> tuple[int, int] | None:
        return (self._lo[0], self._hi[-1]) if self._lo else None

    def intersection(self, other: "StepRanges") -> "StepRanges":
        """The steps in both sets."""
        out, i, j = StepRanges(), 0, 0
        while i < len(self._lo) and j < len(other._lo):
            lo, hi = max(self._lo[i], other._lo[j]), min(self._hi[i], other._hi[j])
            if lo <= hi:
                out._lo.append(lo)
                out._hi.append(hi)
            if self._hi[i] < other._hi[j]:
                i += 1
            else:
                j += 1
        return out

    def missing(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The ranges of [lo, hi] not in the set."""
        gaps, at = [], lo
        for l, h in zip(self._lo, self._hi):
            if h < at:
                continue
            if l > hi:
                break
            if l > at:
                gaps.append((at, min(l - 1, hi)))
            at = max(at, h + 1)
        if at <= hi:
            gaps.append((at, hi))
        return gaps


@dataclass
class RankCoverage:
    judged: StepRanges = field(default_factory=StepRanges)
    dropped_steps: int = 0  # steps the rank's client dropped (its queue was full)


class Coverage:
    def __init__(self) -> None:
        self._ranks: dict[tuple[str, int], RankCoverage] = {}

    def _rank(self, job: str, rank: int) -> RankCoverage:
        return self._ranks.setdefault((job, rank), RankCoverage())

    def judged(self, job: str, step: int, ranks: Iterable[int]) -> None:
        """A step was judged with these ranks' records in it (every step, every rank: kept lean)."""
        known = self._ranks
        for r in ranks:
            rc = known.get((job, r))
            if rc is None:
                rc = known[(job, int(r))] = RankCoverage()
            rc.judged.add(step)

    def dropped(self, job: str, rank: int, steps: int) -> None:
        """The rank says it has dropped this many steps so far (a running total)."""
        rc = self._rank(job, rank)
        rc.dropped_steps = max(rc.dropped_steps, steps)

    def report(self, job: str, ends: dict[int, int | None]) -> dict[str, Any]:
        """What was watched of ``job``. ``ends``: every rank known to the job, with the
        last step it can have run when it ended early (lost), else None (ran to the end)."""
        return _report(job, {r: rc for (j, r), rc in self._ranks.items() if j == job}, ends)


class ShardedCoverage(Coverage):
    """Coverage when K ingest shards judge the records (each a share of the kinds): a
    step counts as watched for a rank only when every shard judged it with that rank's
    records, so a step one shard lost (or judged without the rank) is "not seen", never
    quietly half-judged. What ranks say they dropped is kept here, as in :class:`Coverage`."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.shards = [Coverage() for _ in range(count)]

    def judged_by(self, shard: int, job: str, step: int, ranks: Iterable[int]) -> None:
        self.shards[shard].judged(job, step, ranks)

    def report(self, job: str, ends: dict[int, int | None]) -> dict[str, Any]:
        keys = {k for c in [self, *self.shards] for k in c._ranks if k[0] == job}
        mine = {}
        for key in keys:
            judged: StepRanges | None = None
            for c in self.shards:
                part = c._ranks.get(key, RankCoverage()).judged
                judged = part if judged is None else judged.intersection(part)
            own = self._ranks.get(key, RankCoverage())
            mine[key[1]] = RankCoverage(judged if judged is not None else StepRanges(), own.dropped_steps)
        return _report(job, mine, ends)


def _report(job: str, mine: dict[int, RankCoverage], ends: dict[int, int | None]) -> dict[str, Any]:
    bounds = [rc.judged.bounds() for rc in mine.values() if rc.judged.bounds() is not None]
    ranks = sorted(set(ends) | set(mine))
    if not bounds:
        return {"job": job, "steps": None, "ranks": len(ranks), "watched_ranks": 0,
                "complete": False, "not_seen": [{"rank": r, "steps": "all"} for r in ranks]}
    lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
    not_seen, watched = [], 0
    for r in ranks:
        rc = mine.get(r, RankCoverage())
        end = ends.get(r)
        top = hi if end is None else min(hi, end)
        gaps = rc.judged.missing(lo, top) if top >= lo else []
        if len(rc.judged):
            watched += 1
        if gaps or rc.dropped_steps or not len(rc.judged):
            entry = {"rank": r, "steps": [list(g) for g in gaps] if len(rc.judged) else "all"}
            if rc.dropped_steps:
                entry["dropped_steps"] = rc.dropped_steps
            not_seen.append(entry)
    return {"job": job, "steps": [lo, hi], "ranks": len(ranks), "watched_ranks": watched,
            "complete": not not_seen, "not_seen": not_seen}


def describe(report: dict[str, Any]) -> str:
    """One line for people: what was watched, then what was not."""
    n = report["ranks"]
    if report["steps"] is None:
        return f"nothing watched: no step of any of {n} rank(s) reached the coordinator" + _stop_text(report, "; ")
    lo, hi = report["steps"]
    line = f"watched steps {lo}-{hi} on {report['watched_ranks']}/{n} ranks"
    parts = []
    for e in report["not_seen"]:
        if e["steps"] == "all":
            what = f"rank {e['rank']} not seen at all"
        elif e["steps"]:
            one = len(e["steps"]) == 1 and e["steps"][0][0] == e["steps"][0][1]
            what = f"rank {e['rank']} {'step' if one else 'steps'} {_ranges_text(e['steps'])} not seen"
        else:
            what = f"rank {e['rank']}"
        if e.get("dropped_steps"):
            what += f" ({e['dropped_steps']} step(s) dropped in the rank)"
        parts.append(what)
    return line + ("; " + "; ".join(parts) if parts else "") + _stop_text(report, "; ")


def _stop_text(report: dict[str, Any], sep: str) -> str:
    """Where the job was stopped from outside (:mod:`.stops`), if it was."""
    stop = report.get("stopped")
    if not stop:
        return ""
    ranks = stop["ranks"]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks ({_ranges_text(_runs(ranks))})"
    return f"{sep}{who} stopped together from outside by {stop['signal']} after step {stop['after_step']} " \
        "(no rank failed first)"


def _runs(ranks: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for r in sorted(ranks):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def _ranges_text(ranges: list[list[int]]) -> str:
    return ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
