"""StepAligner: keys by (group, step, name, call index), completion, deadlines, memory bound."""
from __future__ import annotations

import numpy as np
import pytest
from logic_helpers import FakeClock, feed_step

from rankscope.config.cluster import parse_cluster
from rankscope.coordinator.logic.align.aligner import RankState, StepAligner
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.wire.records import Kind, NameTable, StepBatchBuilder


def _batch(table: NameTable, rank: int, step: int, records: list[tuple[str, Kind, float]], job: str = "j"):
    bld = StepBatchBuilder(table)
    for name, kind, val in records:
        bld.add(name, kind, (val, -val, val / 2, abs(val)), numel=4)
    return bld.build(job, rank, step)


def test_records_align_by_name_not_by_each_ranks_local_id() -> None:
    al = StepAligner(parse_cluster({}))
    t0, t1 = NameTable(), NameTable()
    # Rank 1 meets the names in another order, so its local ids differ from rank 0's.
    al.ingest(_batch(t0, 0, 0, [("a", Kind.PARAM, 1.0), ("b", Kind.PARAM, 2.0)]), 0.0)
    al.ingest(_batch(t1, 1, 0, [("b", Kind.PARAM, 2.0), ("a", Kind.PARAM, 1.0)]), 0.0)
    [(_, view)] = al.ready(0.0)
    col_a, col_b = view.keys.names.index("a"), view.keys.names.index("b")
    assert view.stats[:, col_a, 0].tolist() == [1.0, 1.0]
    assert view.stats[:, col_b, 0].tolist() == [2.0, 2.0]
    assert view.exec[:, col_a].tolist() == [0, 1]  # execution order is each rank's own


def test_a_name_recorded_twice_in_a_step_gets_a_column_per_call() -> None:
    al = StepAligner(parse_cluster({}))
    t = NameTable()
    al.ingest(_batch(t, 0, 0, [("Cell.f", Kind.FORWARD, 1.0), ("Cell.f", Kind.FORWARD, 5.0)]), 0.0)
    [(_, view)] = al.ready(0.0)
    assert view.keys.names == ["Cell.f", "Cell.f#1"]
    assert view.stats[0, :, 0].tolist() == [1.0, 5.0]
    # Next step reuses both columns (the cached layout must keep the call index).
    al.ingest(_batch(t, 0, 1, [("Cell.f", Kind.FORWARD, 2.0), ("Cell.f", Kind.FORWARD, 6.0)]), 0.0)
    [(_, view)] = al.ready(0.0)
    assert view.stats[0, :, 0].tolist() == [2.0, 6.0]


def test_step_is_judged_once_every_live_rank_reported() -> None:
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=1)
    for r in range(4):
        core.on_register(sim.job, r, {"world_size": 4})
    batches = sim.batches(0)
    for b in batches[:3]:
        core.on_step(b)
    core.tick()
    assert core.status()["counters"]["steps_judged"] == 0
    assert core.status()["pending_steps"] == 1
    core.on_step(batches[3])
    assert core.tick() == []
    assert core.status()["counters"]["steps_judged"] == 1
    assert core.status()["pending_steps"] == 0


def test_world_size_makes_unregistered_ranks_awaited_then_a_deadline_finding() -> None:
    clock = FakeClock()
    core = CoordinatorCore({"deadline_s": 5.0}, clock=clock)
    sim = SyntheticTraining(ranks=3, tensors=16, seed=2)
    core.on_register(sim.job, 0, {"world_size": 4})  # rank 3 never shows up
    for b in sim.batches(0):
        core.on_step(b)
    assert core.tick() == []
    clock.advance(5.0)
    [v] = core.tick()
    assert (v.detector, v.rank, v.step) == ("progress", 3, 0)
    assert core.status()["jobs"][sim.job]["ranks"]["3"]["state"] == "stalled"


def test_lone_dp_workers_await_the_servers_dp_size_before_their_first_batch() -> None:
    # Serving workers are each rank 0 of a world of 1 and start seconds apart: without the
    # DP size the first worker's batch 0 would be judged alone, and a drifted worker that
    # registers later would be compared from batch 1 on, never at its first batch.
    clock = FakeClock()
    core = CoordinatorCore({"groups": "replicas"}, clock=clock)
    sim = SyntheticTraining(ranks=3, tensors=8, seed=4)
    batches = sim.batches(0)
    core.on_register(sim.job, 0, {"world_size": 1, "dp_index": 0, "dp_size": 3})
    core.on_step(batches[0])
    clock.advance(1.0)
    assert core.tick() == [] and core.status()["counters"]["steps_judged"] == 0
    for r in (1, 2):
        core.on_register(sim.job, r, {"world_size": 1, "dp_index": r, "dp_size": 3})
        core.on_step(batches[r])
    core.tick()
    assert core.status()["counters"]["steps_judged"] == 1
    assert core.aligner.counters["late_records"] == 0


def test_expected_world_is_the_world_size_unless_a_lone_worker_names_its_dp_size() -> None:
    from rankscope.coordinator.logic.align.aligner import expected_world
    assert expected_world({"world_size": 8}) == 8
    assert expected_world({"world_size": 1, "dp_size": 4}) == 4
    assert expected_world({"dp_size": 4}) == 4
    assert expected_world({"world_size": 2, "dp_size": 4}) == 2  # TP inside each DP worker: its own world
    assert expected_world({"world_size": 1, "dp_size": 1}) == 1
    assert expected_world({}) is None


def test_late_records_and_unknown_names_are_counted_not_mixed_in() -> None:
    al = StepAligner(parse_cluster({}))
    t = NameTable()
    al.ingest(_batch(t, 0, 0, [("a", Kind.LOSS, 1.0)]), 0.0)
    al.ready(0.0)
    al.ingest(_batch(t, 0, 0, [("a", Kind.LOSS, 9.0)]), 0.0)  # step 0 was already judged
    assert al.counters["late_records"] == 1
    b = _batch(t, 0, 1, [("b", Kind.LOSS, 1.0)])
    b.new_names = {}  # the name table was lost on the way
    al.ingest(b, 0.0)
    assert al.counters["unknown_name_records"] == 1
    [(_, view)] = al.ready(0.0)
    assert not view.present.any()


def test_pending_steps_stay_bounded_when_a_rank_falls_behind() -> None:
    clock = FakeClock()
    core = CoordinatorCore({"max_pending_steps": 8, "detectors": {"progress": {"lag_steps": None}}}, clock=clock)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=3)
    for r in range(4):
        core.on_register(sim.job, r, {"world_size": 4})
    found = []
    for step in range(50):
        for b in sim.batches(step)[:3]:  # rank 3 is stuck at step 0, still "running"
            core.on_step(b)
        found += core.tick()
        assert core.status()["pending_steps"] <= 9
    assert [(v.detector, v.rank, v.step) for v in found] == [("progress", 3, 0)]


def test_pending_memory_stays_bounded_when_a_rank_falls_behind() -> None:
    # 4 ranks x 16 tensors: one slot is about 4.8 KB; a 0.02 MiB bound holds 4 of them.
    clock = FakeClock()
    core = CoordinatorCore({"max_pending_mb": 0.02, "detectors": {"progress": {"lag_steps": None}}}, clock=clock)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=3)
    for r in range(4):
        core.on_register(sim.job, r, {"world_size": 4})
    found, held = [], []
    for step in range(30):
        for b in sim.batches(step)[:3]:  # rank 3 is stuck at step 0, still "running"
            core.on_step(b)
        found += core.tick()
        held.append(core.aligner.pending_bytes())
    assert max(held) <= 0.02 * 2**20 + held[0]  # never more than one slot beyond the bound
    assert core.aligner.pending_steps() < 10
    assert [(v.detector, v.rank, v.step) for v in found] == [("progress", 3, 0)]


def test_lost_rank_is_no_longer_awaited() -> None:
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=4)
    for r in range(4):
        core.on_register(sim.job, r, {"world_size": 4})
    for b in sim.batches(0):
        core.on_step(b)
    core.tick()
    core.on_rank_lost(sim.job, 2, 0, -9, "SIGKILL")
    for b in sim.batches(1):
        if b.rank != 2:
            core.on_step(b)
    found = core.tick()
    assert core.status()["counters"]["steps_judged"] == 2
    clock.advance(0.6)  # deaths are judged once the launcher's teardown had time to report
    found += core.tick()
    assert [(v.detector, v.rank, v.step) for v in found] == [("progress", 2, 1)]


@pytest.mark.parametrize("groups", [[[0, 1, 2, 3], [4, 5, 6, 7]], "dp"])
def test_a_step_waits_for_every_rank_of_the_job_whatever_the_groups(groups) -> None:
    """Listed groups say who is compared with whom, not who is aligned: a NaN crosses
    from one group to another through their collectives, so a step is judged over the job."""
    al = StepAligner(parse_cluster({"groups": groups}))
    sim = SyntheticTraining(ranks=8, tensors=16, seed=5)
    al.register(sim.job, 0, {"world_size": 8})
    batches = sim.batches(0)
    for b in batches[:4]:  # only the first group reports
        al.ingest(b, 0.0)
    assert al.ready(0.0) == []  # still waiting for ranks 4-7
    for b in batches[4:]:
        al.ingest(b, 0.0)
    [(grp, view)] = al.ready(0.0)
    assert (grp.label, view.ranks.tolist()) == (f"{sim.job}/0", list(range(8)))
    if groups != "dp":
        assert view.sets.replica_of.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_rank_state_follows_heartbeats() -> None:
    core = CoordinatorCore({}, clock=FakeClock())
    core.on_heartbeat("j", 0, 3, "paused")
    assert core.aligner.ranks[("j", 0)].state is RankState.PAUSED
    core.on_heartbeat("j", 0, 3, "running")
    assert core.status()["jobs"]["j"]["ranks"]["0"]["state"] == "running"
    assert np.isfinite(core.status()["jobs"]["j"]["ranks"]["0"]["seen_s_ago"])


def test_unranked_batches_and_losses_are_counted_not_aligned() -> None:
    core = CoordinatorCore({}, clock=FakeClock())
    sim = SyntheticTraining(ranks=1, tensors=16, seed=6, first_rank=0)
    [b] = sim.batches(0)
    b.rank = -1
    core.on_steps([b])
    core.on_rank_lost("j", None, -1, None, "exited")
    core.on_heartbeat("j", None, 0, "running")
    assert core.status()["counters"]["unranked_batches"] == 1
    assert core.status()["jobs"] == {} and core.tick() == []


def test_malformed_name_tables_are_refused_without_huge_allocations() -> None:
    al = StepAligner(parse_cluster({}))
    t = NameTable()
    b = _batch(t, 0, 0, [("a", Kind.LOSS, 1.0)])
    b.new_names.update({2**40: "huge id", -3: "negative", "7": "str id", 5: b"bytes"})
    al.ingest(b, 0.0)
    assert al.counters["bad_names"] == 4
    assert al.ranks[("j", 0)].names.key_of.shape[0] < 1 << 20
    [(_, view)] = al.ready(0.0)
    assert view.keys.names == ["a"] and view.present.all()


def test_judged_steps_are_dropped_keeping_one_step_of_history() -> None:
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=9)
    core.series.max_steps = 16
    for step in range(40):
        for b in sim.batches(step):
            core.on_step(b)
        core.tick()
    [grp] = core.aligner.groups.values()
    assert grp.slots == {} and grp.judged_through == 39
    assert grp.prev.step == 39 and grp.prev.prev is None  # one step, not a chain
    series = core.series.to_dict()[grp.label]
    assert series["steps"] == list(range(24, 40)) and len(series["loss"][0]) == 4


def test_a_new_run_reusing_the_job_id_is_aligned_and_judged_from_scratch() -> None:
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    found = []
    for run in range(2):
        sim = SyntheticTraining(ranks=4, tensors=16, seed=10 + run)
        for r in range(4):
            core.on_register(sim.job, r, {"world_size": 4, "pid": 100 * (run + 1) + r})
        for step in range(6 if run == 0 else 3):
            batches = sim.batches(step)
            if step == 2:  # the same fault in both runs: the NaN latch must not hide the second
                batches[run + 1].nan_count[sim.column("Sentinel.grad_local.")] = 1
            found += feed_step(core, clock, batches)
        for r in range(4):
            core.on_rank_finished(sim.job, r)
    assert [(v.detector, v.rank, v.step) for v in found] == [("nan_origin", 1, 2), ("nan_origin", 2, 2)]
    assert core.status()["counters"]["late_records"] == 0


def test_max_lag_is_the_status_lag_of_the_furthest_behind_live_rank() -> None:
    core = CoordinatorCore({})
    t = [NameTable() for _ in range(4)]
    for r in range(4):
        core.on_register("j", r, {"world_size": 4})
    assert core.max_lag() == 0  # registered, no step yet: nobody lags (and nothing raises)
    for r, last in ((0, 5), (1, 2), (2, 4), (3, 0)):
        for s in range(last + 1):
            core.on_step(_batch(t[r], r, s, [("a", Kind.PARAM, 1.0)]))
    core.on_rank_lost("j", 3, 0, 1, "killed")  # a lost rank lags for ever: not counted
    lags = {int(r): v["lag"] for r, v in core.status()["jobs"]["j"]["ranks"].items()}
    assert lags == {0: 0, 1: 3, 2: 1, 3: 5}
    assert core.max_lag() == 3


def test_ranks_sending_the_same_name_table_share_its_columns_but_not_another_ranks_ids() -> None:
    al = StepAligner(parse_cluster({}))
    same = [("a", Kind.PARAM, 1.0), ("b", Kind.PARAM, 2.0)]
    tables = [NameTable(), NameTable(), NameTable()]
    for step in range(2):
        for rank, records in enumerate([same, same, same[::-1]]):
            # Rank 2 names "b" first: the same name ids, 0 and 1, mean other names.
            al.ingest(_batch(tables[rank], rank, step, records), 0.0)
        [(_, view)] = al.ready(0.0)
        col_a, col_b = view.keys.names.index("a"), view.keys.names.index("b")
        assert view.stats[:, col_a, 0].tolist() == [1.0] * 3
        assert view.stats[:, col_b, 0].tolist() == [2.0] * 3
    r0, r1, r2 = (al.ranks[("j", r)] for r in range(3))
    assert len(al.keys["j"].tables) == 2  # two distinct tables learned, each once
    assert r0.names.sig == r1.names.sig != r2.names.sig
    assert r0.layout is r1.layout and r2.layout is not r0.layout


def test_a_malformed_table_is_refused_for_every_rank_that_sends_it() -> None:
    al = StepAligner(parse_cluster({}))
    for rank in range(2):
        b = _batch(NameTable(), rank, 0, [("a", Kind.LOSS, 1.0)])
        b.new_names.update({-3: "negative", 5: b"bytes"})
        al.ingest(b, 0.0)
    assert al.counters["bad_names"] == 4 and not al.keys["j"].tables
    assert all(al.ranks[("j", r)].names.sig is None for r in range(2))
    [(_, view)] = al.ready(0.0)
    assert view.keys.names == ["a"] and view.present.all()
