"""End to end: bugs every rank runs, and a NaN the step swallows, on 4 real msrun ranks
under ``rankscope launch`` with no config (``jobs/dp_job_bugs.py``, a job that knows
nothing of rankscope, in a PyNative loop or a compiled GRAPH step).

- a parameter left out of the gradient reducer: the split follows the layout (every
  replica holds its own value), so the verdict names no rank and says it is code;
- every rank reading rank 0's batches: a warning, no incident, the job runs on;
- a NaN made once in one rank's forward and swallowed by ReLU: the step is re-run and the
  verdict says transient.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launched import explain

from rankscope.coordinator.cli.demo import msrun_command

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
JOB = Path(__file__).parent / "jobs" / "dp_job_bugs.py"


def launch(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path, list[dict]]:
    out = tmp_path / "out"
    full = {k: v for k, v in os.environ.items() if k not in ("BUG", "STYLE", "STEPS", "MINDSPORE_DUMP_CONFIG")}
    full.update(env)
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out), "--on-divergence", "terminate",
           "--no-replay", "--", *msrun_command(4, out / "msrun_logs", JOB)]
    proc = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=400)
    incidents = [json.loads(p.read_text()) for p in sorted((out / "incidents").glob("*/incident.json"))] \
        if (out / "incidents").exists() else []
    return proc, out, incidents


def test_a_parameter_left_out_of_the_reducer_is_a_job_wide_split_that_names_no_rank(tmp_path):
    proc, out, incidents = launch(tmp_path, BUG="unreduced", STYLE="graph")
    assert proc.returncode == 0 and len(incidents) == 1, explain(proc, out)
    inc = incidents[0]
    ev = inc["evidence"]
    assert inc["detector"] == "replica" and inc["decided"] is False and inc["step"] in (0, 1), inc
    assert inc["tensor"].endswith("offset") and ev["systematic"] is True
    assert sorted(ev["agreeing_sets"]) == [[0], [1], [2], [3]]
    assert "not reduced across the replicas ranks 0-3" in ev["probable_cause"]
    assert "hint" not in ev  # the weights started equal: no seed advice
    assert "no rank named: every rank runs this split" in proc.stdout
    assert "diverged first" not in proc.stdout


def test_ranks_that_read_the_same_batches_are_warned_at_step_0_with_no_incident(tmp_path):
    proc, out, incidents = launch(tmp_path, BUG="same_data")
    assert proc.returncode == 0 and incidents == [], explain(proc, out)
    assert "WARNING: ranks 0-3 read the same data at step 0" in proc.stdout
    assert "SAME DATA on ranks 0-3" in proc.stdout
    [job] = json.loads((out / "coverage.json").read_text())["jobs"].values()
    assert job["same_data"]["first_step"] == 0 and job["same_data"]["sets"] == [[0, 1, 2, 3]]


def test_a_nan_swallowed_once_in_one_rank_s_forward_is_re_run_and_transient(tmp_path):
    # Made on every execution instead, the re-run reproduces it: tests/probe/test_rerun_forward.py
    # runs both in one process (the same gate and tap), which costs a launch less here.
    proc, out, incidents = launch(tmp_path, BUG="fwd_nan_once:1:2")
    assert incidents, explain(proc, out)
    inc = incidents[0]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == ("nan_origin", 1, 2), inc
    assert inc["tensor"] == "Cell.left.1.Glitch.forward.0.output.0"
    rerun = inc["evidence"]["rerun"]
    assert rerun["outcome"] == "transient" and rerun["trigger"].startswith("a NaN in its forward"), rerun
