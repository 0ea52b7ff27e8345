"""Progress: lost ranks, ranks that stop reporting, ranks that lag their group."""
from __future__ import annotations

from logic_helpers import FakeClock

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.synthetic import SyntheticTraining


def _core(**cluster):
    clock = FakeClock()
    core = CoordinatorCore(cluster, clock=clock)
    return core, clock


def _register(core, sim):
    for r in sim.rank_ids:
        core.on_register(sim.job, int(r), {"world_size": sim.ranks, "host": "h", "pid": 100 + int(r)})


def test_rank_that_stops_reporting_is_named_with_the_first_step_it_did_not_complete() -> None:
    core, clock = _core(deadline_s=10.0, detectors={"progress": {"lag_steps": None}})
    sim = SyntheticTraining(ranks=6, tensors=16, seed=1)
    _register(core, sim)
    found = []
    for step in range(12):
        for b in sim.batches(step):
            if not (b.rank == 4 and step >= 7):  # rank 4 hangs inside step 7
                core.on_step(b)
        clock.advance(0.5)
        found += core.tick()
    assert found == []  # step 7 is still inside its deadline
    clock.advance(10.0)
    found = core.tick()
    [v] = found
    assert (v.detector, v.rank, v.step, v.ties) == ("progress", 4, 7, [])
    assert v.evidence["missing"] == [4] and v.evidence["reported"] == 5
    # The stalled rank is not waited for again: later steps judge without a second deadline.
    assert core.status()["pending_steps"] == 0
    for b in sim.batches(12):
        if b.rank != 4:
            core.on_step(b)
    assert core.tick() == []
    assert core.status()["counters"]["steps_judged"] == 13


def test_two_ranks_stopping_together_are_ties() -> None:
    core, clock = _core(deadline_s=1.0)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=2)
    _register(core, sim)
    for b in sim.batches(0):
        core.on_step(b)
    for b in sim.batches(1)[:2]:
        core.on_step(b)
    clock.advance(2.0)
    [v] = core.tick()
    assert (v.rank, v.ties, v.step) == (2, [3], 1)


def test_lost_rank_names_first_step_not_completed_and_the_exit() -> None:
    core, clock = _core()
    sim = SyntheticTraining(ranks=4, tensors=16, seed=3)
    _register(core, sim)
    for step in range(5):
        for b in sim.batches(step):
            core.on_step(b)
        core.tick()
    core.on_rank_lost(sim.job, 1, 4, -9, "process killed by SIGKILL", signal=9)
    clock.advance(0.6)
    [v] = core.tick()
    assert (v.detector, v.rank, v.step) == ("progress", 1, 5)
    assert v.evidence["exit_status"] == -9 and v.evidence["signal"] == "SIGKILL"
    assert core.status()["jobs"][sim.job]["ranks"]["1"]["state"] == "lost"


def test_lagging_rank_is_named_before_any_deadline() -> None:
    core, clock = _core(deadline_s=1000.0, detectors={"progress": {"lag_steps": 3}})
    sim = SyntheticTraining(ranks=4, tensors=16, seed=4)
    _register(core, sim)
    found = []
    for step in range(10):
        for b in sim.batches(step):
            if not (b.rank == 0 and step > 2):  # rank 0 stuck after step 2, the others run on
                core.on_step(b)
        clock.advance(0.3)  # a step takes longer than the lag scan's period
        found += core.tick()
    assert [(v.detector, v.rank, v.step) for v in found] == [("progress", 0, 3)]
    assert "behind" in found[0].evidence["rule"]


def test_the_lag_scan_runs_a_few_times_a_second_not_at_every_tick() -> None:
    """It walks every member: at 16k ranks and 20 ticks a second that was a few % of a core."""
    core, clock = _core(deadline_s=1000.0, detectors={"progress": {"lag_steps": 3}})
    sim = SyntheticTraining(ranks=4, tensors=16, seed=4)
    _register(core, sim)
    for step in range(6):
        for b in sim.batches(step):
            if b.rank != 0 or step < 2:
                core.on_step(b)
    assert core.tick() != []  # the first scan finds rank 0 behind at once
    core2, clock2 = _core(deadline_s=1000.0, detectors={"progress": {"lag_steps": 3}})
    _register(core2, sim)
    core2.tick()  # scanned now: nobody behind yet
    for step in range(6):
        for b in sim.batches(step):
            if b.rank != 0 or step < 2:
                core2.on_step(b)
    clock2.advance(0.1)
    assert [v.detector for v in core2.tick()] == []  # within the scan's period: not looked at yet
    clock2.advance(0.2)
    assert [(v.detector, v.rank, v.step) for v in core2.tick()] == [("progress", 0, 2)]
    assert [(v.detector, v.rank) for v in core2.drain()] == []  # named once


def test_clean_finish_and_exit_zero_are_not_findings() -> None:
    core, clock = _core(deadline_s=1.0)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=5)
    _register(core, sim)
    for step in range(3):
        for b in sim.batches(step):
            core.on_step(b)
        core.tick()
    core.on_rank_finished(sim.job, 0, 2)
    core.on_rank_lost(sim.job, 1, 2, 0, "exited")
    for r in (2, 3):
        core.on_rank_finished(sim.job, r)
    clock.advance(100.0)
    assert core.tick() == [] and core.drain() == []
    assert {r["state"] for r in core.status()["jobs"][sim.job]["ranks"].values()} == {"finished"}


def test_drain_judges_pending_steps_without_deadline_findings() -> None:
    core, clock = _core()
    sim = SyntheticTraining(ranks=4, tensors=16, seed=6)
    _register(core, sim)
    batches = sim.batches(0)
    li = sim.column("Sentinel.loss")
    batches[2].stats[li] *= 30
    for b in batches[:3]:  # rank 3's last batch never arrives before the job ends
        core.on_step(b)
    assert core.tick() == []
    found = core.drain()
    assert [(v.detector, v.rank) for v in found] == [("outlier", 2)]
    assert core.status()["pending_steps"] == 0


def test_paused_ranks_are_not_late_and_a_hung_rank_heartbeating_stays_stalled() -> None:
    core, clock = _core(deadline_s=5.0, detectors={"progress": {"lag_steps": None}})
    sim = SyntheticTraining(ranks=4, tensors=16, seed=7)
    _register(core, sim)
    for b in sim.batches(0):
        core.on_step(b)
    core.tick()
    step1 = sim.batches(1)
    for b in step1[:2]:  # ranks 0, 1 finished step 1; 2 and 3 paused before it
        core.on_step(b)
    for r in range(4):
        core.on_heartbeat(sim.job, r, 1, "paused")
    clock.advance(600.0)  # an operator holds the job for ten minutes
    assert core.tick() == []
    for r in range(4):
        core.on_heartbeat(sim.job, r, 1, "running")
    clock.advance(1.0)
    assert core.tick() == []  # resumed: the deadline restarted when the pause ended
    core.on_step(step1[2])
    clock.advance(5.0)
    [v] = core.tick()
    assert (v.rank, v.step) == (3, 1)
    core.on_heartbeat(sim.job, 3, 1, "running")  # its heartbeat thread lives on
    for step in (2, 3):
        for b in sim.batches(step)[:3]:
            core.on_step(b)
        assert core.tick() == []  # judged at once, not after another deadline per step
    assert core.status()["pending_steps"] == 0


def test_a_restarted_process_on_a_lost_rank_is_awaited_again() -> None:
    core, clock = _core()
    sim = SyntheticTraining(ranks=2, tensors=16, seed=8)
    _register(core, sim)
    core.on_rank_lost(sim.job, 1, -1, 1, "exit 1")
    clock.advance(0.6)
    assert [v.rank for v in core.tick()] == [1]
    core.on_register(sim.job, 1, {"world_size": 2, "host": "h", "pid": 999})
    assert core.status()["jobs"][sim.job]["ranks"]["1"]["state"] == "expected"
    core.on_register(sim.job, 0, {"world_size": 2, "host": "h", "pid": 100})  # same process: no change
    assert core.status()["jobs"][sim.job]["ranks"]["0"]["state"] == "expected"
