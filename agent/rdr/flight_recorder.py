"""The last K steps of one rank, in memory: what a crash bundle shows first.

Used in the rank process (a probe Sink) and, one per rank, in the node agent so a rank
killed by SIGKILL still has its last steps written. A StepBatch carries only the names
first seen in that step (``new_names``), so the recorder keeps the union of every name
it has seen: a step whose new names arrived ten steps ago, in a batch long evicted from
the ring, must still be readable in the bundle.
"""
from __future__ import annotations

import collections
import threading
from typing import Union

from rankscope.wire.records import StepBatch, StepOutput

Step = Union[StepOutput, StepBatch]


class StepSnapshot(list):
    """A list of steps that also carries the name table they need (``names``) and the
    ring size (``k``), so ``write_bundle(steps=recorder.steps())`` loses no names."""

    names: dict[int, str]
    k: int | None


class FlightRecorder:
    """A bounded ring of StepOutputs (in-rank) or StepBatches (node agent).

    ``emit`` is O(1) and never raises into training. The lock is re-entrant because the
    RDR's SIGTERM handler runs on the main thread, possibly in the middle of an ``emit``
    on that same thread, and must still be able to take a snapshot.
    """

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"FlightRecorder k: expected a positive int, got {k!r}")
        self.k = k
        self._ring: collections.deque[Step] = collections.deque(maxlen=k)
        self._names: dict[int, str] = {}
        self._lock = threading.RLock()
        self.total = 0  # steps ever recorded; the ring keeps the last k

    def emit(self, out: Step) -> None:
        batch = out.batch if isinstance(out, StepOutput) else out
        if not isinstance(batch, StepBatch):
            return  # a Sink must not raise into training
        with self._lock:
            if batch.new_names:
                self._names.update(batch.new_names)
            self._ring.append(out)
            self.total += 1

    # StepBatch-only callers (the node agent) read better with this name.
    record = emit

    def close(self) -> None:
        """Nothing to release; the contents stay readable for a bundle written after close."""

    def steps(self) -> StepSnapshot:
        """Snapshot, oldest first (a list, with ``.names`` and ``.k``)."""
        with self._lock:
            snap = StepSnapshot(self._ring)
            snap.names, snap.k = dict(self._names), self.k
        return snap

    def batches(self) -> list[StepBatch]:
        return [s.batch if isinstance(s, StepOutput) else s for s in self.steps()]

    def names(self) -> dict[int, str]:
        """Every name id -> name seen so far (not only those in the ring)."""
        with self._lock:
            return dict(self._names)

    def last_step(self) -> int | None:
        with self._lock:
            if not self._ring:
                return None
            last = self._ring[-1]
        return (last.batch if isinstance(last, StepOutput) else last).step

    def __len__(self) -> int:
        return len(self._ring)
