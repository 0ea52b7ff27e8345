"""Whether the default watch keeps its per-Cell hooks: what they cost is measured in the
rank, not guessed.

On a small model the hooks on every Cell (a Python call per Cell and tensor, statistics
of every activation and its gradient) are most of a step's probe cost; on a large one
they are a sliver of it. So under launch the default tier runs the hooks for a few steps,
takes them off for a few, and compares the median steps: kept if their cost and the
vital signs together fit the budget, else left off. Left off, the vital signs still see
every step, and an anomalous step is re-run with the hooks on (rankscope.probe.rerun),
so a verdict there still names the Cell.

Pure logic over step times, testable without MindSpore.
"""
from __future__ import annotations

import statistics

#: Steps measured in each phase (after one step left out as each phase begins).
PHASE_STEPS = 6
MEASURING_ON, MEASURING_OFF, KEPT, DROPPED = "measuring", "measuring without", "on", "off"
SUSPEND, RESUME = "suspend", "resume"


class CellPlan:
    def __init__(self, fraction: float, steps: int = PHASE_STEPS) -> None:
        self.fraction = fraction
        self.steps = steps
        self.state = MEASURING_ON
        self._on: list[float] = []
        self._off: list[float] = []
        self._probe: list[float] = []
        self._skip = 1  # the first step compiles
        #: The hooks' measured share of a step without them, once decided.
        self.share: float | None = None

    def note_step(self, wall_s: float, probe_s: float) -> str | None:
        """One step's wall time and the vital signs' part of it; returns SUSPEND or
        RESUME when the hooks must be taken off or put back now."""
        if self.state in (KEPT, DROPPED):
            return None
        if self._skip:
            self._skip -= 1
            return None
        self._probe.append(probe_s)
        if self.state == MEASURING_ON:
            self._on.append(wall_s)
            if len(self._on) >= self.steps:
                self.state, self._skip = MEASURING_OFF, 1
                return SUSPEND
            return None
        self._off.append(wall_s)
        if len(self._off) < self.steps:
            return None
        on, off = statistics.median(self._on), statistics.median(self._off)
        cells = max(0.0, on - off)
        plain = max(off - statistics.median(self._probe), 1e-9)
        self.share = cells / plain
        if cells + statistics.median(self._probe) <= self.fraction * plain:
            self.state = KEPT
            return RESUME
        self.state = DROPPED
        return None
