"""The verdict merge: every shard's findings of a step -> the verdicts one core would give.

Per judged step and detector each shard names at most one rank (its earliest flagged
record by execution order). The global first is the least of them by the same order, so
the merge holds a step's findings until every shard has judged that step, then keeps per
detector the shard verdicts with the least key; equal keys from several shards are ties
(named: the lowest rank, the others listed). NaN origin looks first at records measured
before any reduction: a shard that found one there outranks a shard that found only a
replicated record, whatever their execution order, as it would in one core.

A lost, hung or lagging rank is judged by every shard alike: the first copy passes on at
once (it is urgent), the others are dropped.
"""
from __future__ import annotations

import collections
import dataclasses

from rankscope.coordinator.logic.detectors.nan_origin import before_reduction
from rankscope.coordinator.logic.shards.shard import ShardFindings
from rankscope.coordinator.logic.verdict import Verdict

_SEEN = 4096  # copies of other findings remembered; shards send theirs within a few ticks


def _key(v: Verdict) -> tuple:
    pre = 0 if v.detector != "nan_origin" or before_reduction(v) else 1
    return (pre, -1 if v.exec_index is None else v.exec_index)


def _identity(v: Verdict) -> tuple:
    return (v.detector, v.group, v.step, v.rank, tuple(v.ties), v.tensor)


class VerdictMerge:
    def __init__(self, count: int) -> None:
        self.count = count
        self.judged: list[dict[str, int]] = [{} for _ in range(count)]
        self.held: dict[tuple[str, int], list[Verdict]] = {}
        self.other: list[Verdict] = []
        #: job -> {rank: newest step}, from shard 0, until the filing core takes it.
        self.progress: dict[str, dict[int, int]] = {}
        self._seen: collections.OrderedDict[tuple, None] = collections.OrderedDict()

    def add(self, f: ShardFindings) -> None:
        if not 0 <= f.shard < self.count:
            raise ValueError(f"shard: {f.shard} is not one of this merge's {self.count} shards")
        mine = self.judged[f.shard]
        for group, step in f.judged.items():  # never back: findings given up on arrive late (.in_order)
            if step > mine.get(group, -1):
                mine[group] = step
        for job, steps in f.progress.items():
            self.progress.setdefault(job, {}).update(steps)
        for step, v in f.steps:
            self.held.setdefault((v.group, step), []).append(v)
        for v in f.other:
            ident = _identity(v)
            if ident in self._seen:
                continue
            self._seen[ident] = None
            if len(self._seen) > _SEEN:
                self._seen.popitem(last=False)
            self.other.append(v)

    def judged_through(self, group: str) -> int:
        """The newest step of ``group`` every shard has judged."""
        return min(j.get(group, -1) for j in self.judged)

    def release(self, force: bool = False) -> list[Verdict]:
        """Verdicts now final, in the order one core gives them."""
        out, self.other = self.other, []
        for gs in sorted(self.held, key=lambda k: k[1]):
            if not force and gs[1] > self.judged_through(gs[0]):
                continue
            out += merge_step(self.held.pop(gs))
        return sorted(out, key=Verdict.sort_key)

    def take_progress(self) -> dict[str, dict[int, int]]:
        out, self.progress = self.progress, {}
        return out

    def pending(self) -> int:
        return sum(len(v) for v in self.held.values())


def merge_step(found: list[Verdict]) -> list[Verdict]:
    """One step of one group: the verdict each detector gives over all shards' columns."""
    by_det: dict[str, list[Verdict]] = {}
    for v in found:
        by_det.setdefault(v.detector, []).append(v)
    out = []
    for vs in by_det.values():
        best = min(_key(v) for v in vs)
        first = [v for v in vs if _key(v) == best]
        named = min(first, key=lambda v: v.rank)
        if all((v.rank, v.ties) == (named.rank, named.ties) for v in first):
            out.append(named)  # one shard's, or the same finding from each (a missing rank)
            continue
        ranks = set()
        for v in first:
            ranks |= {v.rank, *v.ties}
        out.append(dataclasses.replace(named, ties=sorted(ranks - {named.rank})))
    return out
