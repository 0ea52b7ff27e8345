"""Where this rank stands relative to its collectives (see :mod:`rankscope.wire.sync`).

The training thread calls :meth:`enter` / :meth:`leave` around each collective it makes
(the gradient reducer's call; a compiled step in GRAPH mode) and :meth:`new_step` at step
ends; the client's I/O thread reads :attr:`latest` for its heartbeats, and each event
is stored in the rank's position file too. An attribute assignment and two memory stores
per event: no lock, nothing that could make training wait.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from rankscope.wire.sync import IN, OUT, SyncPoint


class SyncTracker:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.latest: SyncPoint | None = None
        self.changes = 0  # bumped on every event: the I/O thread sends promptly on a change
        # The rank's position file (a PositionWriter), which its node agent reads after a
        # death: the point there is current where the last heartbeat may not be.
        self.file: Any = None
        self._step = 0
        self._seq = 0

    def new_step(self, step: int) -> None:
        self._step, self._seq = step, 0

    def enter(self, what: str) -> None:
        self._reached(SyncPoint(what, self._step, self._seq, IN, self.clock()))

    def leave(self, what: str) -> None:
        self._reached(SyncPoint(what, self._step, self._seq, OUT, self.clock()))
        self._seq += 1

    def _reached(self, point: SyncPoint) -> None:
        self.latest = point
        self.changes += 1
        if self.file is not None:
            self.file.write_sync(point)
