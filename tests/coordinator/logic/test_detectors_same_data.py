"""Data-parallel ranks with bit-identical local gradients and loss read the same data:
a warning kept for status and coverage, never a verdict."""
from __future__ import annotations

import numpy as np
from logic_helpers import FakeClock, StepJudge, feed_step, view_of

from rankscope.config.cluster import parse_cluster
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.detectors.same_data import SameDataDetector, summary
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.wire.records import Kind


def _copy_local(batches, sim, frm: int, to: list[int]) -> None:
    """Make ranks ``to`` compute what rank ``frm`` computed: same local gradients and loss."""
    cols = [i for i, k in enumerate(sim.kinds) if k in (Kind.GRAD_LOCAL, Kind.LOSS)]
    for r in to:
        batches[r].stats[cols] = batches[frm].stats[cols]
        batches[r].crc32[cols] = batches[frm].crc32[cols]


def test_ranks_with_identical_local_gradients_are_said_once_with_the_step_and_who() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=21)
    det, state, judge = SameDataDetector(), {}, StepJudge()
    for step in range(3):
        batches = sim.batches(step)
        if step >= 1:
            _copy_local(batches, sim, 0, [1, 2, 3])
        assert det.judge(judge.view(batches), state) == []
    got = summary([state])
    assert got["first_step"] == 1 and got["sets"] == [[0, 1, 2, 3]] and got["steps"] == 2
    assert "ranks 0-3 read the same data at step 1" in got["line"]


def test_two_of_four_ranks_sharing_batches_are_named_as_a_pair() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=22)
    batches = sim.batches(0)
    _copy_local(batches, sim, 2, [3])
    state: dict = {}
    SameDataDetector().judge(view_of(batches), state)
    assert summary([state])["sets"] == [[2, 3]]


def test_different_data_zero_gradients_and_replicas_mode_say_nothing() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=23)
    state: dict = {}
    SameDataDetector().judge(view_of(sim.batches(0)), state)
    assert summary([state]) is None
    zero = SyntheticTraining(ranks=4, tensors=32, seed=23).batches(1)
    cols = [i for i, k in enumerate(sim.kinds) if k in (Kind.GRAD_LOCAL, Kind.LOSS)]
    for b in zero:
        b.stats[cols] = 0.0
        b.crc32[cols] = 0
    SameDataDetector().judge(view_of(zero), state)
    assert summary([state]) is None
    same = SyntheticTraining(ranks=4, tensors=32, seed=23).batches(2)
    _copy_local(same, sim, 0, [1, 2, 3])
    SameDataDetector().judge(view_of(same, parse_cluster({"groups": "replicas"})), state)
    assert summary([state]) is None


def test_the_status_and_coverage_carry_the_warning_and_no_incident_opens() -> None:
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    sim = SyntheticTraining(ranks=4, tensors=32, seed=24)
    found = []
    for step in range(4):
        batches = sim.batches(step)
        _copy_local(batches, sim, 0, [1, 2, 3])
        found += feed_step(core, clock, batches)
    assert found == [] and not core.documents()
    job = sim.job
    assert core.status()["jobs"][job]["same_data"]["first_step"] == 0
    assert core.coverage_report(job)["same_data"]["sets"] == [[0, 1, 2, 3]]
    assert np.isfinite(core.coverage_report(job)["same_data"]["steps"])


def test_the_loss_alone_must_tie_on_two_steps_in_a_row() -> None:
    # No local gradients recorded (no reducer the probe sees): a head that starts at zero
    # gives every rank the same first loss, which is no sign of the same data.
    sim = SyntheticTraining(ranks=4, tensors=32, seed=25)
    local = [i for i, k in enumerate(sim.kinds) if k == Kind.GRAD_LOCAL]
    loss = [i for i, k in enumerate(sim.kinds) if k == Kind.LOSS]
    det, state, judge = SameDataDetector(), {}, StepJudge()

    def step(n: int, tie: bool) -> None:
        batches = sim.batches(n)
        for b in batches:
            b.kinds = b.kinds.copy()
            b.kinds[local] = int(Kind.FORWARD)  # not local gradients: nothing but the loss compares
            if tie:
                b.stats[loss] = batches[0].stats[loss]
                b.crc32[loss] = batches[0].crc32[loss]
        det.judge(judge.view(batches), state)

    step(0, True)
    step(1, False)
    assert summary([state]) is None  # one tie, then different: the start, not the data
    step(2, True)
    step(3, True)
    got = summary([state])
    assert got["first_step"] == 2 and got["sets"] == [[0, 1, 2, 3]]
