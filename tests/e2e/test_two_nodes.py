"""End to end: two msrun "nodes" of 2 ranks on one machine, through the README's own
multi-node commands (Ray head, coordinator, one agent per node with its own --host,
``launch --agent`` per node). The fault is on the second node: rank 3's local gradients
x50 at step 5. The coordinator must name it, with all four bundles and one job-wide
rank map whose hosts are what the agents were told.

The shell block is read from README.md and run as is, so the documented sequence is
the tested one; the test only picks free ports, a work directory and the fault, and
gives the run its own Ray token (never the machine's Ray or its ~/.ray token).
"""
from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from incident_checks import grad_incident
from node_harness import free_port
from repo_paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def readme_two_node_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("### Two nodes on one machine"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README's two-node section has no sh block"
    return block.group(1)




def test_a_fault_on_the_second_node_is_named_with_every_bundle_and_the_told_hosts(short_tmp):
    work = short_tmp
    bindir = str(Path(sys.executable).parent)  # rankscope, ray and msrun of this venv
    env = dict(os.environ, PATH=os.pathsep.join([bindir, os.environ.get("PATH", "")]),
               W=str(work), TRAIN_SCRIPT=str(REPO / "examples" / "train_dp.py"), JOB="two-nodes-e2e",
               TRAIN_FAULT="scale_grad:3:5", TRAIN_STEPS="10",
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
               **{k: str(free_port()) for k in ("RAY_PORT", "RAY_CLIENT_PORT", "RAY_AGENT_PORT",
                                                 "COORD_PORT", "MASTER_PORT")})
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(["bash", "-c", readme_two_node_block()], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # ray start --block stops its own cluster on SIGTERM
        out, _ = proc.communicate(timeout=60)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted(work.glob("*.log")) if p.is_file())
    explain = f"exit {proc.returncode}\n{out[-3000:]}\n{logs}"
    inc, rows = grad_incident(work / "out" / "incidents", 3, 5, 4, explain)
    hosts = {r["assigned_rank"]: r["host"] for r in rows}
    assert hosts == {0: "node0", 1: "node0", 2: "node1", 3: "node1"}, rows
