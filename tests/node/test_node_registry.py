"""Rank registry: deterministic remap of clashing claims (pure logic, a fake clock)."""
from __future__ import annotations

import json
import random

import pytest

from rankscope.node.registry import ProcessState, RankRegistry
from rankscope.wire.rank_map import write_rank_map


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _info(pid, claim, **kw):
    return {"host": "h", "pid": pid, "claimed_rank": claim, **kw}


def _assign(claims, settle=0.5, order=None):
    clock = Clock()
    reg = RankRegistry(settle_s=settle, clock=clock)
    items = list(claims)
    for i in order or range(len(items)):
        pid, claim, kw = items[i]
        reg.claim(f"id{pid}".encode(), "j", _info(pid, claim, **kw))
    assert reg.due() == []  # nobody is answered inside the settle window
    clock.t = settle
    done = reg.due()
    return reg, {e.pid: e.assigned_rank for e in done}


def test_distinct_claims_are_kept():
    _, got = _assign([(10, 0, {}), (11, 1, {}), (12, 2, {})])
    assert got == {10: 0, 11: 1, 12: 2}


def test_all_claim_zero_ordered_by_dp_index_not_arrival():
    claims = [(30, 0, {"dp_index": 2}), (10, 0, {"dp_index": 1}), (20, 0, {"dp_index": 0})]
    results = set()
    for _ in range(5):
        order = random.sample(range(3), 3)
        _, got = _assign(claims, order=order)
        results.add(tuple(sorted(got.items())))
    assert results == {((10, 1), (20, 0), (30, 2))}


def test_lone_dp_workers_take_their_dp_index_however_late_they_register():
    # Workers of a DP server each say rank 0 in a world of 1; they register seconds apart.
    clock = Clock()
    reg = RankRegistry(settle_s=0.3, clock=clock)
    got = {}
    for pid, dp in ((30, 2), (10, 1), (20, 0)):  # the server started them in reverse
        reg.claim(f"id{pid}".encode(), "j", _info(pid, 0, dp_index=dp, world_size=1))
        clock.t += 5.0
        got.update({e.pid: (e.assigned_rank, e.remapped) for e in reg.due()})
    assert got == {30: (2, True), 10: (1, True), 20: (0, False)}


def test_dp_index_only_orders_ranks_of_a_larger_world():
    # Tensor-parallel ranks inside DP workers keep their claims; the index orders clashes only.
    _, got = _assign([(1, 1, {"dp_index": 3, "world_size": 8}), (2, 0, {"dp_index": 3, "world_size": 8})])
    assert got == {1: 1, 2: 0}
    _, got = _assign([(5, 0, {"dp_index": 1, "world_size": 4}), (6, 0, {"dp_index": 0, "world_size": 4})])
    assert got == {6: 0, 5: 1}


def test_device_id_then_pid_break_ties():
    _, got = _assign([(5, 0, {"device_id": 3}), (6, 0, {"device_id": 1}), (4, 0, {}), (3, 0, {})])
    # device 1 keeps the claim; then device 3; then the ones without placement, by pid
    assert got == {6: 0, 5: 1, 3: 2, 4: 3}


def test_fresh_ids_skip_ids_that_others_claim():
    # Two claim 0, one claims 1: the second claimant of 0 must not take 1.
    _, got = _assign([(1, 0, {"device_id": 0}), (2, 0, {"device_id": 1}), (3, 1, {})])
    assert got == {1: 0, 3: 1, 2: 2}


def test_late_clash_gets_a_fresh_id_and_answered_ids_are_never_taken_back():
    reg, got = _assign([(1, 0, {"device_id": 5})])
    assert got == {1: 0}
    clock = reg._clock
    reg.claim(b"late", "j", _info(2, 0, device_id=0))  # sorts first, but 0 was already answered
    clock.t += 1.0
    late = reg.due()
    assert [(e.pid, e.assigned_rank, e.remapped) for e in late] == [(2, 1, True)]


def test_dead_holder_frees_its_claim_but_fresh_ids_never_reuse_it():
    reg, got = _assign([(1, 0, {}), (2, 0, {})])
    assert got == {1: 0, 2: 1}
    reg.lose(next(e for e in reg.entries() if e.pid == 2), -9, "exited")
    reg.lose(next(e for e in reg.entries() if e.pid == 1), -9, "exited")
    reg.claim(b"r0", "j", _info(3, 0))  # a restarted rank 0 takes its id back
    reg.claim(b"r0b", "j", _info(4, 0))  # a clash: the fresh id skips 1 (a dead rank's folder)
    reg._clock.t += 1.0
    assert {e.pid: e.assigned_rank for e in reg.due()} == {3: 0, 4: 2}


def test_reregistration_returns_the_same_entry():
    reg, _ = _assign([(1, 7, {})])
    e = reg.claim(b"new-identity", "j", _info(1, 7))
    assert e.state is ProcessState.LIVE and e.assigned_rank == 7 and e.identity == b"new-identity"
    assert reg.by_identity(b"new-identity") is e


def test_complete_world_is_answered_without_waiting():
    reg = RankRegistry(settle_s=100.0, clock=Clock())
    reg.claim(b"a", "j", _info(1, 0, world_size=2))
    assert reg.due() == []
    reg.claim(b"b", "j", _info(2, 1, world_size=2))
    assert sorted(e.assigned_rank for e in reg.due()) == [0, 1]


def test_jobs_are_independent():
    clock = Clock()
    reg = RankRegistry(settle_s=0.1, clock=clock)
    reg.claim(b"a", "j1", _info(1, 0))
    reg.claim(b"b", "j2", _info(2, 0))
    clock.t = 1
    assert sorted((e.job, e.assigned_rank) for e in reg.due()) == [("j1", 0), ("j2", 0)]


def test_rank_map_rows_and_atomic_file(tmp_path):
    reg, _ = _assign([(1, 0, {"device_id": 0}), (2, 0, {"device_id": 1})])
    rows = reg.rank_map("j")
    assert [(r["claimed_rank"], r["assigned_rank"], r["device_id"], r["remapped"]) for r in rows] == \
        [(0, 0, 0, False), (0, 1, 1, True)]
    path = write_rank_map(tmp_path / "x" / "rank_map.json", rows)
    assert json.loads(path.read_text())["entries"] == rows
    assert [p.name for p in path.parent.iterdir()] == ["rank_map.json"]  # no temp left behind


def test_rank_map_label_is_the_folder_the_assigned_id_names():
    reg, _ = _assign([(2764, 0, {"label": "proc2764", "dp_index": 1}), (2765, 0, {"label": "proc2765",
                                                                                  "dp_index": 0})])
    rows = {r["pid"]: r for r in reg.rank_map("j")}
    assert (rows[2765]["label"], rows[2765]["claimed_label"]) == ("rank0", "proc2765")
    assert (rows[2764]["label"], rows[2764]["claimed_label"]) == ("rank1", "proc2764")


def test_every_rank_map_is_one_document_shape(tmp_path):
    from rankscope.wire.rank_map import FORMAT, rank_map_document, rank_map_entries
    reg, _ = _assign([(1, 0, {}), (2, 0, {})])
    rows = reg.rank_map("j")
    doc = json.loads(write_rank_map(tmp_path / "rank_map.json", rows).read_text())
    assert doc == rank_map_document(rows) == {"format": FORMAT, "entries": rows}
    assert rank_map_entries(doc) == rows
    assert rank_map_entries(rows) == rows  # a bare list (incidents written before) still reads
    assert rank_map_entries(None) == [] and rank_map_entries({"format": FORMAT}) == []


def test_negative_settle_is_rejected():
    with pytest.raises(ValueError, match="settle_s"):
        RankRegistry(settle_s=-1)


def test_rank_that_re_registers_after_an_agent_restart_keeps_its_id():
    # Before the restart pid 2 (claim 0) had been given 1. A new agent registry sees both
    # again; pid 2 asks for 1 (its id in use) and must get it back, still marked remapped.
    clock = Clock()
    reg = RankRegistry(settle_s=0.1, clock=clock)
    reg.claim(b"b", "j", _info(2, 0, dp_index=0, assigned_rank=1))
    reg.claim(b"a", "j", _info(1, 0, dp_index=1, assigned_rank=0))
    clock.t = 1
    got = {e.pid: (e.assigned_rank, e.remapped) for e in reg.due()}
    assert got == {1: (0, False), 2: (1, True)}


def test_preferred_id_zero_is_honoured():
    clock = Clock()
    reg = RankRegistry(settle_s=0.1, clock=clock)
    reg.claim(b"a", "j", _info(1, 0, dp_index=5, assigned_rank=0))
    reg.claim(b"b", "j", _info(2, 0, dp_index=0, assigned_rank=1))
    clock.t = 1
    assert {e.pid: e.assigned_rank for e in reg.due()} == {1: 0, 2: 1}


@pytest.mark.parametrize("end, reused", [("finish", False), ("lose", True)])
def test_a_finished_rank_keeps_its_id_a_lost_one_can_be_restarted(end, reused):
    # A DP worker that finished cleanly still owns its dump folder: a late sibling that
    # also says rank 0 must not get it. A crashed rank's restart takes its id back.
    clock = Clock()
    reg = RankRegistry(settle_s=0.5, clock=clock)
    first = reg.claim(b"a", "j", _info(10, 0))
    clock.t = 0.5
    assert [e.assigned_rank for e in reg.due()] == [0]
    if end == "finish":
        reg.finish(first)
    else:
        reg.lose(first, -9, "killed")
    reg.claim(b"b", "j", _info(11, 0))
    clock.t = 1.0
    (late,) = reg.due()
    assert (late.assigned_rank == 0) is reused
    assert late.remapped is (not reused)
