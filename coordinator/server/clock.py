"""Each node agent's clock offset to the coordinator's, measured over the wire.

The coordinator stamps a probe with its wall clock (t1); the agent answers with its own
(t2); the answer arrives at t3. Assuming the two legs take equally long, the agent's
clock reads ``t2`` when the coordinator's reads ``(t1 + t3) / 2``. Of the recent samples,
the one with the shortest round trip bounds the error best (by half its round trip), so
that one is used: a death stamped by an agent is moved onto the coordinator's clock
before it is compared with a death stamped by another.
"""
from __future__ import annotations

import collections


class ClockOffset:
    def __init__(self, keep: int = 8) -> None:
        self._samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=keep)  # (rtt, offset)

    def add(self, t1: float, t2: float, t3: float) -> None:
        rtt = t3 - t1
        if rtt < 0:
            return  # the coordinator's own clock stepped back between send and answer
        self._samples.append((rtt, (t1 + t3) / 2.0 - t2))

    @property
    def offset(self) -> float:
        """Seconds to add to the agent's clock to read the coordinator's (0 before any sample)."""
        return min(self._samples)[1] if self._samples else 0.0

    @property
    def error(self) -> float | None:
        """Half the best round trip: the most the offset can be off by."""
        return min(self._samples)[0] / 2.0 if self._samples else None
