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
        # A sender whose seqs came in order is "dense": every seq from its floor to its high
        # was seen and nothing below. It needs no bits, and its next seq costs a dict write,
        # not three operations on a window-wide int (16k ranks' frames per step).
        self._floor: dict[str, int] = {}
        self._seen: dict[str, int] = {}
        self.duplicates = 0

    def fresh(self, src: str, seq: int) -> bool:
        high = self._high.get(src)
        if high is None:
            self._high[src] = self._floor[src] = seq
            return True
        floor = self._floor.get(src)
        if floor is not None:
            if seq == high + 1 or seq - high >= self.window:
                self._high[src] = seq
                if seq != high + 1:
                    self._floor[src] = seq
                return True
            if high >= seq and (seq >= floor or high - seq >= self.window):
                self.duplicates += 1
                return False
            # Out of order: from here on this sender's seen seqs are kept as bits.
            del self._floor[src]
            self._seen[src] = (1 << min(high - floor + 1, self.window)) - 1
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
