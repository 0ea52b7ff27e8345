"""The wall time the probe spends on the training thread, step by step.

The default watch plans and reports its cost as a share of the step
(rankscope.probe.vitals.budget). What it reads and fingerprints is only part of that: the
wrappers around ``value_and_grad`` and the optimizer, the re-run gate, building and
handing over the step's records all take the training thread too. Each of those entry
points runs inside the one clock here; nested entries (the step's end is told from
inside the optimizer's hook) count once, and waiting for MindSpore to finish the step's
queued work (which the step's own end would wait for) is not counted.
"""
from __future__ import annotations

import time


class ProbeClock:
    __slots__ = ("_total", "_depth", "_t0")

    def __init__(self) -> None:
        self._total = 0.0
        self._depth = 0
        self._t0 = 0.0

    def __enter__(self) -> "ProbeClock":
        if not self._depth:
            self._t0 = time.perf_counter()
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if not self._depth:
            self._total += time.perf_counter() - self._t0

    def discount(self, seconds: float) -> None:
        """Take back time the running entry spent waiting for the device to finish the
        step's own work: the step would wait for it anyway, only later."""
        if self._depth:
            self._total -= seconds

    def lap(self) -> float:
        """Seconds counted since the last lap, the running entry's so far included."""
        now = time.perf_counter()
        total = self._total + (now - self._t0 if self._depth else 0.0)
        self._total = 0.0
        if self._depth:
            self._t0 = now
        return total


#: The process's clock: one probe per process, and its hooks run on the training thread.
CLOCK = ProbeClock()
