"""Crashes and hangs judged on one clock: the first failure is named, the ranks taken down
with it are its followers (pure logic, scripted clocks, no processes)."""
from __future__ import annotations

import signal

from logic_helpers import FakeClock

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.wire.sync import IN, OUT, SyncPoint

T0 = 1.7e9  # wall clock of the first failure


def make(world: int = 4, **cluster):
    clock, wall = FakeClock(), FakeClock(T0)
    core = CoordinatorCore({"on_divergence": "export", **cluster}, clock=clock, wall_clock=wall)
    for r in range(world):
        core.on_register("j", r, {"world_size": world, "host": "h", "pid": 100 + r})
        core.on_heartbeat("j", r, 0, "running")
    return core, clock, wall


def sync(step: int, phase: str, at: float, seq: int = 0, what: str = "AllReduce") -> SyncPoint:
    return SyncPoint(what, step, seq, phase, at)


def lost(core, rank, died_at, *, status=None, sig=None, sync_point=None, exception=None, last_step=4):
    core.on_rank_lost("j", rank, last_step, status if sig is None else -sig, "exited", died_at=died_at,
                      signal=sig, exception=exception, sync=sync_point)


def settle(core, clock, dt: float = 0.6):
    clock.advance(dt)
    return core.tick()


def test_exit_at_step_start_names_the_rank_and_step_the_launcher_kills_are_followers():
    core, clock, _ = make()
    for r in (0, 1, 3):  # the others finished step 5 and wait in step 6's AllReduce
        core.on_heartbeat("j", r, 5, "running", sync(6, IN, T0 - 0.2))
    # Reports may arrive in any order; the times decide.
    lost(core, 1, T0 + 0.9, sig=signal.SIGKILL, sync_point=sync(6, IN, T0 - 0.2))
    lost(core, 2, T0, status=137, sync_point=sync(5, OUT, T0 - 0.3), last_step=4)
    lost(core, 0, T0 + 0.8, sig=signal.SIGKILL, sync_point=sync(6, IN, T0 - 0.2))
    lost(core, 3, T0 + 0.95, sig=signal.SIGKILL, sync_point=sync(6, IN, T0 - 0.2))
    assert core.tick() == []  # still settling
    [v] = settle(core, clock)
    assert (v.detector, v.rank, v.step, v.ties) == ("progress", 2, 6, [])
    ev = v.evidence
    assert ev["exit_status"] == 137 and ev["signal"] is None and ev["manner"] == "exited with status 137"
    assert [(f["rank"], f["delay_s"], f["signal"]) for f in ev["followers"]] == \
        [(0, 0.8, "SIGKILL"), (1, 0.9, "SIGKILL"), (3, 0.95, "SIGKILL")]
    assert ev["collective"]["never_entered"] == [2] and ev["collective"]["entered"] == [0, 1, 3]


def test_a_rank_killed_mid_step_before_its_allreduce_is_named_at_that_step():
    core, clock, _ = make()
    lost(core, 1, T0, sig=signal.SIGKILL, sync_point=sync(4, OUT, T0 - 0.5), last_step=3)
    for r in (0, 2, 3):
        lost(core, r, T0 + 0.7 + r / 100, sig=signal.SIGKILL, sync_point=sync(5, IN, T0 - 0.1))
    [v] = settle(core, clock)
    assert (v.rank, v.step) == (1, 5) and sorted(f["rank"] for f in v.evidence["followers"]) == [0, 2, 3]


def test_the_step_a_dead_rank_completed_comes_from_the_collectives_its_peers_reached():
    # Its step-5 records died with it (queued when it exited); the peers reached step 6's
    # AllReduce, so step 5 (whose values every rank reads at its end) is complete everywhere.
    core, clock, _ = make()
    for r in (0, 1, 3):
        core.on_heartbeat("j", r, 5, "running", sync(6, OUT, T0 - 0.4))
    lost(core, 2, T0, status=1, last_step=4)  # no sync point of its own heard
    [v] = settle(core, clock)
    assert (v.rank, v.step) == (2, 6)


def test_peers_inside_the_same_step_say_nothing_about_that_step():
    # Launched asynchronously, step 5's AllReduce may still be waiting for the dead rank.
    core, clock, _ = make()
    for r in (0, 1, 3):
        core.on_heartbeat("j", r, 4, "running", sync(5, OUT, T0 - 0.4))
    lost(core, 2, T0, status=1, sync_point=sync(5, OUT, T0 - 0.4), last_step=4)
    [v] = settle(core, clock)
    assert (v.rank, v.step) == (2, 5)


def test_an_uncaught_exception_is_named_with_what_the_rank_said():
    core, clock, _ = make()
    lost(core, 3, T0, status=1, exception="ValueError('bad batch')", sync_point=sync(4, OUT, T0 - 1))
    lost(core, 0, T0 + 0.6, sig=signal.SIGKILL, sync_point=sync(5, IN, T0 - 0.5))
    [v] = settle(core, clock)
    assert (v.rank, v.step) == (3, 5)
    assert v.evidence["exception"] == "ValueError('bad batch')" and v.evidence["manner"] == "ValueError('bad batch')"


def test_collective_timeouts_on_the_waiting_ranks_name_the_rank_that_never_came():
    # Rank 2 sleeps before its forward; the others wait in step 5's AllReduce until the
    # collective gives up (30 s on CPU) and they die raising. Rank 0 raising first is a victim.
    core, clock, wall = make()
    core.on_heartbeat("j", 2, 4, "running", sync(4, OUT, T0 - 31))
    for r in (0, 1, 3):
        core.on_heartbeat("j", r, 4, "running", sync(5, IN, T0 - 30))
    lost(core, 0, T0, status=1, exception="RuntimeError('Launch kernel failed, name:Default/AllReduce-op0')",
         sync_point=sync(5, IN, T0 - 30))
    lost(core, 1, T0 + 0.02, status=1, sync_point=sync(5, IN, T0 - 30))
    [v] = settle(core, clock)
    assert (v.rank, v.step) == (2, 5)
    assert v.evidence["reason"] == "hang" and v.evidence["rule"] == "never reached AllReduce #0 of step 5"
    assert [f["rank"] for f in v.evidence["followers"]] == [0, 1]
    assert v.evidence["collective"]["waiting_since"] == T0 - 30


def test_a_hang_with_nobody_dead_is_named_after_the_hang_timeout_and_only_once():
    core, clock, wall = make(hang_timeout_s=20)
    core.on_heartbeat("j", 1, 7, "running", sync(7, OUT, T0))
    for r in (0, 2, 3):
        core.on_heartbeat("j", r, 7, "running", sync(8, IN, T0 + 0.1))
    wall.t = T0 + 19
    clock.advance(19)  # both clocks move: the hang scan runs a few times a second, not every tick
    assert core.tick() == []
    wall.t = T0 + 20.2
    clock.advance(1.2)
    [v] = core.tick()
    assert (v.rank, v.step, v.evidence["reason"]) == (1, 8, "hang")
    assert v.urgent
    [inc] = core.incidents()  # a hang: the export does not wait for a pause that cannot come
    assert inc["state"] == "exporting" and "exported at once" in inc["cut"]["not_waited_for"]
    assert inc["cut"]["partial"] == {}
    wall.t = T0 + 40
    clock.advance(19.8)
    assert core.tick() == []


def test_a_waiting_rank_is_not_a_hang_before_its_peer_is_late_enough():
    core, clock, wall = make(hang_timeout_s=20)
    for r in range(4):
        core.on_heartbeat("j", r, 3, "running", sync(3, OUT, T0))
    core.on_heartbeat("j", 0, 3, "running", sync(4, IN, T0 + 1))
    wall.t = T0 + 10
    assert core.tick() == []


def test_without_sync_points_the_earliest_death_is_named():
    core, clock, _ = make()
    lost(core, 3, T0 + 0.4, sig=signal.SIGKILL)
    lost(core, 1, T0, status=1)
    [v] = settle(core, clock)
    assert (v.rank, [f["rank"] for f in v.evidence["followers"]]) == (1, [3])


def test_deaths_in_the_teardown_after_the_verdict_are_followers_not_new_findings():
    core, clock, _ = make()
    lost(core, 2, T0, status=137, sync_point=sync(3, OUT, T0 - 1))
    [v] = settle(core, clock)
    lost(core, 0, T0 + 1.5, sig=signal.SIGKILL, sync_point=sync(4, IN, T0 - 0.5))
    assert settle(core, clock) == []
    assert [f["rank"] for f in v.evidence["followers"]] == [0]
    inc = core.documents()[0]
    assert inc["first_diverging_rank"] == 2


def test_a_crash_incident_exports_without_waiting_for_a_pause():
    core, clock, _ = make(on_divergence="pause")
    lost(core, 2, T0, status=137)
    settle(core, clock)
    actions = core.take_actions()
    # Stacks first (the named rank first), and the export does not wait for ranks that cannot pause.
    assert [a.kind.value for a in actions] == ["pause", "stacks", "export"]
    assert actions[1].detail["ranks"] == [2, 0, 1, 3]
    assert core.incidents()[0]["state"] == "exporting"


def test_the_incident_snapshot_says_how_each_rank_ended():
    core, clock, _ = make()
    lost(core, 2, T0, status=137, sync_point=sync(5, OUT, T0 - 0.3))
    lost(core, 0, T0 + 0.5, sig=signal.SIGKILL)
    settle(core, clock)
    ranks = core.documents()[0]["ranks"]
    assert ranks["2"]["exit_status"] == 137 and ranks["2"]["died_at"] == T0
    assert ranks["0"]["signal"] == signal.SIGKILL and ranks["1"]["state"] == "running"


def test_a_serving_worker_killed_mid_decode_is_named_with_its_request_batch_and_token():
    # DP inference: no collectives, one step per request batch. The node agent read the
    # dead worker's position file: it had begun batch 3 and was inside forward call 2;
    # its batch-2 records never arrived (last_step 1).
    core, clock, _ = make(world=3)
    for r in (0, 2):
        core.on_heartbeat("j", r, 2, "running", started=3)
    core.on_rank_lost("j", 1, 1, -signal.SIGKILL, "exited", died_at=T0, signal=signal.SIGKILL, position=(3, 2))
    [v] = settle(core, clock)
    assert (v.detector, v.rank, v.step, v.token) == ("progress", 1, 3, 2)
    assert "SIGKILL" in v.evidence["manner"] and "token 2" in v.evidence["manner"]
    assert [(o["rank"], o["state"], o["started"]) for o in v.evidence["others"]] == [(0, "running", 3),
                                                                                    (2, "running", 3)]


def test_a_training_rank_whose_last_steps_records_died_with_it_is_named_at_the_step_it_began():
    # os._exit right after finishing step 5: its step-5 records were still queued in the
    # rank (the agent saw step 4 last), but at the step boundary it wrote that it began 6.
    core, clock, _ = make(world=2)
    core.on_heartbeat("j", 0, 5, "running", started=6)
    core.on_rank_lost("j", 1, 4, 137, "exited", died_at=T0, position=(6, None))
    [v] = settle(core, clock)
    assert (v.rank, v.step, v.token) == (1, 6, None)
    assert v.evidence["manner"] == "exited with status 137"


def test_a_position_from_an_older_step_gives_no_token():
    core, clock, _ = make(world=2)
    core.on_heartbeat("j", 0, 6, "running", started=7)
    core.on_rank_lost("j", 1, 5, 1, "exited", died_at=T0, position=(4, 7))
    [v] = settle(core, clock)
    assert (v.step, v.token) == (6, None)
    assert v.evidence["manner"] == "exited with status 1"
    [other] = v.evidence["others"]
    assert {k: other[k] for k in ("rank", "state", "last_step", "started")} == \
        {"rank": 0, "state": "running", "last_step": -1, "started": 7}


def test_the_others_state_says_how_long_before_the_death_it_was_heard():
    # The ingest clock (last heard) and the wall clock (deaths) are different clocks: the
    # age is taken across them, so a rank heard 1.7 s before the death reads 1.7.
    core, clock, wall = make(world=3)

    def later(dt: float) -> None:
        clock.advance(dt)
        wall.advance(dt)
    core.on_heartbeat("j", 0, 2, "running", started=3)
    later(1.5)
    core.on_heartbeat("j", 2, 2, "running", started=3)
    later(0.2)
    core.on_rank_lost("j", 1, 1, -signal.SIGKILL, "exited", died_at=wall(), signal=signal.SIGKILL)
    later(0.6)
    [v] = core.tick()
    assert {o["rank"]: o["heard_s"] for o in v.evidence["others"]} == {0: 1.7, 2: 0.2}


def test_a_rank_taken_down_after_the_cause_was_alive_when_the_cause_died():
    # Its state at judging is "lost"; its follower delay says it was alive when the cause died.
    core, clock, _ = make(world=3)
    for r in (0, 2):
        core.on_heartbeat("j", r, 4, "running", started=5)
    core.on_rank_lost("j", 1, 4, 1, "exited", died_at=T0)
    core.on_rank_lost("j", 0, 4, -signal.SIGTERM, "exited", died_at=T0 + 0.4, signal=signal.SIGTERM)
    [v] = settle(core, clock)
    assert v.rank == 1
    # The verdict line reads each other rank's delay from here (launch.progress).
    assert {f["rank"]: f["delay_s"] for f in v.evidence["followers"]} == {0: 0.4}
    assert {o["rank"] for o in v.evidence["others"]} == {0, 2}


def test_a_worker_reaped_by_its_own_parent_is_not_said_to_have_exited():
    # A server that Popens its workers reaps a killed one at once: the node agent finds
    # the pid gone with no status. Neither a kill nor an exit may be claimed.
    core, clock, _ = make(world=3)
    for r in (0, 1):
        core.on_heartbeat("j", r, 0, "running", started=1)
    core.on_rank_lost("j", 2, 0, None, "exited", died_at=T0, position=(1, 3))
    [v] = settle(core, clock)
    assert (v.rank, v.step, v.token) == (2, 1, 3)
    assert v.evidence["manner"].startswith("ended, exit status unknown") and "token 3" in v.evidence["manner"]
    assert v.evidence["signal"] is None and v.evidence["exit_status"] is None


def test_a_victim_whose_last_heartbeat_is_stale_is_not_taken_for_the_rank_that_never_came():
    # Seen under load: rank 2 exits (137) after ending step 5; msrun SIGKILLs the others
    # 50-80 ms later. Rank 1's heartbeats (sync points at most every 0.2 s, later on a busy
    # node) last said step 4's AllReduce while the others said step 5's: by sync points
    # alone rank 1 "never reached" step 5's. Its node agent read that it had begun step 6
    # (so it ended step 5, which needs every rank); so had rank 2, which died first.
    core, clock, _ = make()
    for r in (0, 2, 3):
        core.on_heartbeat("j", r, 4, "running", sync(5, OUT, T0 - 0.3))
    core.on_heartbeat("j", 1, 3, "running", sync(4, OUT, T0 - 0.6))
    core.on_rank_lost("j", 2, 4, 137, "exited", died_at=T0, position=(6, None), sync=sync(5, OUT, T0 - 0.3))
    core.on_rank_lost("j", 1, 3, -signal.SIGKILL, "exited", died_at=T0 + 0.05, signal=signal.SIGKILL,
                      position=(6, None), sync=sync(4, OUT, T0 - 0.6))
    for r in (0, 3):
        core.on_rank_lost("j", r, 4, -signal.SIGKILL, "exited", died_at=T0 + 0.08, signal=signal.SIGKILL,
                          position=(6, None), sync=sync(5, OUT, T0 - 0.3))
    [v] = settle(core, clock)
    assert (v.rank, v.step, v.ties) == (2, 6, [])
    assert v.evidence["manner"] == "exited with status 137"
    assert [f["rank"] for f in v.evidence["followers"]] == [1, 0, 3]
    assert v.evidence["collective"]["never_entered"] == []


def test_a_dead_rank_that_never_began_the_collectives_step_is_still_named_over_earlier_victims():
    # The position lifts only a rank that began a *later* step: one that began step 5 and
    # never reached its AllReduce is the cause even when a peer timed out before it died.
    core, clock, _ = make()
    for r in (0, 2, 3):
        core.on_heartbeat("j", r, 4, "running", sync(5, IN, T0 - 30))
    core.on_heartbeat("j", 1, 4, "running", sync(4, OUT, T0 - 31), started=5)
    lost(core, 0, T0, status=1, sync_point=sync(5, IN, T0 - 30))
    core.on_rank_lost("j", 1, 4, -signal.SIGKILL, "exited", died_at=T0 + 0.5, signal=signal.SIGKILL,
                      position=(5, None), sync=sync(4, OUT, T0 - 31))
    [v] = settle(core, clock)
    assert (v.rank, v.step) == (1, 5)
    assert v.evidence["collective"]["never_entered"] == [1]


def test_a_rank_that_raises_after_the_last_step_is_named_not_a_peer_that_finished_first():
    # GRAPH job, 6 steps: ranks 0, 2, 3 ended normally; rank 0 exited before its sync point
    # of step 5's graph was heard (its last said step 4). Rank 1 then raised in its own
    # post-training code. Rank 0 did not hang anyone: it reported step 5 whole.
    core, clock, _ = make()
    for r in (1, 2, 3):
        core.on_heartbeat("j", r, 5, "running", sync(5, IN, T0 - 0.3, what="graph"))
    core.on_heartbeat("j", 0, 5, "running", sync(4, IN, T0 - 1.2, what="graph"))
    for r in (0, 2, 3):
        core.on_rank_finished("j", r, 5)
    lost(core, 1, T0, status=1, exception="RuntimeError('evaluation failed')", last_step=5)
    [v] = [x for x in settle(core, clock) if x.detector == "progress"]
    assert (v.rank, v.step, v.ties) == (1, 5, [])
    ev = v.evidence
    assert ev["after_last_step"] == 5 and ev["collective"]["never_entered"] == []
    assert ev["manner"] == "RuntimeError('evaluation failed'), after its last step (5): every other rank had finished there"


def test_a_rank_dying_while_its_peers_go_on_is_named_at_the_step_it_did_not_complete():
    core, clock, _ = make()
    for r in (0, 2):
        core.on_rank_finished("j", r, 5)  # rank 3 still runs (its last steps, a save)
    lost(core, 1, T0, status=1, exception="RuntimeError('x')", last_step=5)
    [v] = [x for x in settle(core, clock) if x.detector == "progress"]
    assert (v.rank, v.step) == (1, 6) and v.evidence["after_last_step"] is None


def _steps_without(core, clock, steps: int, rank: int) -> None:
    """Every rank's steps 0..steps-1, but ``rank``'s last one never arrives."""
    sim = SyntheticTraining(ranks=4, tensors=8, seed=1, job="j")
    for step in range(steps):
        for b in sim.batches(step):
            if not (step == steps - 1 and b.rank == rank):
                core.on_step(b)
        clock.advance(0.5)
        core.tick()


def test_a_rank_stuck_between_compiled_steps_is_named_at_the_step_it_never_reached():
    # GRAPH, zero-code: a step's records leave when the next step begins. Rank 2 left step
    # 3's graph, then slept in its data loading; the others wait in step 4's graph. At
    # step 3's deadline rank 2 is missing from step 3, but the step it did not reach is 4.
    core, clock, _ = make(deadline_s=5.0)
    _steps_without(core, clock, 4, rank=2)
    for r in (0, 1, 3):
        core.on_heartbeat("j", r, 3, "running", sync(4, IN, T0 - 4, what="graph"))
    core.on_heartbeat("j", 2, 2, "running", sync(3, OUT, T0 - 4.5, what="graph"))
    clock.advance(6.0)
    [v] = [x for x in core.tick() if x.detector == "progress"]
    assert (v.rank, v.step, v.ties) == (2, 4, [])
    assert v.evidence["manner"] == "never reached step 4's compiled graph; rank(s) 0, 1, 3 waited there"
    clock.advance(200.0)  # the hang rule does not name it a second time
    assert [x for x in core.tick() if x.detector == "progress"] == []


def test_a_rank_missing_a_step_with_no_collective_to_explain_it_is_named_as_before():
    core, clock, _ = make(deadline_s=5.0)
    _steps_without(core, clock, 2, rank=3)
    clock.advance(6.0)
    [v] = [x for x in core.tick() if x.detector == "progress"]
    assert (v.rank, v.step) == (3, 1) and v.evidence["rule"] == "missing step 1 after 5 s"
