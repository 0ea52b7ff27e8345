"""Peer outlier: a rank's local loss / grad norm / activation norm against its group and history."""
from __future__ import annotations

import numpy as np
import pytest
from logic_helpers import FakeClock, StepJudge, feed_step, view_of

from rankscope.config.cluster import parse_cluster
from rankscope.config.detectors import OutlierSettings
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.detectors.outlier import OutlierDetector
from rankscope.coordinator.logic.synthetic import SyntheticTraining


def _run(core: CoordinatorCore, sim: SyntheticTraining, steps: int, inject=None):
    clock = core.clock
    found = []
    for step in range(steps):
        batches = sim.batches(step)
        if inject is not None:
            inject(step, batches)
        found += feed_step(core, clock, batches)
    return found


def _warm(det: OutlierDetector, sim: SyntheticTraining, steps: int = 10) -> dict:
    """Judge clean steps first: the detector learns each kind's usual spread."""
    state: dict = {"judge": StepJudge()}
    for step in range(steps):
        assert det.judge(state["judge"].view(sim.batches(step)), state) == []
    return state


def test_rank_with_local_loss_times_ten_is_named() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=1)
    det = OutlierDetector(OutlierSettings())
    state = _warm(det, sim)
    batches = sim.batches(10)
    li = sim.column("Sentinel.loss")
    batches[3].stats[li, :3] *= 10
    batches[3].stats[li, 3] *= 10
    [v] = det.judge(state["judge"].view(batches), state)
    assert (v.rank, v.tensor, v.kind, v.ties) == (3, "Sentinel.loss", "loss", [])
    assert v.evidence["rule"].startswith("peer")
    assert 8 < v.evidence["ratio_to_median"] < 13
    assert v.evidence["group_values"]["summary"]["n"] == 8


def test_grad_norm_outlier_and_two_ranks_tied() -> None:
    sim = SyntheticTraining(ranks=16, tensors=32, seed=2)
    det = OutlierDetector(OutlierSettings())
    state = _warm(det, sim)
    batches = sim.batches(10)
    g = sim.column("Sentinel.grad_local.layer3.")
    for r in (9, 4):
        batches[r].stats[g, 3] *= 10
    [v] = det.judge(state["judge"].view(batches), state)
    assert (v.rank, v.ties, v.kind) == (4, [9], "grad_local")


def test_vanishing_value_is_an_outlier_too() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=3)
    det = OutlierDetector(OutlierSettings())
    state = _warm(det, sim)
    batches = sim.batches(10)
    a = sim.column("Cell.layer1.")
    batches[0].stats[a, 3] /= 10
    [v] = det.judge(state["judge"].view(batches), state)
    assert (v.rank, v.kind) == (0, "forward")
    assert v.evidence["ratio_to_median"] < 0.15


def test_thresholds_are_configurable() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=4)
    default, sharp = OutlierDetector(OutlierSettings()), OutlierDetector(OutlierSettings(ratio=2.0, z=4.0))
    s_default, s_sharp = _warm(default, sim), _warm(sharp, SyntheticTraining(ranks=8, tensors=32, seed=4))
    batches = sim.batches(10)
    li = sim.column("Sentinel.loss")
    batches[5].stats[li] *= 2.5
    assert default.judge(s_default["judge"].view(batches), s_default) == []  # under the 4x floor
    for b in batches:
        b.new_names = {}
    [v] = sharp.judge(s_sharp["judge"].view(batches), s_sharp)
    assert v.rank == 5


def test_before_any_history_only_gross_outliers_count() -> None:
    """With no history the floor is ratio squared (16x): nothing is known of the tails yet."""
    sim = SyntheticTraining(ranks=8, tensors=32, seed=9)
    li = sim.column("Sentinel.loss")
    batches = sim.batches(0)
    batches[6].stats[li] *= 10
    assert OutlierDetector(OutlierSettings()).judge(view_of(batches), {}) == []
    batches[6].stats[li] *= 3
    [v] = OutlierDetector(OutlierSettings()).judge(view_of(batches), {})
    assert v.rank == 6 and v.evidence["thresholds"]["effective_ratio"] == pytest.approx(16.0)


def test_floor_rises_in_a_kind_whose_values_swing_routinely() -> None:
    """Loss swinging ~6x between micro-batches every step: a 10x rank is not a finding."""
    sim = SyntheticTraining(ranks=8, tensors=32, seed=10)
    det = OutlierDetector(OutlierSettings())
    li = sim.column("Sentinel.loss")
    state: dict = {"judge": StepJudge()}
    for step in range(40):
        batches = sim.batches(step)
        batches[step % 8].stats[li] *= 6 if step % 2 else 1 / 6
        if step == 39:
            batches[3].stats[li] *= 10
        found = det.judge(state["judge"].view(batches), state)
        assert found == [] or found[0].tensor != "Sentinel.loss"


def test_history_catches_a_rank_that_jumps_within_the_group_spread() -> None:
    """Rank 2 always sits at 1/3 of its peers (its shard is easier); a jump to the peers'
    level is not a group outlier, but against its own history it is."""
    sim = SyntheticTraining(ranks=8, tensors=32, seed=5, loss_noise=0.02, common_noise=0.05)
    sim.rank_offset[:] = 0
    li = sim.column("Sentinel.loss")

    def inject(step, batches):
        factor = 1.0 / 3.0 if step < 60 else 1.0 * 1.3
        batches[2].stats[li] *= factor

    core = CoordinatorCore({"detectors": {"outlier": {"history_ratio": 2.0}}}, clock=FakeClock())
    found = _run(core, sim, 70, inject)
    assert [(v.detector, v.rank, v.step) for v in found] == [("outlier", 2, 60)]
    assert "history" in found[0].evidence["rule"]
    assert 0.2 < found[0].evidence["rank_history_level"] / found[0].evidence["group_values"]["summary"]["median"] < 0.5


def test_a_shift_every_rank_makes_at_once_is_not_a_finding() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=6)
    cols = [sim.column("Sentinel.loss"), sim.column("Sentinel.grad_local.layer0.")]

    def inject(step, batches):
        if step >= 50:  # a hard data region for everyone: loss and grads x5 on all ranks
            for b in batches:
                b.stats[cols] *= 5

    core = CoordinatorCore({}, clock=FakeClock())
    assert _run(core, sim, 80, inject) == []


def test_single_rank_uses_its_own_history() -> None:
    sim = SyntheticTraining(ranks=1, tensors=32, seed=7)
    li = sim.column("Sentinel.loss")

    def inject(step, batches):
        if step == 80:
            batches[0].stats[li] *= 10

    core = CoordinatorCore({}, clock=FakeClock())
    found = _run(core, sim, 90, inject)
    assert [(v.detector, v.rank, v.step, v.tensor) for v in found] == [("outlier", 0, 80, "Sentinel.loss")]
    assert found[0].evidence["rule"] == "history"


def test_zeros_and_nans_are_left_to_other_detectors() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=8)
    batches = sim.batches(0)
    g = sim.column("Sentinel.grad_local.layer2.")
    batches[1].stats[g] = 0.0  # unused parameter on this micro-batch: no log, no finding
    batches[2].stats[g] = float("nan")
    assert OutlierDetector(OutlierSettings()).judge(view_of(batches), {}) == []


def test_outlier_can_be_switched_off() -> None:
    s = parse_cluster({"detectors": {"outlier": False}})
    core = CoordinatorCore(s, clock=FakeClock())
    assert all(d.name != "outlier" for d in core.detectors)


def test_a_routinely_wild_column_does_not_blunt_the_quiet_ones() -> None:
    """An MoE-like expert gradient: some rank routes few tokens to it every step (norm
    x0.05). That column learns its spread; a x10 in an ordinary layer is still found."""
    sim = SyntheticTraining(ranks=8, tensors=32, seed=12)
    det = OutlierDetector(OutlierSettings())
    expert, dense = sim.column("Sentinel.grad_local.layer4."), sim.column("Sentinel.grad_local.layer1.")
    rng = np.random.default_rng(0)
    state: dict = {"judge": StepJudge()}
    for step in range(60):
        batches = sim.batches(step)
        if step >= 2:  # from the start of the run (after the first steps)
            batches[int(rng.integers(8))].stats[expert, 3] *= 0.05
        if step == 59:
            batches[6].stats[dense, 3] *= 10
        found = det.judge(state["judge"].view(batches), state)
        if step < 59:
            assert found == [], (step, found and found[0].summary())
    assert [(v.rank, v.tensor) for v in found] == [(6, sim.names[dense])]


def test_noisy_columns_do_not_lend_their_spread_to_the_quiet_ones() -> None:
    """A small text model on 4 ranks: its biases and head differ ~3x between ranks every
    step, its conv weight and embedding agree within ~1.2x. A rank whose whole gradient
    is x45 at step 5 is found in the quiet columns (the kind-wide spread would put their
    floor near x100)."""
    sim = SyntheticTraining(ranks=4, tensors=24, seed=21)
    det = OutlierDetector(OutlierSettings())
    grads = [sim.column(f"Sentinel.grad_local.layer{i}.") for i in range(5)]
    noisy, quiet = grads[:3], grads[3:]
    rng = np.random.default_rng(5)
    state: dict = {"judge": StepJudge()}
    for step in range(6):
        batches = sim.batches(step)
        for b in batches:
            for c in noisy:
                b.stats[c, 3] *= float(np.exp(rng.normal(0, 0.6)))
            for c in quiet:
                b.stats[c, 3] *= float(np.exp(rng.normal(0, 0.05)))
        if step == 5:
            for c in grads:
                batches[3].stats[c, 3] *= 45
        found = det.judge(state["judge"].view(batches), state)
        if step < 5:
            assert found == [], (step, found and found[0].summary())
    assert [(v.rank, v.step, v.kind) for v in found] == [(3, 5, "grad_local")]
    assert found[0].tensor in {sim.names[c] for c in quiet}
