"""The verdict actor's inbox of shard findings: taken on its loop thread, in each shard's order.

Shards push their findings as calls of the (threaded) verdict actor, which may run out of
order: a push saying "judged through step 11" could be merged before the one saying "step
10, and this rank there". Merged that way, step 10 would be released without that shard's
verdict, and the merge's judged step would then go back to 10 and stay there. Each push is
numbered by its shard (:mod:`rankscope.coordinator.logic.align.in_order`); this inbox hands them on
in that order.
"""
from __future__ import annotations

import logging
import queue
import time
from typing import Callable

from rankscope.coordinator.logic.align.in_order import Senders

log = logging.getLogger(__name__)


class FindingsInbox:
    def __init__(self, clock: Callable[[], float] = time.monotonic, gap_s: float = 3.0) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._senders = Senders(gap_s)
        self._clock = clock

    def put(self, findings: dict) -> None:
        """Any thread."""
        self._q.put(findings)

    def take(self) -> list[dict]:
        """The findings now in order (loop thread); a gap older than ``gap_s`` is given up on."""
        now, out = self._clock(), []
        while True:
            try:
                d = self._q.get_nowait()
            except queue.Empty:
                break
            out += self._senders.put(int(d["shard"]), d.get("epoch"), int(d.get("seq", 0)), d, now)
        return out + self._overdue(now)

    def settle(self, timeout_s: float, force: bool = True) -> list[dict]:
        """Everything in: wait up to ``timeout_s`` for what earlier findings are still on
        their way, then hand on what is held behind a gap anyway."""
        out = self.take()
        deadline = self._clock() + timeout_s
        while self._senders.waiting() and self._clock() < deadline:
            time.sleep(0.01)
            out += self.take()
        return out + self._overdue(self._clock(), force)

    def _overdue(self, now: float, force: bool = False) -> list[dict]:
        late = self._senders.overdue(now, force)
        if late:
            log.warning("shard findings: %d push(es) held behind one that never came; taken without it "
                        "(skipped so far, per shard: %s)", len(late), self._senders.skipped)
        return late
