"""Sequence numbers and replay de-duplication: what lets a node agent replay its spool
without a coordinator counting anything twice. No I/O."""
from __future__ import annotations


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
    must not count twice. Keeps, per sender, its highest seq and which of the ``window``
    seqs below it were seen, as the bits of one int (bit i: seq ``high - i``), so a sender
    costs window/8 bytes however long the job runs; a seq older than the window is taken
    for a replay."""

    def __init__(self, window: int = 4096) -> None:
        self.window = window
        self._full = (1 << window) - 1
        self._high: dict[str, int] = {}
        self._seen: dict[str, int] = {}
        self.duplicates = 0

    def fresh(self, src: str, seq: int) -> bool:
        high = self._high.get(src)
        if high is None:
            self._high[src], self._seen[src] = seq, 1
            return True
        if seq > high:
            self._high[src] = seq
            # A jump past the window forgets it all (and never builds a huge int).
            ahead = seq - high
            self._seen[src] = ((self._seen[src] << ahead) | 1) & self._full if ahead < self.window else 1
            return True
        back = high - seq
        seen = self._seen[src]
        if back >= self.window or seen >> back & 1:
            self.duplicates += 1
            return False
        self._seen[src] = seen | 1 << back
        return True

    def state(self) -> dict[str, int]:
        return dict(self._high)
