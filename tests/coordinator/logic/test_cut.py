"""The consistent cut: one pause step for a job that every live rank can still reach.

Driven through CoordinatorCore with a scripted clock, plus a small simulation of a
data-parallel job (a step cannot finish on any rank until every rank entered its
AllReduce) with late heartbeats and late controls, paused and resumed many times.
"""
from __future__ import annotations

import random

from logic_helpers import FakeClock

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.incidents.incident import ActionKind
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.wire.sync import IN, SyncPoint

JOB = "synth"


def _core(**cluster) -> tuple[CoordinatorCore, FakeClock, SyntheticTraining]:
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "pause", **cluster}, clock=clock, wall_clock=clock)
    sim = SyntheticTraining(ranks=4, tensors=8, seed=3)
    for r in range(4):
        core.on_register(JOB, r, {"world_size": 4, "host": "h", "pid": 100 + r})
    return core, clock, sim


def _hand_over(core: CoordinatorCore, sim: SyntheticTraining, steps: range, ranks=range(4)) -> None:
    for step in steps:
        batches = sim.batches(step)
        for r in ranks:
            core.on_step(batches[r])


def _pauses(actions) -> list[int]:
    return [a.detail["at"] for a in actions if a.kind in (ActionKind.PAUSE, ActionKind.STEP)]


def test_a_rank_already_inside_the_next_allreduce_moves_the_cut_past_it() -> None:
    # The reported deadlock: ranks 0, 1, 3 finished step 5 and wait at the boundary,
    # rank 2 began step 6 and sits in its gradient AllReduce.
    core, clock, sim = _core()
    _hand_over(core, sim, range(6))
    for r in (0, 1, 3):
        core.on_heartbeat(JOB, r, 5, "running", started=5)
    core.on_heartbeat(JOB, 2, 5, "running", SyncPoint("AllReduce", 6, 0, IN, clock()), started=6)
    core.operator("pause", JOB)
    [at] = _pauses(core.take_actions())
    assert at == 7  # not 6: rank 2 can no longer stop before step 6
    for r in range(4):
        core.on_heartbeat(JOB, r, 6, "paused", started=6)
    core.tick()
    cut = core.status()["jobs"][JOB]["cut"]
    assert cut["step"] == 7 and cut["complete"] and cut["partial"] == {}
    assert set(cut["ranks"].values()) == {"paused before step 7"}


def test_a_stale_view_is_corrected_by_pausing_everyone_again_later() -> None:
    core, clock, sim = _core()
    _hand_over(core, sim, range(3))
    for r in range(4):
        core.on_heartbeat(JOB, r, 2, "paused", started=2)  # an earlier pause held them before 3
    core.operator("pause", JOB)
    assert _pauses(core.take_actions()) == [3]
    # The coordinator's view was stale: rank 1 had been released and is inside step 3.
    core.on_heartbeat(JOB, 1, 2, "running", SyncPoint("AllReduce", 3, 0, IN, clock()), started=3)
    core.tick()
    assert _pauses(core.take_actions()) == [4]
    core.tick()
    assert core.take_actions() == []  # moved once, not on every tick
    cut = core.status()["jobs"][JOB]["cut"]
    assert (cut["step"], cut["moved_from"], cut["complete"]) == (4, [3], False)
    assert "on its way (paused before step 3)" in cut["ranks"]["0"]
    for r in range(4):
        core.on_heartbeat(JOB, r, 3, "paused", started=3)
    assert core.status()["jobs"][JOB]["cut"]["complete"]


def test_divergence_pause_with_a_dead_and_a_hung_rank_is_a_partial_cut_that_says_why(tmp_path) -> None:
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "pause", "pause_timeout_s": 5}, clock=clock, wall_clock=clock,
                           export_dir=tmp_path)
    sim = SyntheticTraining(ranks=4, tensors=8, seed=3)
    for r in range(4):
        core.on_register(JOB, r, {"world_size": 4, "host": "h", "pid": 100 + r})
    _hand_over(core, sim, range(4))
    core.on_rank_lost(JOB, 3, 3, None, "killed", signal=9)
    core.on_heartbeat(JOB, 2, 3, "running", SyncPoint("AllReduce", 4, 0, IN, clock()), started=4)
    core.aligner.ranks[(JOB, 2)].state = core.aligner.ranks[(JOB, 2)].state.STALLED  # judged hung
    core.book.open_or_attach(_verdict())
    [at] = _pauses(core.take_actions())
    assert at == 5
    for r in (0, 1):
        core.on_heartbeat(JOB, r, 4, "paused", started=4)
    clock.advance(0.5)
    core.tick()
    assert [a.kind for a in core.take_actions()] == [ActionKind.EXPORT]  # no wait for the two that cannot
    [inc] = core.incidents()
    cut = inc["cut"]
    assert cut["step"] == 5 and not cut["complete"]
    assert cut["ranks"]["0"] == cut["ranks"]["1"] == "paused before step 5"
    assert cut["partial"]["3"].startswith("lost after step 3 (signal 9")
    assert cut["partial"]["2"].startswith("stalled: inside AllReduce of step 4")


def test_a_rank_that_never_gets_there_is_named_when_the_pause_times_out() -> None:
    core, clock, sim = _core(pause_timeout_s=5)
    _hand_over(core, sim, range(4))
    core.book.open_or_attach(_verdict())
    assert _pauses(core.take_actions()) == [5]
    for r in (0, 1, 2):
        core.on_heartbeat(JOB, r, 4, "paused", started=4)
    core.on_heartbeat(JOB, 3, 3, "running", SyncPoint("AllReduce", 4, 0, IN, clock()), started=4)
    clock.advance(6)
    core.tick()
    [inc] = core.incidents()
    assert inc["state"] == "exporting" and inc["history"][-1][0] == "pause_timeout"
    assert inc["cut"]["partial"]["3"].startswith("did not reach step 5: inside AllReduce of step 4 for 6 s")


def test_step_n_runs_every_rank_to_the_same_step_and_resume_clears_the_cut() -> None:
    core, clock, sim = _core()
    _hand_over(core, sim, range(3))
    for r in range(4):
        core.on_heartbeat(JOB, r, 2, "paused", started=2)
    core.operator("pause", JOB)
    assert _pauses(core.take_actions()) == [3]
    [a] = core.operator("step", JOB, n=2)
    assert (a.kind, a.detail) == (ActionKind.STEP, {"n": 2, "at": 5})
    assert core.take_actions() == [a]
    _hand_over(core, sim, range(3, 5), ranks=(0, 1))  # two ranks got there, two are behind
    core.tick()
    assert core.take_actions() == []  # ranks behind are no reason to move the cut
    for r in (2, 3):
        core.on_heartbeat(JOB, r, 4, "running", started=4)  # behind the others, not past the cut
    core.tick()
    assert core.take_actions() == []
    [a] = core.operator("resume", JOB)
    assert a.kind is ActionKind.RESUME and core.status()["jobs"][JOB]["cut"] is None


def test_jobs_have_cuts_of_their_own() -> None:
    core, clock, sim = _core()
    other = SyntheticTraining(ranks=2, tensors=8, seed=4, job="other")
    for r in range(2):
        core.on_register("other", r, {"world_size": 2, "host": "h2", "pid": 200 + r})
    _hand_over(core, sim, range(2))
    for step in range(9):
        for b in other.batches(step):
            core.on_step(b)
    core.operator("pause", JOB)
    core.operator("pause", "other")
    assert _pauses(core.take_actions()) == [3, 10]


def _verdict():
    from rankscope.coordinator.logic.verdict import Verdict
    return Verdict("replica", 1, 3, "t", 0, "param", f"{JOB}/0", {}, [], JOB)


class _DPJob:
    """Four ranks of a data-parallel job, one tick at a time: a rank at a boundary starts
    the next step unless its gate holds it; a step cannot finish until every rank entered
    its AllReduce. Heartbeats reach the coordinator and controls reach the ranks late."""

    def __init__(self, core: CoordinatorCore, clock: FakeClock, rng: random.Random) -> None:
        self.core, self.clock, self.rng = core, clock, rng
        self.sim = SyntheticTraining(ranks=4, tensors=5, seed=5)
        self.started = [0] * 4  # step each rank is in (or last began)
        self.in_reduce = [False] * 4
        self.entered = [-1] * 4  # newest step whose AllReduce each rank entered
        self.at_boundary = [False] * 4
        self.hold: list[int | None] = [None] * 4
        self.wire: list[tuple[float, int, object]] = []  # (deliver at, rank, what)
        self.stuck_ticks = 0

    def deliver(self) -> None:
        due = [w for w in self.wire if w[0] <= self.clock()]
        self.wire = [w for w in self.wire if w[0] > self.clock()]
        for _, r, what in due:
            if what[0] == "control":
                self.hold[r] = what[1]
            else:
                self.core.on_heartbeat(JOB, r, *what[1:])

    def tick(self) -> None:
        self.deliver()
        for a in self.core.take_actions():
            at = a.detail.get("at") if a.kind in (ActionKind.PAUSE, ActionKind.STEP) else None
            for r in range(4):
                self.wire.append((self.clock() + self.rng.uniform(0.0, 0.3), r, ("control", at)))
        for r in self.rng.sample(range(4), 4):
            s = self.started[r]
            if self.at_boundary[r]:
                if self.hold[r] is not None and s + 1 >= self.hold[r]:
                    continue  # held
                self.started[r], self.at_boundary[r] = s + 1, False
            elif not self.in_reduce[r]:
                self.in_reduce[r], self.entered[r] = True, s
            elif all(e >= s for e in self.entered):
                self.in_reduce[r], self.at_boundary[r] = False, True
                self.core.on_step(self.sim.batches(s)[r])
            paused = self.at_boundary[r] and self.hold[r] is not None and s + 1 >= self.hold[r]
            sync = SyncPoint("AllReduce", self.started[r], 0, IN if self.in_reduce[r] else "out", self.clock())
            state = ("paused", s) if paused else ("running", self.started[r] - 1)
            self.wire.append((self.clock() + self.rng.uniform(0.0, 0.3), r,
                              ("hb", state[1], state[0], sync, self.started[r])))
        waiting = [r for r in range(4) if self.in_reduce[r]]
        self.stuck_ticks = self.stuck_ticks + 1 if waiting and any(
            self.at_boundary[p] and self.hold[p] is not None for p in range(4)) else 0
        self.clock.advance(0.05)
        self.core.tick()

    def held_steps(self) -> set[int | None]:
        return {self.started[r] + 1 if self.at_boundary[r] and self.hold[r] is not None
                and self.started[r] + 1 >= self.hold[r] else None for r in range(4)}


def test_twenty_pause_resume_cycles_on_a_simulated_dp_job_always_settle_on_one_step() -> None:
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "pause"}, clock=clock, wall_clock=clock)
    for r in range(4):
        core.on_register(JOB, r, {"world_size": 4, "host": "h", "pid": 100 + r})
    job = _DPJob(core, clock, random.Random(7))
    worst_wait = moved = 0
    for cycle in range(20):
        for _ in range(job.rng.randint(3, 12)):
            job.tick()
        core.operator("pause", JOB)
        for _ in range(200):
            job.tick()
            worst_wait = max(worst_wait, job.stuck_ticks)
            if len(job.held_steps()) == 1 and None not in job.held_steps() and not job.wire:
                break
        held = job.held_steps()
        assert len(held) == 1 and None not in held, (cycle, job.started, job.hold, job.at_boundary)
        cut_now = core.status()["jobs"][JOB]["cut"]
        assert held == {cut_now["step"]}
        moved += bool(cut_now["moved_from"])
        if cycle % 3 == 0:
            [cut] = held
            core.operator("step", JOB, n=2)
            for _ in range(200):
                job.tick()
                if job.held_steps() == {cut + 2} and not job.wire:
                    break
            assert job.held_steps() == {cut + 2}
        core.operator("resume", JOB)
    # A rank left in a collective by a pause waits only for the cut to move (a few ticks).
    assert worst_wait < 40
    assert moved, "the late heartbeats and controls never made a rank overshoot: the race was not exercised"
