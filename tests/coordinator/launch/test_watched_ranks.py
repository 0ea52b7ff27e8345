"""What launch says at the end about what it watched, and the exit status that follows."""
from __future__ import annotations

import json
import os

from rankscope.coordinator.launch.watched import (
    INCIDENT_EXIT,
    UNWATCHED_EXIT,
    AttachWatch,
    WatchedRanks,
    end_command_now,
    end_of_run_line,
    exit_status,
    launch_exit,
    still_live,
)
from rankscope.wire.attach_report import write_failure

RUNNING = {"state": "running", "step": 5, "pid": 100}


def status(ranks: dict, judged: int | None = 5) -> dict:
    return {"ranks": ranks, "last_judged_step": judged}


def test_all_watched_is_a_clean_run():
    cov = WatchedRanks.of(status({"0": RUNNING, "1": RUNNING, "2": RUNNING, "3": RUNNING}), {})
    line = end_of_run_line(cov, 0, found_divergence=False)
    assert line == "no divergence found in 4 of 4 rank(s) watched (ranks 0-3), steps through 5 compared; " \
                   "command exited with 0"
    assert exit_status(cov, 0, allow_unwatched=False) == 0


def test_no_divergence_names_the_ranks_nothing_was_compared_with():
    """A hybrid job whose layout was not learned: its ranks ran watched, but no check that
    compares ranks could be made, and "no divergence" must not claim it was."""
    st = {**status({str(r): RUNNING for r in range(4)}),
          "jobs": {"j": {"layout": {"line": "not learned: ...", "uncompared": [0, 1, 2, 3]}}}}
    cov = WatchedRanks.of(st, {})
    assert cov.uncompared == [0, 1, 2, 3]
    assert end_of_run_line(cov, 0, found_divergence=False).endswith(
        "; NOT COMPARED: ranks 0-3 (no rank shares their role: the layout line says why); "
        "command exited with 0")


def test_no_divergence_names_the_ranks_whose_watch_could_not_see_everything():
    # Ranks reducing gradients with their own ops.AllReduce: watched, but a local gradient
    # fault cannot be seen. "No divergence" alone would claim more than was looked at.
    blind = {**RUNNING, "watch": {"mode": "PyNative", "how": "hooks", "reason": "no nn.DistributedGradReducer: ..."}}
    seen = {**RUNNING, "watch": {"mode": "PyNative", "how": "hooks", "reason": ""}}
    cov = WatchedRanks.of(status({"0": blind, "1": blind, "2": blind, "3": seen}), {})
    assert cov.partly == [0, 1, 2]
    line = end_of_run_line(cov, 0, found_divergence=False)
    assert line == "no divergence found in 4 of 4 rank(s) watched (ranks 0-3), steps through 5 compared; " \
                   "NOT ALL SEEN on ranks 0-2 (their watch line says what); command exited with 0"
    assert exit_status(cov, 0, allow_unwatched=False) == 0  # watched, only not everything


def test_a_rank_that_failed_to_attach_is_named_and_the_run_is_not_clean():
    failures = {7: {"rank": 2, "pid": 7, "reason": "config field 'x' = 1: bad"}}
    cov = WatchedRanks.of(status({"0": RUNNING, "1": RUNNING}), failures)
    line = end_of_run_line(cov, 0, found_divergence=False)
    assert "2 of 3 rank(s) watched (ranks 0, 1)" in line
    assert "UNWATCHED: rank 2 (failed to attach)" in line
    assert exit_status(cov, 0, allow_unwatched=False) == UNWATCHED_EXIT
    assert exit_status(cov, 0, allow_unwatched=True) == 0
    assert exit_status(cov, 3, allow_unwatched=False) == 3  # the command's own failure wins


def test_a_rank_only_expected_from_the_world_size_is_not_watched():
    # The coordinator lists rank 3 because the others' world size is 4; it never spoke.
    cov = WatchedRanks.of(status({"0": RUNNING, "1": RUNNING, "2": RUNNING,
                              "3": {"state": "expected", "step": -1, "pid": None}}), {})
    assert cov.watched == [0, 1, 2]
    assert "UNWATCHED: rank 3 (never attached)" in end_of_run_line(cov, 0, False)
    assert exit_status(cov, 0, False) == UNWATCHED_EXIT


def test_nothing_watched_never_says_no_divergence():
    cov = WatchedRanks.of(status({}, judged=None), {})
    line = end_of_run_line(cov, 0, found_divergence=False)
    assert "no divergence" not in line and line.startswith("NOTHING WAS WATCHED: no rank attached")
    assert exit_status(cov, 0, False) == UNWATCHED_EXIT


def test_a_restarted_rank_that_attached_later_counts_as_watched():
    cov = WatchedRanks.of(status({"0": RUNNING, "1": RUNNING}), {9: {"rank": 1, "pid": 9, "reason": "x"}})
    assert cov.complete and exit_status(cov, 0, False) == 0


def test_attach_watch_warns_once_per_process(tmp_path):
    warnings: list[str] = []
    watch = AttachWatch(tmp_path, warnings.append)
    assert watch.poll() == []
    path = write_failure(3, "config field 'levle' = 'L0': unknown field",
                         env={"RANKSCOPE_ATTACH_REPORTS": str(tmp_path)})
    assert path is not None and json.loads(path.read_text())["pid"] == os.getpid()
    (tmp_path / "attach-failed-99.json").write_text("{half")  # still being written: skipped
    assert len(watch.poll()) == 1 and watch.poll() == []
    assert len(warnings) == 1
    assert "rank 3 failed to attach and runs UNWATCHED" in warnings[0] and "'levle'" in warnings[0]
    # A script's own debugger raised it: the rank does not run on unwatched.
    (tmp_path / "attach-failed-1234.json").write_text(json.dumps(
        {"rank": 5, "pid": 1234, "host": "h", "reason": "PrecisionDebugger: config field 'task'", "raised": True}))
    watch.poll()
    assert "rank 5 could not attach: the error went to its script" in warnings[-1], warnings


def test_write_failure_outside_launch_is_a_no_op():
    assert write_failure(0, "x", env={}) is None


def test_several_processes_of_one_rank_are_one_unwatched_rank(tmp_path):
    # A rank's data-loader workers import MindSpore too and fail the same way.
    for pid in (11, 12):
        (tmp_path / f"attach-failed-{pid}.json").write_text(json.dumps(
            {"rank": 1, "pid": pid, "host": "h", "reason": "bad"}))
    warnings: list[str] = []
    watch = AttachWatch(tmp_path, warnings.append)
    watch.poll()
    assert len(warnings) == 1 and len(watch.failures) == 2
    cov = WatchedRanks.of(status({"0": RUNNING}), watch.failures)
    assert cov.ranks_text() == "1 of 2 rank(s) watched (rank 0)"


def test_rank_span_shortens_runs():
    from rankscope.text.spans import rank_span
    assert rank_span([3]) == "rank 3"
    assert rank_span([0, 1]) == "ranks 0, 1"
    assert rank_span([5, 0, 1, 2, 3, 9, 10, 11]) == "ranks 0-3, 5, 9-11"


def test_the_end_waits_only_for_ranks_heard_from_and_not_yet_ended():
    ended = {"0": {**RUNNING, "state": "finished"}, "1": {**RUNNING, "state": "lost"}}
    assert still_live(status(ended)) == []
    # rank 2 still running (its death not reported yet); rank 3 only expected, never spoke
    assert still_live(status({**ended, "2": RUNNING, "3": {"state": "expected", "step": -1, "pid": None}})) == [2]
    assert still_live(None) == []


def test_a_terminated_commands_tree_is_ended_once_no_rank_is_left_or_the_grace_is_over():
    lost = {"state": "lost", "step": 3, "pid": 101}
    some_alive = status({"0": RUNNING, "1": lost})
    all_gone = status({"0": dict(lost, pid=100), "1": lost, "2": {"state": "finished", "step": 7, "pid": 102}})
    assert end_command_now(None, 100.0, 10.0, all_gone) is None  # not terminated: never
    assert end_command_now(95.0, 100.0, 10.0, some_alive) is None  # a rank still runs: its grace
    assert "10 s after terminate" in end_command_now(89.0, 100.0, 10.0, some_alive)
    assert "none of its ranks is left" in end_command_now(99.5, 100.0, 10.0, all_gone)
    # No word of the ranks (status unavailable, or none heard from yet): the grace decides.
    assert end_command_now(99.5, 100.0, 10.0, None) is None
    assert end_command_now(99.5, 100.0, 10.0, status({})) is None


def test_the_unwatched_exit_is_announced_only_when_launch_chooses_it(capsys):
    from rankscope.coordinator.launch.runner import Launch
    from rankscope.coordinator.launch.watched import NONE_ATTACHED
    nobody = WatchedRanks.of(status({}), {})
    assert NONE_ATTACHED in end_of_run_line(nobody, 1, found_divergence=False)
    # The command failed (a rank raised on its bad config): its status is the exit, said as such.
    assert Launch._exit(exit_status(nobody, 1, False), 1) == 1
    assert "exit status" not in capsys.readouterr().err
    assert Launch._exit(exit_status(nobody, 0, False), 0) == UNWATCHED_EXIT
    assert f"exit status {UNWATCHED_EXIT}: ranks ran unwatched" in capsys.readouterr().err
    assert Launch._exit(exit_status(nobody, 0, True), 0) == 0
    assert capsys.readouterr().err == ""


def test_a_command_killed_by_a_signal_exits_as_a_shell_says_it():
    import signal
    import subprocess
    import sys

    from rankscope.coordinator.launch.watched import shell_status
    proc = subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert proc.returncode == -signal.SIGKILL
    assert shell_status(proc.returncode) == 137  # not 247, what exiting with -9 shows
    assert shell_status(3) == 3 and shell_status(0) == 0


def test_ranks_that_attached_but_showed_no_step_are_not_called_watched():
    # A training step rankscope did not recognise: every rank attached, ran to its end
    # and never sent a step. "No divergence in 4 of 4 watched" would be a claim about nothing.
    done = {"state": "finished", "step": -1, "pid": 100}
    cov = WatchedRanks.of(status({str(r): done for r in range(4)}, judged=None), {})
    line = end_of_run_line(cov, 0, found_divergence=False)
    assert line == "NOTHING WAS WATCHED: UNWATCHED: ranks 0-3 (attached, no step seen); command exited with 0"
    assert exit_status(cov, 0, allow_unwatched=False) == UNWATCHED_EXIT
    # One rank says it is not watched; one died before its first step (that death is
    # what was seen of it: it stays watched); the rest ran.
    says = {**RUNNING, "state": "finished", "watch": {"mode": "unknown", "how": "not watched", "reason": "x"}}
    died = {"state": "lost", "step": -1, "pid": 103}
    cov = WatchedRanks.of(status({"0": RUNNING, "1": says, "2": RUNNING, "3": died}), {})
    assert cov.watched == [0, 2, 3]
    line = end_of_run_line(cov, 1, found_divergence=False)
    assert "3 of 4 rank(s) watched (ranks 0, 2, 3)" in line
    assert "UNWATCHED: rank 1 (attached, not watched: its watch line says why)" in line


def test_ranks_lost_before_any_step_was_compared_are_attached_not_watched():
    # A rank's data loader killed it before its first step and msrun took the rest down:
    # the deaths were seen, no step was; "4 of 4 watched" would contradict the coverage.
    lost = {"state": "lost", "step": -1, "pid": 100}
    cov = WatchedRanks.of(status({str(r): lost for r in range(4)}, judged=None), {})
    assert end_of_run_line(cov, 1, found_divergence=True) == "4 of 4 rank(s) attached (ranks 0-3), no step was compared"
    line = end_of_run_line(cov, 1, found_divergence=False)
    assert line == "no divergence judged: 4 of 4 rank(s) attached (ranks 0-3), no step was compared; " \
                   "command exited with 1"


def test_an_incident_to_terminate_on_exits_86_even_when_the_job_ended_first():
    cov = WatchedRanks.of(status({"0": RUNNING, "1": RUNNING}), {})
    stop = [{"policy": "terminate", "state": "exporting"}]
    # Terminated: the job failed because of it. Ended by itself before the terminate
    # arrived (its last steps judged after it exited): the same status, not a race.
    assert launch_exit(cov, 137, False, stop) == INCIDENT_EXIT
    assert launch_exit(cov, 0, False, stop) == INCIDENT_EXIT
    # Export, pause or continue: the job's own status stands, a failure included.
    assert launch_exit(cov, 0, False, [{"policy": "continue", "state": "running"}]) == 0
    assert launch_exit(cov, 3, False, [{"policy": "export", "state": "exported"}]) == 3
    # `rankscope terminate` with no incident is rankscope's doing only when the job failed.
    assert launch_exit(cov, 143, False, [], terminated=True) == INCIDENT_EXIT
    assert launch_exit(cov, 0, False, [], terminated=True) == 0
    assert launch_exit(WatchedRanks.of(status({}), {}), 0, False, []) == UNWATCHED_EXIT
