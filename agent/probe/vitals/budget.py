"""The watch's cost budget: how much of a step the probe may spend, and how the work that
does not fit is spread over steps.

Pure logic over times the probe measures in the rank, so it is testable without
MindSpore. Two kinds of work:

- *vital* work runs every step (the loss, one pass over each gradient for its norm and
  non-finite flag): its cost is measured, never skipped;
- *rotating* work (the bit-exact fingerprints of weights, optimizer state and reduced
  gradients, :mod:`rankscope.probe.vitals.fingerprint`) is a list of pieces, piece ``i`` due at
  step ``s`` when ``i % K == s % K``. ``K`` is the smallest power of two that keeps the
  rotating share within what the budget leaves after the vital work.

Why powers of two and ``i % K``: replicas plan on their own measurements and may choose
different ``K``; with ``K`` and ``2K`` a piece due on the ``2K`` rank at step ``s`` is
due on the ``K`` rank too, so replicas compare every piece at least every ``max K``
steps. ``K`` is the bound on how many steps a silent change of a weight can go unseen.
"""
from __future__ import annotations

import statistics
from collections import deque

from rankscope.text.watch_line import DEFAULT_BUDGET

#: Steps measured before the first plan (the first ones compile kernels).
WARMUP = 3
#: Steps between plans; K only doubles or halves at a plan.
REPLAN_EVERY = 8
#: A model whose weights and optimizer state together are this small is fingerprinted
#: whole every step, whatever its step time (a bit flip is named at its step): a few ms of
#: reading at most, and on a step that short most of the cost is per tensor, not per byte,
#: so timing it would make K a matter of noise.
FLOOR_BYTES = 32 << 20
#: The share of the budget the plan fills: what the probe times itself misses the overlap
#: of Python and kernels its reads cost MindSpore, and steps vary; the rest is that margin.
PLAN_SHARE = 0.8


def due(index: int, step: int, every: int) -> bool:
    """Whether rotating piece ``index`` is due at ``step`` under period ``every``."""
    return every <= 1 or index % every == step % every


def pow2_at_least(x: float) -> int:
    k = 1
    while k < x:
        k *= 2
    return k


class WatchBudget:
    """Measures steps and the probe's share of them; plans K (:attr:`every`)."""

    def __init__(self, fraction: float = DEFAULT_BUDGET, window: int = 32) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"budget fraction = {fraction!r}: expected a share of a step in (0, 1]")
        self.fraction = fraction
        self.every = 1
        self._steps: deque[float] = deque(maxlen=window)  # step time without the probe
        self._vital: deque[float] = deque(maxlen=window)
        self._probe: deque[float] = deque(maxlen=window)  # the probe's whole time a step
        self._per_piece: deque[float] = deque(maxlen=window)  # rotating seconds per piece
        self.pieces = 0  # rotating pieces in a full cycle
        self.cycle_bytes = 0  # their bytes
        self.noted = 0
        self.last_probe_s = 0.0
        self.last_wall_s = 0.0
        self.last_bytes_read = 0
        self.last_bytes_copied = 0

    def note_step(self, wall_s: float, vital_s: float, rotating_s: float, pieces_done: int, pieces: int,
                  bytes_read: int = 0, bytes_copied: int = 0, cycle_bytes: int = 0) -> None:
        """One step's wall time and the probe's measured part of it (vital and rotating)."""
        self.noted += 1
        self.pieces, self.cycle_bytes = pieces, cycle_bytes
        self.last_probe_s = vital_s + rotating_s
        self.last_wall_s = wall_s
        self.last_bytes_read, self.last_bytes_copied = bytes_read, bytes_copied
        if self.noted <= 1:  # the first step compiles: its times say nothing
            return
        self._steps.append(max(wall_s - vital_s - rotating_s, 1e-6))
        self._vital.append(vital_s)
        self._probe.append(vital_s + rotating_s)
        if pieces_done:
            self._per_piece.append(rotating_s / pieces_done)
        if self.noted >= WARMUP and (self.noted - WARMUP) % REPLAN_EVERY == 0:
            self.every = self.plan()

    def step_s(self) -> float | None:
        """The median step without the probe's share, once measured."""
        return statistics.median(self._steps) if self._steps else None

    def plan(self) -> int:
        """K for the next steps from what was measured (the current K when nothing was)."""
        if self.cycle_bytes <= FLOOR_BYTES:
            return 1
        if not self._steps or not self._per_piece or self.pieces <= 0:
            return self.every
        allowance = PLAN_SHARE * self.fraction * statistics.median(self._steps) - statistics.median(self._vital)
        cycle = statistics.median(self._per_piece) * self.pieces
        most = pow2_at_least(self.pieces)
        if allowance <= 0:
            return most
        want = min(most, pow2_at_least(cycle / allowance))
        if want < self.every and cycle / want > 0.7 * allowance:
            return self.every  # hysteresis: halve only with room to spare
        return want

    def share(self) -> float | None:
        """The probe's measured share of a step: its median time a step over the median step
        without it (a step re-run as an anomaly's deep capture is one of many, not the figure)."""
        s = self.step_s()
        return None if s is None or not self._probe else statistics.median(self._probe) / s
