"""End to end: the watch survives its own faults. The node agent that ``rankscope launch``
started is SIGKILLed under a real 4-rank msrun job; launch restarts it, the ranks
reconnect and send what they buffered, and a fault injected after the chaos is still
named, with every rank's bundle and an honest line about what was watched."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rankscope.coordinator.cli.demo import msrun_command

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def pids_of(needle: str) -> list[int]:
    """Processes whose command line holds ``needle`` (a job id this test made up)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in cmd:
                out.append(int(d.name))
    return out


def test_a_killed_node_agent_is_restarted_and_a_later_fault_is_still_named(tmp_path):
    out, job = tmp_path / "out", f"chaos-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, TRAIN_FAULT="scale_grad:2:10", TRAIN_STEPS="14", TRAIN_STEP_SLEEP="0.7")
    cmd = [sys.executable, "-m", "rankscope", "launch", "--job", job, "--export-dir", str(out),
           "--on-divergence", "terminate", "--", *msrun_command(4, out / "msrun_logs")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log = out / "msrun_logs" / "worker_0.log"
        deadline = time.monotonic() + 240
        while not (log.exists() and "step 3 loss" in log.read_text(errors="replace")):
            assert proc.poll() is None and time.monotonic() < deadline, "the job never reached step 3"
            time.sleep(0.2)
        agents = [p for p in pids_of("rankscope agent --coordinator") if p in pids_of(job)]
        assert len(agents) == 1, agents
        os.kill(agents[0], signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=360)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "node agent died (killed by SIGKILL); restarting it" in stdout, stdout[-3000:]
    incidents = sorted(out.glob("incidents/*/incident.json"))
    assert incidents, stdout[-3000:]
    inc = json.loads(incidents[0].read_text())
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == ("outlier", 2, 10), stdout[-3000:]
    for r in range(4):
        assert any((incidents[0].parent / f"rank_{r}" / "rdr").iterdir()), f"rank {r} has no bundle"
    coverage = json.loads((out / "coverage.json").read_text())["jobs"][job]
    # What the ranks buffered while the agent was down reached the coordinator.
    assert coverage["watched_ranks"] == 4 and coverage["steps"][0] == 0, coverage
    assert "node agent killed by SIGKILL, down" in stdout
