"""Job-wide rank ids decided by the coordinator, across node agents."""
from __future__ import annotations

from rankscope.coordinator.logic.job.identities import JobIdentities, merge_rank_maps


def test_dp_workers_all_claiming_zero_on_two_hosts_get_ids_0_to_n_minus_1():
    ids = JobIdentities()
    # Each host's agent made its own two workers unique (0, 1): the hosts clash.
    got = [ids.assign("j", host, pid, proposed)
           for host, pid, proposed in (("node0", 10, 0), ("node0", 11, 1), ("node1", 10, 0), ("node1", 11, 1))]
    assert got == [0, 1, 2, 3]
    assert ids.holder("j", 2) == ("node1", 10)


def test_distinct_proposals_are_kept_and_a_process_registering_again_gets_its_id_back():
    ids = JobIdentities()
    assert [ids.assign("j", "node1", 7, 3), ids.assign("j", "node0", 5, 0)] == [3, 0]
    assert ids.assign("j", "node1", 7, 3) == 3  # agent reconnect: same process, same id
    assert ids.assign("j", "node0", 6, 3) == 1  # clash: the lowest id nobody holds
    assert ids.assign("other", "node0", 6, 3) == 3  # jobs are separate


def test_a_lost_rank_id_goes_to_its_restart_but_a_finished_one_is_never_reused():
    ids = JobIdentities()
    ids.assign("j", "node0", 1, 0)
    ids.assign("j", "node1", 2, 1)
    ids.lose("j", 1)
    assert ids.assign("j", "node1", 3, 1) == 1  # the restart takes over
    assert ids.assign("j", "node0", 4, 0) == 2  # rank 0 is alive (or finished): fresh id
    assert ids.assign("j", "node1", 2, 1) == 3  # the dead process is no longer its holder


def test_a_lost_id_is_never_taken_by_another_hosts_process():
    """Four DP workers all proposing 0, two a host: host 0's first one ends (its agent
    reports it lost) before host 1's first one registers. Each still gets its own id."""
    ids = JobIdentities()
    assert ids.assign("j", "node0", 10, 0) == 0
    assert ids.assign("j", "node0", 11, 1) == 1
    ids.lose("j", 0)
    assert ids.assign("j", "node1", 10, 0) == 2
    assert ids.assign("j", "node1", 11, 1) == 3
    assert ids.holder("j", 0) == ("node0", 10)
    assert ids.assign("j", "node0", 12, 0) == 0  # its own host's restart still takes it over


def test_rank_maps_of_several_agents_merge_into_one_job_wide_map():
    a = [{"host": "node0", "pid": 1, "assigned_rank": 1}, {"host": "node0", "pid": 2, "assigned_rank": 0}]
    b = [{"host": "node1", "pid": 1, "assigned_rank": 2}]
    merged = merge_rank_maps(merge_rank_maps([], a), b)
    assert [(r["host"], r["assigned_rank"]) for r in merged] == [("node0", 0), ("node0", 1), ("node1", 2)]
    again = merge_rank_maps(merged, [{"host": "node0", "pid": 1, "assigned_rank": 1, "state": "lost"}])
    assert len(again) == 3 and again[1]["state"] == "lost"
