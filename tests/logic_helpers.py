"""Shared helpers for the coordinator-logic unit tests (no Ray, no sockets)."""
from __future__ import annotations

from rankscope.config.cluster import ClusterSettings
from rankscope.coordinator.logic.align.aligner import StepAligner, StepView
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import StepBatch


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def view_of(batches: list[StepBatch], settings: ClusterSettings | None = None) -> StepView:
    """Align one step's batches and return the judged view."""
    aligner = StepAligner(settings or ClusterSettings())
    for b in batches:
        aligner.ingest(b, 0.0)
    [(_, view)] = aligner.ready(0.0, force=True)
    return view


class StepJudge:
    """One aligner kept across steps (names are sent once per rank, as on the wire)."""

    def __init__(self, settings: ClusterSettings | None = None) -> None:
        self.aligner = StepAligner(settings or ClusterSettings())

    def view(self, batches: list[StepBatch]) -> StepView:
        for b in batches:
            self.aligner.ingest(b, 0.0)
        [(grp, view)] = self.aligner.ready(0.0, force=True)
        grp.prev = view
        return view


def feed_step(core: CoordinatorCore, clock: FakeClock, batches: list[StepBatch], dt: float = 0.1) -> list[Verdict]:
    for b in batches:
        core.on_step(b)
    clock.advance(dt)
    return core.tick()


def with_moment(sim, prefix: str = "Sentinel.param.layer1.") -> int:
    """Turn one weight column of a SyntheticTraining into an Adam moment (optimizer state),
    before its first batches; returns the column."""
    from rankscope.wire.records import Kind
    m = sim.column(prefix)
    sim.names[m] = "Sentinel.opt_state.moment1." + sim.names[m].split(".", 2)[2]
    sim.kinds[m] = Kind.OPT_STATE
    return m


def run_synthetic(steps: int, fault=None, ranks: int = 4):
    """(core, SyntheticTraining, verdicts) after ``steps`` synthetic steps of a ``ranks``-rank
    job judged by a real core; ``fault(step, batches, sim)`` edits a step's batches."""
    from rankscope.coordinator.logic.synthetic import SyntheticTraining
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "continue"}, clock=clock)
    sim = SyntheticTraining(ranks=ranks, tensors=16, seed=4)
    found = []
    for step in range(steps):
        batches = sim.batches(step)
        if fault:
            fault(step, batches, sim)
        found += feed_step(core, clock, batches)
    return core, sim, found
