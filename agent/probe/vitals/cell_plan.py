"""Whether the default watch keeps its per-Cell hooks: what they cost is measured in the
rank, not guessed.

On a small model the hooks on every Cell (a Python call per Cell and tensor, statistics
of every activation and its gradient) are most of a step's probe cost; on a large one
they are a sliver of it. So under launch the default tier runs the hooks on and off in
alternating blocks of steps and compares neighbouring blocks: kept if their cost and the
vital signs together fit the budget, else left off. Left off, the vital signs still see
every step, and an anomalous step is re-run with the hooks on (rankscope.probe.rerun.rerun),
so a verdict there still names the Cell.

Pure logic over step times, testable without MindSpore.
"""
from __future__ import annotations

import statistics

#: Steps in a block with the hooks on or off; the first step after a switch is left out.
BLOCK_STEPS = 3
#: Blocks of each kind, alternating on/off, before the decision.
PAIRS = 4
MEASURING_ON, MEASURING_OFF, KEPT, DROPPED = "measuring", "measuring without", "on", "off"
SUSPEND, RESUME = "suspend", "resume"


class CellPlan:
    """Alternates short blocks of steps with the hooks on and off, and decides from the
    median of the paired differences. Pairs of neighbouring blocks see the same machine
    load, so a drift in step time (another job starting, a warm-up) does not read as the
    hooks' cost, as it did when one long phase on was compared with one long phase off."""

    def __init__(self, fraction: float, block: int = BLOCK_STEPS, pairs: int = PAIRS) -> None:
        self.fraction = fraction
        self.block, self.pairs = block, pairs
        self.state = MEASURING_ON
        self._cur: list[float] = []
        self._on: list[float] = []  # each on block's mean step
        self._off: list[float] = []
        self._probe: list[float] = []
        self._skip = 1  # the first step compiles; after that, the first step after each switch
        #: The hooks' measured share of a step without them, once decided.
        self.share: float | None = None

    @property
    def steps_to_decide(self) -> int:
        """Steps from the first until the plan is settled."""
        return 2 * self.pairs * self.block

    def note_step(self, wall_s: float, probe_s: float) -> str | None:
        """One step's wall time and the vital signs' part of it; returns SUSPEND or
        RESUME when the hooks must be taken off or put back now."""
        if self.state in (KEPT, DROPPED):
            return None
        if self._skip:
            self._skip -= 1
            return None
        self._probe.append(probe_s)
        self._cur.append(wall_s)
        if len(self._cur) < self.block - 1:
            return None
        mean = sum(self._cur) / len(self._cur)
        self._cur = []
        self._skip = 1
        if self.state == MEASURING_ON:
            self._on.append(mean)
            self.state = MEASURING_OFF
            return SUSPEND
        self._off.append(mean)
        if len(self._off) < self.pairs:
            self.state = MEASURING_ON
            return RESUME
        return self._decide()

    def keep(self) -> bool:
        """Settle on the hooks without measuring them (where nothing could put them back for
        an anomalous step); True when this changed the plan."""
        if self.state == KEPT:
            return False
        self.state = KEPT
        return True

    def _decide(self) -> str | None:
        cells = max(0.0, statistics.median(on - off for on, off in zip(self._on, self._off)))
        probe = statistics.median(self._probe)
        plain = max(statistics.median(self._off) - probe, 1e-9)
        self.share = cells / plain
        if cells + probe <= self.fraction * plain:
            self.state = KEPT
            return RESUME
        self.state = DROPPED
        return None
