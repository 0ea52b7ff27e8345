"""Rank lists as a person reads them: ``ranks 0-3``, ``ranks 0-2, 5, 9-12``."""
from __future__ import annotations

from typing import Iterable


def rank_span(ranks: Iterable[int]) -> str:
    """``ranks 0-3`` for 0,1,2,3; ``ranks 0-2, 5, 9-12``: runs of three or more shortened,
    so a large job's ranks stay one short phrase."""
    ranks = sorted(set(ranks))
    if not ranks:
        return ""
    parts, start = [], 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            run = ranks[start:i]
            parts += [f"{run[0]}-{run[-1]}"] if len(run) > 2 else [str(r) for r in run]
            start = i
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)
