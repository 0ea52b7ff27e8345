"""NaN/Inf origin: a NaN produced on one rank before the AllReduce, then spread to all."""
from __future__ import annotations

from logic_helpers import FakeClock, feed_step, view_of

from rankscope.config.cluster import parse_cluster
from rankscope.coordinator.logic.align.aligner import StepAligner
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.detectors.nan_origin import NanOriginDetector
from rankscope.coordinator.logic.synthetic import SyntheticTraining


def _spread_nan(sim: SyntheticTraining, batches, origin: list[int], layer: int = 2) -> None:
    """Origin ranks' local grad goes NaN; after the reduction every rank's reduced grad has it."""
    local = sim.column(f"Sentinel.grad_local.layer{layer}.")
    reduced = sim.column(f"Sentinel.grad_reduced.layer{layer}.")
    for b in batches:
        if b.rank in origin:
            b.nan_count[local] = 3
            b.stats[local] = float("nan")
        b.nan_count[reduced] = 3 * len(origin)
        b.stats[reduced] = float("nan")


def test_origin_rank_is_named_not_every_receiver() -> None:
    sim = SyntheticTraining(ranks=8, tensors=32, seed=3)
    batches = sim.batches(0)
    _spread_nan(sim, batches, origin=[5])
    [v] = NanOriginDetector().judge(view_of(batches), {})
    assert (v.rank, v.step, v.ties) == (5, 0, [])
    assert v.tensor.startswith("Sentinel.grad_local.layer2.")
    assert v.kind == "grad_local"
    assert v.evidence["nan_count"] == 3
    assert v.evidence["ranks_nonfinite_this_step"] == 8  # every rank received it


def test_two_origins_at_the_same_record_are_ties() -> None:
    sim = SyntheticTraining(ranks=6, tensors=32, seed=4)
    batches = sim.batches(0)
    _spread_nan(sim, batches, origin=[4, 1])
    [v] = NanOriginDetector().judge(view_of(batches), {})
    assert (v.rank, v.ties) == (1, [4])


def test_earlier_execution_index_wins_over_lower_rank() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=5)
    batches = sim.batches(0)
    _spread_nan(sim, batches, origin=[0], layer=5)
    act = sim.column("Cell.layer1.")  # forward activations run before any gradient
    batches[2].inf_count[act] = 1
    [v] = NanOriginDetector().judge(view_of(batches), {})
    assert (v.rank, v.tensor, v.ties) == (2, sim.names[act], [])
    assert v.evidence["inf_count"] == 1


def test_replicated_kind_is_used_only_when_nothing_before_reduction_is_bad() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=6)
    batches = sim.batches(0)
    p = sim.column("Sentinel.param.layer3.")
    batches[3].nan_count[p] = 1  # a parameter corrupted in place on rank 3
    [v] = NanOriginDetector().judge(view_of(batches), {})
    assert (v.rank, v.kind) == (3, "param")
    assert "no pre-reduction" in v.evidence["rule"]


def _view_without(batches, absent: set[int]):
    """The step as judged when ``absent`` ranks (members of the job) sent nothing of it."""
    al = StepAligner(parse_cluster({}))
    for b in batches:
        al.register(b.job, b.rank, {"world_size": len(batches)})
    for b in batches:
        if b.rank not in absent:
            al.ingest(b, 0.0)
    [(_, view)] = al.ready(0.0, force=True)
    return view


def test_a_nan_only_the_reduction_shows_names_the_rank_that_sent_nothing_not_the_receivers() -> None:
    # Rank 2 made the NaN and died before its records of the step left it: every rank
    # seen holds the NaN only in what the reduction gave it.
    sim = SyntheticTraining(ranks=4, tensors=32, seed=7)
    batches = sim.batches(0)
    _spread_nan(sim, batches, origin=[2])
    [v] = NanOriginDetector().judge(_view_without(batches, {2}), {})
    assert (v.rank, v.ties, v.kind) == (2, [], "grad_reduced")
    assert "inferred" in v.evidence["rule"] and v.evidence["ranks_unseen_this_step"] == [2]
    assert v.evidence["seen_first_on"] == 0
    [v] = NanOriginDetector().judge(_view_without(batches, {3, 2}), {})
    assert (v.rank, v.ties) == (2, [3])


def test_a_rank_missing_does_not_move_the_blame_when_the_origin_is_seen() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=8)
    batches = sim.batches(0)
    _spread_nan(sim, batches, origin=[1])
    [v] = NanOriginDetector().judge(_view_without(batches, {3}), {})
    assert (v.rank, v.kind) == (1, "grad_local") and "inferred" not in v.evidence["rule"]
    # A parameter corrupted in place on one rank seen: not every rank seen holds it.
    sim = SyntheticTraining(ranks=4, tensors=32, seed=9)
    batches = sim.batches(0)
    batches[0].nan_count[sim.column("Sentinel.param.layer3.")] = 1
    [v] = NanOriginDetector().judge(_view_without(batches, {3}), {})
    assert (v.rank, v.kind) == (0, "param")


def test_clean_step_raises_nothing() -> None:
    sim = SyntheticTraining(ranks=4, tensors=32, seed=7)
    assert NanOriginDetector().judge(view_of(sim.batches(0)), {}) == []


def test_core_names_origin_once_then_stays_quiet_while_nan_spreads() -> None:
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    sim = SyntheticTraining(ranks=8, tensors=32, seed=8)
    found = []
    for step in range(40):
        batches = sim.batches(step)
        if step >= 25:  # from 25 on every later step carries NaN everywhere, as a real run would
            _spread_nan(sim, batches, origin=[6] if step == 25 else list(range(8)))
        found += feed_step(core, clock, batches)
    nan = [v for v in found if v.detector == "nan_origin"]
    assert [(v.rank, v.step) for v in nan] == [(6, 25)]


def test_mixed_precision_runs_can_leave_routine_gradient_overflow_out() -> None:
    """Dynamic loss scaling: an Inf local gradient is routine (the step is skipped)."""
    clock = FakeClock()
    core = CoordinatorCore({"detectors": {"nan_origin": {"kinds": ["forward", "loss", "param"]}}}, clock=clock)
    sim = SyntheticTraining(ranks=4, tensors=32, seed=9)
    batches = sim.batches(0)
    batches[1].inf_count[sim.column("Sentinel.grad_local.layer1.")] = 4  # overflow: not a finding
    assert [v for v in feed_step(core, clock, batches) if v.detector == "nan_origin"] == []
    batches = sim.batches(1)
    batches[3].nan_count[sim.column("Cell.layer0.")] = 2  # a NaN activation still is
    [v] = [v for v in feed_step(core, clock, batches) if v.detector == "nan_origin"]
    assert (v.rank, v.step, v.kind) == (3, 1, "forward")
