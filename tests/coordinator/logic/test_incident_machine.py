"""Incident state machine: the transition table per policy, and the core driving it."""
from __future__ import annotations

import json

import pytest
from logic_helpers import FakeClock, feed_step

from rankscope.config.cluster import OnDivergence as P
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.incidents.incident import (
    ActionKind,
    Incident,
    IncidentTransitionError,
    transition,
)
from rankscope.coordinator.logic.incidents.incident import (
    IncidentEvent as E,
)
from rankscope.coordinator.logic.incidents.incident import (
    IncidentState as S,
)
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.coordinator.logic.verdict import Verdict


def _apply_all(inc: Incident, events: list[E]) -> list[tuple[str, list[str]]]:
    out = []
    for ev in events:
        acts = [a.kind.value for a in inc.apply(ev, 0.0)]
        out.append((inc.state.value, acts))
    return out


HAPPY = [E.START, E.ALL_PAUSED, E.BUNDLES_RECEIVED, E.WRITE_DONE]


@pytest.mark.parametrize("policy, expected", [
    (P.PAUSE, [("pausing", ["pause"]), ("exporting", ["export"]), ("written", ["write_incident"]), ("written", [])]),
    (P.EXPORT, [("pausing", ["pause"]), ("exporting", ["export"]), ("written", ["write_incident"]),
                ("resumed", ["resume"])]),
    (P.TERMINATE, [("pausing", ["pause"]), ("exporting", ["export"]), ("written", ["write_incident"]),
                   ("terminated", ["terminate"])]),
])
def test_each_policy_walks_its_path(policy, expected) -> None:
    inc = Incident("i", "j", policy, Verdict("replica", 1, 2, "t", 0, "param", "j/0"), 0.0)
    assert _apply_all(inc, HAPPY) == expected


def test_continue_exports_without_pausing() -> None:
    inc = Incident("i", "j", P.CONTINUE, Verdict("outlier", 1, 2, "t", 0, "loss", "j/0"), 0.0)
    assert _apply_all(inc, [E.START, E.EXPORT_TIMEOUT, E.WRITE_DONE]) == [
        ("exporting", ["export"]), ("written", ["write_incident"]), ("continued", [])]
    assert inc.final


def test_held_incident_waits_for_operator_and_stray_events_are_refused() -> None:
    inc = Incident("i", "j", P.PAUSE, Verdict("replica", 1, 2, "t", 0, "param", "j/0"), 0.0)
    _apply_all(inc, [E.START, E.PAUSE_TIMEOUT, E.BUNDLES_RECEIVED, E.WRITE_DONE])
    with pytest.raises(IncidentTransitionError, match="written.*bundles_received"):
        inc.apply(E.BUNDLES_RECEIVED, 0.0)
    assert inc.state is S.WRITTEN
    assert [a.kind for a in inc.apply(E.RESUME, 0.0)] == [ActionKind.RESUME]
    with pytest.raises(IncidentTransitionError):
        transition(P.EXPORT, S.WRITTEN, E.RESUME)  # export resumes by itself, not on request
    with pytest.raises(IncidentTransitionError):
        transition(P.PAUSE, S.RESUMED, E.TERMINATE)  # final states accept nothing


def test_operator_terminate_ends_any_open_incident() -> None:
    for state in (S.DETECTED, S.PAUSING, S.EXPORTING, S.WRITTEN):
        for policy in P:
            assert transition(policy, state, E.TERMINATE) == (S.TERMINATED, (ActionKind.TERMINATE,))


def _job(core: CoordinatorCore, clock: FakeClock, steps: int, fault_step: int, sim: SyntheticTraining):
    p = sim.column("Sentinel.param.layer1.")
    for r in sim.rank_ids:
        core.on_register(sim.job, int(r), {"world_size": sim.ranks, "host": "h", "pid": 1000 + int(r)})
    found = []
    for step in range(steps):
        batches = sim.batches(step)
        if step == fault_step:
            batches[1].crc32[p] ^= 1
        found += feed_step(core, clock, batches)
    return found


def test_core_drives_pause_export_write_and_holds_until_resumed(tmp_path) -> None:
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "pause"}, clock=clock, export_dir=tmp_path, wall_clock=lambda: 1.7e9)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=1)
    [v] = _job(core, clock, 6, 3, sim)
    # The ranks ran on after the verdict (step 5 arrived: they began the cut's step, and
    # may be inside step 6), so the pause is sent again for step 7.
    acts = core.take_actions()
    assert [(a.kind, a.detail["at"]) for a in acts] == [(ActionKind.PAUSE, 5), (ActionKind.PAUSE, 7)]
    act = acts[-1]
    assert act.job == sim.job and len({a.incident_id for a in acts}) == 1
    iid = act.incident_id
    assert iid and core.incidents()[0]["state"] == "pausing"
    assert (tmp_path / "incidents" / iid / "state.json").is_file()
    for r in range(3):
        core.on_heartbeat(sim.job, r, 6, "paused")
    core.tick()
    assert core.take_actions() == []  # rank 3 has not paused yet
    core.on_heartbeat(sim.job, 3, 6, "paused")
    core.tick()
    assert [a.kind for a in core.take_actions()] == [ActionKind.EXPORT]
    for r in range(4):
        core.on_bundle(iid, r, str(tmp_path / "incidents" / iid / f"rank_{r}"))
    core.tick()
    [w] = core.take_actions()
    assert w.kind is ActionKind.WRITE_INCIDENT
    path = core.write_incident(iid)
    assert core.take_actions() == []  # pause policy: held
    doc = json.loads(path.read_text())
    assert (doc["incident_id"], doc["detector"], doc["first_diverging_rank"], doc["step"]) == (iid, "replica", 1, 3)
    assert doc["tensor"] == sim.names[sim.column("Sentinel.param.layer1.")]
    assert doc["detected_at"].startswith("2023-11-14T22:13:20")
    assert doc["evidence"]["agreeing_ranks"] == 3
    assert {k: v["state"] for k, v in doc["ranks"].items()} == {str(r): "paused" for r in range(4)}
    assert {v["paused_before"] for v in doc["ranks"].values()} == {7}
    assert doc["cut"]["step"] == 7 and doc["cut"]["complete"] and doc["cut"]["moved_from"] == [5, 6]
    assert set(doc["bundles"]) == {"0", "1", "2", "3"} and doc["missing_bundles"] == []
    [resume] = core.operator("resume")
    assert resume.kind is ActionKind.RESUME and core.incidents()[0]["state"] == "resumed"


def test_timeouts_move_on_without_hung_ranks_and_missing_bundles_are_listed(tmp_path) -> None:
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "terminate", "pause_timeout_s": 5, "export_timeout_s": 7},
                           clock=clock, export_dir=tmp_path)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=2)
    _job(core, clock, 5, 2, sim)
    iid = core.take_actions()[0].incident_id
    core.on_heartbeat(sim.job, 0, 5, "paused")
    clock.advance(5.0)
    core.tick()
    assert [a.kind for a in core.take_actions()] == [ActionKind.EXPORT]
    core.on_bundle(iid, 0, "r0")
    clock.advance(7.0)
    core.tick()
    assert [a.kind for a in core.take_actions()] == [ActionKind.WRITE_INCIDENT]
    doc = json.loads(core.write_incident(iid).read_text())
    assert doc["missing_bundles"] == [1, 2, 3]
    assert [a.kind for a in core.take_actions()] == [ActionKind.TERMINATE]
    assert core.incidents()[0]["state"] == "terminated"


def test_later_verdicts_join_the_open_incident(tmp_path) -> None:
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock, export_dir=tmp_path)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=3)
    p = sim.column("Sentinel.param.layer1.")
    li = sim.column("Sentinel.loss")
    batches = sim.batches(0)
    batches[1].crc32[p] ^= 1
    batches[2].stats[li] *= 50
    found = feed_step(core, clock, batches)
    assert [v.detector for v in found] == ["replica", "outlier"]  # trust order within a step
    [inc] = core.incidents()
    assert inc["verdict"]["detector"] == "replica"
    assert [r["detector"] for r in inc["related"]] == ["outlier"]


def test_restarted_core_keeps_incident_state(tmp_path) -> None:
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock, export_dir=tmp_path)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=4)
    _job(core, clock, 4, 1, sim)
    iid = core.take_actions()[0].incident_id
    core.on_bundle(iid, 2, "/x/rank_2")

    again = CoordinatorCore({}, clock=clock, export_dir=tmp_path)
    [inc] = again.incidents()
    assert (inc["incident_id"], inc["state"], inc["bundles"]) == (iid, "pausing", {"2": "/x/rank_2"})
    assert inc["verdict"]["rank"] == 1
    # It carries on: the pause times out and the export starts.
    clock.advance(again.settings.pause_timeout_s)
    again.tick()
    assert [a.kind for a in again.take_actions()] == [ActionKind.EXPORT]


def test_operator_controls_without_incident_and_manual_export(tmp_path) -> None:
    core = CoordinatorCore({}, clock=FakeClock(), export_dir=tmp_path)
    core.on_register("j", 0, {})
    [a] = core.operator("step", n=3)
    # Nothing begun yet: the third boundary from here (steps 0, 1 run, hold before 2).
    assert (a.kind, a.detail, a.incident_id) == (ActionKind.STEP, {"n": 3, "at": 2}, None)
    with pytest.raises(ValueError, match="step"):
        core.operator("step", n=0)
    with pytest.raises(ValueError, match="command"):
        core.operator("explode")
    [a] = core.operator("export")
    assert a.kind is ActionKind.PAUSE and core.incidents()[0]["verdict"]["detector"] == "manual"


@pytest.mark.parametrize("first, policy, after_write", [
    (None, "export", [ActionKind.RESUME]),  # a running job: export, then train on
    ("pause", "pause", []),  # the operator's pause holds until the operator's resume
    ("step", "pause", []),  # step N ends in a pause too
])
def test_an_operator_export_keeps_an_operator_pause(tmp_path, first, policy, after_write) -> None:
    clock = FakeClock()
    core = CoordinatorCore({"pause_timeout_s": 1, "export_timeout_s": 1}, clock=clock, export_dir=tmp_path)
    core.on_register("j", 0, {})
    if first is not None:
        core.operator(first, n=1 if first == "step" else None)
    core.operator("export")
    [inc] = core.incidents()
    assert inc["policy"] == policy
    for _ in range(2):  # no rank answers here: the pause, then the export, time out
        clock.advance(1.0)
        core.tick()
    core.take_actions()
    core.write_incident(inc["incident_id"])
    assert [a.kind for a in core.take_actions()] == after_write
    if policy == "pause":
        assert [a.kind for a in core.operator("resume")] == [ActionKind.RESUME]
        assert core.incidents()[0]["state"] == "resumed"


def test_ranks_ending_after_rankscope_terminated_the_job_open_nothing(tmp_path) -> None:
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "terminate", "pause_timeout_s": 1, "export_timeout_s": 1},
                           clock=clock, export_dir=tmp_path)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=5)
    _job(core, clock, 4, 2, sim)
    iid = core.take_actions()[0].incident_id
    for _ in range(2):
        clock.advance(1.0)
        core.tick()
    core.write_incident(iid)
    assert [a.kind for a in core.take_actions()][-1] is ActionKind.TERMINATE
    for r in range(4):  # RankscopeTerminated ends every rank with a non-zero status
        core.on_rank_lost(sim.job, r, 3, 1, "exited")
    assert core.tick() == [] and len(core.incidents()) == 1
    again = CoordinatorCore({}, clock=clock, export_dir=tmp_path)  # also after a restart
    assert sim.job in again.terminated_jobs
    again.on_register(sim.job, 0, {"world_size": 4, "pid": 4242})  # a new run reusing the job id
    assert sim.job not in again.terminated_jobs


def test_after_a_resume_the_next_incident_waits_for_a_real_pause(tmp_path) -> None:
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "export"}, clock=clock, export_dir=tmp_path)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=6)
    _job(core, clock, 3, 1, sim)
    iid = core.take_actions()[0].incident_id
    for r in range(4):
        core.on_heartbeat(sim.job, r, 3, "paused")
        core.on_bundle(iid, r, f"b{r}")
    core.tick()
    core.tick()
    core.write_incident(iid)
    assert [a.kind for a in core.take_actions()][-1] is ActionKind.RESUME
    batches = sim.batches(3)
    batches[2].crc32[sim.column("Sentinel.param.layer0.")] ^= 4
    feed_step(core, clock, batches)  # a second incident, before any heartbeat said "running"
    assert [a.kind for a in core.take_actions()] == [ActionKind.PAUSE]
    assert [i["state"] for i in core.incidents()] == ["resumed", "pausing"]


def test_restart_in_the_middle_of_an_export_still_waits_for_every_bundle(tmp_path) -> None:
    # After a restart no rank has been seen yet; the incident's own snapshot of the ranks
    # at the pause must keep it waiting instead of declaring the export complete at once.
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock, export_dir=tmp_path)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=4)
    _job(core, clock, 4, 1, sim)
    iid = core.take_actions()[0].incident_id
    clock.advance(core.settings.pause_timeout_s)
    core.tick()
    assert [a.kind for a in core.take_actions()] == [ActionKind.EXPORT]
    core.on_bundle(iid, 2, "/x/rank_2")

    again = CoordinatorCore({}, clock=clock, export_dir=tmp_path)
    again.tick()
    assert again.incidents()[0]["state"] == "exporting" and again.take_actions() == []
    for r in (0, 1, 3):
        again.on_bundle(iid, r, f"/x/rank_{r}")
    again.tick()
    assert [a.kind for a in again.take_actions()] == [ActionKind.WRITE_INCIDENT]
