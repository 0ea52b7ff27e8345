"""Sequence numbers and replay de-duplication: what lets a node agent replay its spool
without a coordinator counting anything twice. No I/O."""
from __future__ import annotations

import collections


class SeqCounter:
    """Per-sender sequence numbers. Not thread-safe: each sending thread owns its counter
    (a sender's frames leave from one I/O thread, which also keeps them in order)."""

    def __init__(self, start: int = 0) -> None:
        self._next = start

    def __call__(self) -> int:
        n = self._next
        self._next += 1
        return n


class ReplayFilter:
    """Drops (src, seq) pairs already seen: spool replays after a coordinator restart
    must not count twice. Keeps a high-water mark per sender plus a small window of
    out-of-order seqs, so memory stays bounded."""

    def __init__(self, window: int = 4096) -> None:
        self.window = window
        self._high: dict[str, int] = {}
        self._recent: dict[str, set[int]] = collections.defaultdict(set)
        self.duplicates = 0

    def fresh(self, src: str, seq: int) -> bool:
        high = self._high.get(src, -1)
        recent = self._recent[src]
        if seq <= high - self.window or seq in recent:
            self.duplicates += 1
            return False
        recent.add(seq)
        if seq > high:
            self._high[src] = seq
            if len(recent) > 2 * self.window:
                floor = seq - self.window
                self._recent[src] = {s for s in recent if s > floor}
        return True

    def state(self) -> dict[str, int]:
        return dict(self._high)
