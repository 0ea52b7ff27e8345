"""``rankscope rerun``'s refusals and its classification, without a job: an incident
with nothing to replay is a clear error (exit 2), and what a replay found reads as the
class it settles; a replay's launcher that lingers after the result is stopped."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rankscope.coordinator.cli import rerun
from rankscope.wire import rerun_facts

RR = {"rank": 2, "step": 5, "outcome": "reproduced", "trigger": "a loss that is not finite"}


def _incident(tmp_path, evidence):
    d = tmp_path / "inc"
    d.mkdir()
    (d / "incident.json").write_text(json.dumps({"first_diverging_rank": 2, "step": 5, "evidence": evidence}))
    return d


@pytest.mark.parametrize("evidence, says", [
    ({}, "rank 2 at step 5 did not re-run that step (its records looked normal before its reduction)"),
    ({"rerun": {**RR, "outcome": "not_possible", "line": "not re-run: compiled"}}, "(not re-run: compiled)"),
    ({"rerun": RR}, "kept no replay record"),
    ({"rerun": {**RR, "replay": "/nonexistent/replay"}}, "/nonexistent/replay/meta.json: cannot be read"),
])
def test_nothing_to_replay_is_said_plainly(tmp_path, capsys, evidence, says):
    assert rerun.main([str(_incident(tmp_path, evidence))]) == 2
    assert says in capsys.readouterr().err


def test_a_missing_incident_is_named(tmp_path, capsys):
    assert rerun.main([str(tmp_path / "none")]) == 2
    assert "none/incident.json: cannot be read" in capsys.readouterr().err


@pytest.mark.parametrize("outcome, replayed, kind", [
    ("reproduced", "a loss that is not finite", "deterministic"),
    ("reproduced", "", "rank_only"),
    ("transient", "", "transient"),
    ("transient", "a loss that is not finite", "unknown"),
])
def test_the_replay_settles_the_class(outcome, replayed, kind):
    got, line = rerun_facts.with_reference({**RR, "outcome": outcome},
                                           {"float32": {"anomalous": replayed, "bitwise": False}})
    assert got == kind, line
    assert rerun_facts.with_reference(RR, {"error": "the replay took longer than 5 s"}) == \
        ("unknown", "not replayed: the replay took longer than 5 s")


def test_a_float64_replay_mindspore_refused_is_said():
    _, line = rerun_facts.with_reference(RR, {"float32": {"anomalous": ""},
                                              "float64_error": "TypeError: For primitive[Conv2D], Float64\nmore"})
    assert line.endswith("; no float64 replay (MindSpore refused it: TypeError: For primitive[Conv2D], Float64)")


def test_a_replay_that_lingers_after_writing_its_result_is_stopped_with_its_whole_group(tmp_path):
    # As msrun does after its one worker ended itself: a launcher and a child that wait on.
    out = tmp_path / "result.json"
    pids = tmp_path / "pids"
    script = (f"import json, os, subprocess, sys, time\n"
              f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
              f"open({str(out)!r}, 'w').write(json.dumps({{'float32': {{'loss': 1.0}}}}))\n"
              f"print('written', flush=True)\n"
              f"time.sleep(60)\n")
    t0 = time.monotonic()
    proc, stdout, _ = rerun._run_until_result([sys.executable, "-c", script], None, dict(os.environ), out, 120)
    took = time.monotonic() - t0
    assert "written" in stdout and rerun._result(out) == {"float32": {"loss": 1.0}}
    assert took < rerun.RESULT_GRACE_S + 10, took
    for pid in map(int, pids.read_text().split()):
        try:
            os.kill(pid, 0)
            alive = open(f"/proc/{pid}/stat").read().split()[2] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            alive = False
        assert not alive, pid


def test_a_replay_that_never_writes_is_stopped_at_its_timeout(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        rerun._run_until_result([sys.executable, "-c", "import time; time.sleep(60)"], None, dict(os.environ),
                              tmp_path / "result.json", 1.5)
