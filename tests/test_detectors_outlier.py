"""Peer outlier: a rank's local loss / grad norm / activation norm against its group and history."""
from __future__ import annotations

from coordinator.logic.core import CoordinatorCore
from coordinator.logic.detectors.outlier import OutlierDetector
from coordinator.logic.settings import OutlierSettings, parse_settings
from coordinator.logic.synthetic import SyntheticTraining

from logic_helpers import FakeClock, feed_step, view_of


def _run(core: CoordinatorCore, sim: SyntheticTraining, steps: int, inject=None):
    clock = core.clock
    found = []
    for step in range(steps):
        batches = sim.batches(step)
        if inject is not None:
            inject(step, batches)
        found += feed_step(core, clock, batches)
    return found


def test_rank_with_local_loss_times_ten_is_named() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=1)
    batches = sim.batches(0)
    li = sim.column("Sentinel.loss")
    batches[3].stats[li, :3] *= 10
    batches[3].stats[li, 3] *= 10
    [v] = OutlierDetector(OutlierSettings()).judge(view_of(batches), {})
    assert (v.rank, v.tensor, v.kind, v.ties) == (3, "Sentinel.loss", "loss", [])
    assert v.evidence["rule"].startswith("peer")
    assert 8 < v.evidence["ratio_to_median"] < 13
    assert v.evidence["group_values"]["summary"]["n"] == 8


def test_grad_norm_outlier_and_two_ranks_tied() -> None:
    sim = SyntheticTraining(ranks=16, tensors=32, seed=2)
    batches = sim.batches(0)
    g = sim.column("Sentinel.grad_local.layer3.")
    for r in (9, 4):
        batches[r].stats[g, 3] *= 20
    [v] = OutlierDetector(OutlierSettings()).judge(view_of(batches), {})
    assert (v.rank, v.ties, v.kind) == (4, [9], "grad_local")


def test_vanishing_value_is_an_outlier_too() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=3)
    batches = sim.batches(0)
    a = sim.column("Cell.layer1.")
    batches[0].stats[a, 3] /= 50
    [v] = OutlierDetector(OutlierSettings()).judge(view_of(batches), {})
    assert (v.rank, v.kind) == (0, "forward")
    assert v.evidence["ratio_to_median"] < 0.05


def test_thresholds_are_configurable() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=4)
    batches = sim.batches(0)
    li = sim.column("Sentinel.loss")
    batches[5].stats[li] *= 2.5
    assert OutlierDetector(OutlierSettings()).judge(view_of(batches), {}) == []  # under the 4x floor
    [v] = OutlierDetector(OutlierSettings(ratio=2.0, z=4.0)).judge(view_of(batches), {})
    assert v.rank == 5


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
    s = parse_settings({"detectors": {"outlier": False}})
    core = CoordinatorCore(s, clock=FakeClock())
    assert all(d.name != "outlier" for d in core.detectors)
