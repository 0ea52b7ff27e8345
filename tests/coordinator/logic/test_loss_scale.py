"""Overflow steps under a loss scale: counted, never a NaN origin; faults still named."""
from __future__ import annotations

from logic_helpers import FakeClock, feed_step

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.views.coverage import describe
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.coordinator.logic.verdict import JOB_WIDE
from rankscope.wire.records import LOSS_SCALE_RECORD, Kind


def _scaled_job(ranks: int = 4, seed: int = 21) -> tuple[SyntheticTraining, int]:
    """A synthetic job whose first weight column is the loss-scale record instead."""
    sim = SyntheticTraining(ranks=ranks, tensors=32, seed=seed)
    col = sim.column("Sentinel.param.layer0.")
    sim.names[col] = LOSS_SCALE_RECORD
    sim.kinds[col] = Kind.OPT_STATE
    return sim, col


def _step(sim: SyntheticTraining, col: int | None, step: int, scale: float, overflow: list[int] | None = None,
          grads: tuple[int, int] | None = None):
    """One step's batches; ``overflow``: the ranks whose own gradients overflow (every
    rank's reduced gradients are then Inf, as the reduction makes them); ``grads``: the
    (local, reduced) columns that overflow, layer 2's by default."""
    batches = sim.batches(step)
    local, reduced = grads or (sim.column("Sentinel.grad_local.layer2."), sim.column("Sentinel.grad_reduced.layer2."))
    for b in batches:
        if col is not None:
            b.stats[col] = (scale, scale, scale, scale)
            b.crc32[col] = int(scale) & 0x7FFFFFFF
        if overflow:
            if b.rank in overflow:
                b.inf_count[local] = 5
            b.inf_count[reduced] = 5
    return batches


def _run(core: CoordinatorCore, clock: FakeClock, steps) -> list:
    found = []
    for batches in steps:
        found += feed_step(core, clock, batches)
    return found


def test_the_scalers_search_and_a_lone_overflow_at_its_ceiling_are_counted_and_never_named() -> None:
    clock, (sim, col) = FakeClock(), _scaled_job()
    core = CoordinatorCore({}, clock=clock)
    scale = 2.0 ** 24
    steps = []
    for step in range(12):
        over = list(range(4)) if step < 5 else [1] if step == 9 else None  # the search, then one rank at the ceiling
        steps.append(_step(sim, col, step, scale, over))
        if over:
            scale /= 2
    assert _run(core, clock, steps) == []
    shown = core.coverage_report(sim.job)["loss_scale"]
    assert shown["overflow_steps"] == 6
    assert shown["scale"] == 2.0 ** 18
    assert [o["step"] for o in shown["recent_overflows"]] == [0, 1, 2, 3, 4, 9]
    assert shown["recent_overflows"][-1]["ranks_overflowed"] == 1
    assert core.status()["jobs"][sim.job]["loss_scale"]["overflow_steps"] == 6
    assert "loss scale 262144: 6 overflow step(s)" in describe(core.coverage_report(sim.job))


def test_without_a_loss_scale_the_same_overflow_is_a_nan_origin_as_before() -> None:
    clock = FakeClock()
    sim = SyntheticTraining(ranks=4, tensors=32, seed=22)
    core = CoordinatorCore({}, clock=clock)
    [v] = [v for v in _run(core, clock, [_step(sim, None, 0, 1.0, [2])]) if v.detector == "nan_origin"]
    assert (v.rank, v.step, v.kind) == (2, 0, "grad_local")
    assert "loss_scale" not in core.coverage_report(sim.job)


def test_a_nan_in_one_ranks_forward_is_named_even_when_the_scale_then_skips_the_step() -> None:
    clock, (sim, col) = FakeClock(), _scaled_job(seed=23)
    core = CoordinatorCore({}, clock=clock)
    steps = [_step(sim, col, s, 65536.0) for s in range(6)]
    bad = _step(sim, col, 6, 65536.0, overflow=[0, 1, 2, 3])  # the NaN reaches every gradient
    bad[2].nan_count[sim.column("Cell.layer1.")] = 1  # but it began in rank 2's forward
    [v] = [v for v in _run(core, clock, steps + [bad]) if v.detector == "nan_origin"]
    assert (v.rank, v.step, v.kind) == (2, 6, "forward")


def test_a_non_finite_weight_under_a_loss_scale_is_still_a_nan_origin() -> None:
    clock, (sim, col) = FakeClock(), _scaled_job(seed=24)
    core = CoordinatorCore({}, clock=clock)
    batches = _step(sim, col, 0, 1024.0, overflow=[0, 1, 2, 3])
    batches[3].nan_count[sim.column("Sentinel.param.layer2.")] = 1
    [v] = [v for v in _run(core, clock, [batches]) if v.detector == "nan_origin"]
    assert (v.rank, v.kind) == (3, "param")


def test_a_scale_that_keeps_falling_on_every_rank_is_a_job_finding_that_names_no_rank() -> None:
    clock, (sim, col) = FakeClock(), _scaled_job(seed=25)
    core = CoordinatorCore({}, clock=clock)
    scale, steps = 65536.0, []
    for step in range(16):
        over = list(range(4)) if step >= 4 else None
        steps.append(_step(sim, col, step, scale, over))
        if over:
            scale /= 2
    found = _run(core, clock, steps)
    [v] = [v for v in found if v.detector == "loss_scale"]
    assert v.step == 11 and not v.decided  # the 8th overflow in a row after the clean steps 0-3
    assert v.candidates == [0, 1, 2, 3]
    assert v.evidence["streak_from_step"] == 4 and v.evidence["scale_then"] == 65536.0
    assert "every rank" in v.evidence[JOB_WIDE]
    assert not [v for v in found if v.detector == "nan_origin"]


def test_one_rank_overflowing_alone_through_the_streak_is_named() -> None:
    clock, (sim, col) = FakeClock(), _scaled_job(seed=26)
    core = CoordinatorCore({"detectors": {"loss_scale": {"streak": 4}}}, clock=clock)
    scale, steps = 4096.0, []
    for step in range(10):
        over = [3] if step >= 3 else None
        steps.append(_step(sim, col, step, scale, over))
        if over:
            scale /= 2
    [v] = [v for v in _run(core, clock, steps) if v.detector == "loss_scale"]
    assert (v.rank, v.step, v.decided, v.kind) == (3, 6, True, "grad_local")
    assert "only this rank" in v.evidence["overflowed_alone"]


def test_an_overflow_at_the_scales_floor_is_a_finding_at_once() -> None:
    clock, (sim, col) = FakeClock(), _scaled_job(seed=27)
    core = CoordinatorCore({}, clock=clock)
    steps = [_step(sim, col, 0, 1.0), _step(sim, col, 1, 1.0, overflow=[0, 1, 2, 3])]
    [v] = [v for v in _run(core, clock, steps) if v.detector == "loss_scale"]
    assert v.step == 1 and "floor" in v.evidence["rule"]


def test_a_jit_steps_gradient_allreduce_read_from_the_kernel_dump_overflows_as_a_gradient() -> None:
    """Inside a jit step the reducer's AllReduce kernel keeps no Cell scope: its input
    reads as a forward record. Its output is a reduced gradient, so its input is a rank's
    own gradient, and an overflow there is the scale's."""
    clock, (sim, col) = FakeClock(), _scaled_job(seed=28)
    local, reduced = sim.column("Sentinel.grad_local.layer2."), sim.column("Sentinel.grad_reduced.layer2.")
    sim.names[local], sim.kinds[local] = "AllReduce.Default_AllReduce-op11.0.0.input.0", Kind.FORWARD
    sim.names[reduced] = "AllReduce.Default_AllReduce-op11.0.0.output.0"
    core = CoordinatorCore({}, clock=clock)
    steps = [_step(sim, col, 0, 65536.0, [0, 1, 2, 3], (local, reduced)),
             _step(sim, col, 1, 32768.0, [2], (local, reduced))]
    assert _run(core, clock, steps) == []
    assert core.coverage_report(sim.job)["loss_scale"]["recent_overflows"][1]["ranks_overflowed"] == 1
    bad = _step(sim, col, 2, 32768.0, grads=(local, reduced))
    bad[1].nan_count[sim.column("Cell.layer2.")] = 1  # a forward NaN is still one
    [v] = [v for v in _run(core, clock, [bad]) if v.detector == "nan_origin"]
    assert (v.rank, v.step) == (1, 2)
