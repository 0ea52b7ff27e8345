"""End to end: a real 2-rank msrun job in which rank 1 cannot attach (its environment
holds an RDR setting the probe rejects). The training goes on, unwatched on that rank;
launch must say so on the terminal while the job runs, count it at the end, never call
rank 1 clean, and exit non-zero although the command succeeded."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from repo_paths import REPO

from rankscope.coordinator.cli.demo import msrun_command
from rankscope.coordinator.launch.watched import UNWATCHED_EXIT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
JOB = REPO / "tests" / "e2e" / "jobs" / "one_rank_unattached.py"


def test_a_rank_that_fails_to_attach_is_reported_loudly(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "MS_RDR_"))}
    env.update(UNATTACHED_RANK="1", STEPS="5")
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out), "--log", str(out / "command.log"),
           "--", *msrun_command(2, out / "msrun_logs", JOB)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    explain = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    # The job itself ran to the end on both ranks.
    log = (out / "command.log").read_text(errors="replace")
    assert "rank 1 step 4" in log or "rank 1 step 4" in "".join(
        p.read_text(errors="replace") for p in (out / "msrun_logs").glob("worker_1*.log")), explain
    warning = [line for line in proc.stderr.splitlines() if "WARNING: rank 1 failed to attach" in line]
    assert warning and "MS_RDR_MODE" in warning[0] and "'7'" in warning[0], explain
    end = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "rank(s) watched" in line]
    assert end and "1 of 2 rank(s) watched (rank 0)" in end[-1] and "UNWATCHED: rank 1" in end[-1], explain
    assert proc.returncode == UNWATCHED_EXIT, explain
    assert "Traceback" not in proc.stderr, explain
