"""A job stopped from outside (every rank SIGTERMed at once) names nobody; a real failure
inside such a stop still does (scripted clocks, no processes)."""
from __future__ import annotations

import signal

from test_failures import T0, lost, make, settle, sync

from rankscope.coordinator.logic.views.coverage import describe
from rankscope.wire.sync import IN, OUT


def test_every_worker_sigtermed_at_once_is_a_stop_with_no_verdict():
    # A server terminating its idle workers one after another at its own exit.
    core, clock, _ = make(world=3)
    for r in range(3):
        core.on_heartbeat("j", r, 1, "running", started=2)
    for r in (2, 0, 1):
        lost(core, r, T0 + 0.1 * r, sig=signal.SIGTERM, last_step=1)
    assert settle(core, clock) == []
    assert settle(core, clock, dt=5.0) == []  # and no verdict later either
    report = core.coverage_report("j")
    assert report["stopped"] == {"ranks": [0, 1, 2], "signal": "SIGTERM", "after_step": 1}
    assert "3 ranks (0-2) stopped together from outside by SIGTERM after step 1 (no rank failed first)" \
        in describe(report)


def test_a_rank_that_failed_before_the_stop_signals_is_still_the_cause():
    core, clock, _ = make()
    lost(core, 3, T0, status=1, exception="RuntimeError: bad batch")
    for r in (0, 1, 2):
        lost(core, r, T0 + 0.2, sig=signal.SIGTERM)
    [v] = settle(core, clock)
    assert (v.detector, v.rank) == ("progress", 3)
    assert "stopped" not in core.coverage_report("j")


def test_ctrl_c_during_a_hang_still_names_the_rank_that_never_reached_the_collective():
    # Rank 2 is stuck before step 5's AllReduce; the user gives up and presses Ctrl-C,
    # which the launcher forwards as SIGTERM to every rank at the same instant.
    core, clock, _ = make()
    for r in (0, 1, 3):
        core.on_heartbeat("j", r, 4, "running", sync(5, IN, T0 - 30))
    for r in range(4):
        point = sync(4, OUT, T0 - 31) if r == 2 else sync(5, IN, T0 - 30)
        lost(core, r, T0 + r / 1000, sig=signal.SIGTERM, sync_point=point)
    [v] = settle(core, clock)
    assert (v.rank, v.step) == (2, 5) and v.evidence["collective"]["never_entered"] == [2]


def test_some_ranks_sigtermed_while_others_run_on_is_judged_as_a_failure():
    core, clock, _ = make()
    for r in (0, 1):
        lost(core, r, T0 + r / 100, sig=signal.SIGTERM)
    [v] = settle(core, clock)
    assert v.rank == 0 and v.ties == [1]
    assert "stopped" not in core.coverage_report("j")


def test_a_lone_sigkill_is_never_a_stop():
    core, clock, _ = make(world=1)
    lost(core, 0, T0, sig=signal.SIGKILL)
    [v] = settle(core, clock)
    assert v.rank == 0 and "SIGKILL" in v.evidence["manner"]
