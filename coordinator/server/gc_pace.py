"""Full garbage collections at a pace the ingest loop chooses, not every few steps.

An ingest loop holds a large heap that lives as long as the job: a record, name table and
column layout per rank (16k ranks: millions of objects). Each step also makes containers
that outlive two young collections (views kept for proofs, curve rows, findings), so
CPython's own rule ran a full collection, a walk over that whole heap, every second or
third step: ~150 ms each at 16k ranks, landing on whichever step was being taken in.

After a step is judged (just after the moment detection latency is measured), and at most
once per ``every_s``, :class:`GcPacer` collects everything and freezes what survives
(``gc.freeze``): the automatic collections that follow skip it. Unfreezing first keeps the
once-a-minute collection complete, so a cycle that died among frozen objects is still
found then, not kept for ever.
"""
from __future__ import annotations

import gc
import logging
import time
from typing import Callable

log = logging.getLogger(__name__)

#: Seconds between full collections of the frozen heap.
FULL_COLLECT_S = 60.0


class GcPacer:
    def __init__(self, every_s: float = FULL_COLLECT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._next: float | None = None
        self.collections = 0
        self.last_s = 0.0  # how long the last one took

    def judged(self) -> None:
        """A step was just judged: collect and freeze now if it is time."""
        now = self.clock()
        if self._next is not None and now < self._next:
            return
        t0 = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.last_s = time.perf_counter() - t0
        self.collections += 1
        self._next = now + self.every_s
        log.debug("full collection %d took %.3f s, %d objects frozen", self.collections, self.last_s,
                  gc.get_freeze_count())
