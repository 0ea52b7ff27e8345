"""End to end: two msrun "nodes" of 2 ranks on one machine, through the documented
multi-node commands (Ray head, coordinator, one agent per node with its own --host,
``launch --agent`` per node). The fault is on the second node: rank 3's local gradients
x50 at step 5. The coordinator must name it, with all four bundles and one job-wide
rank map whose hosts are what the agents were told.

The shell block is read from docs/howto/multi-node.md and run as is, so the documented sequence is
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
from incident_checks import grad_incident, named_incident
from node_harness import free_port
from repo_paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


MULTI_NODE_PAGE = REPO / "docs" / "howto" / "multi-node.md"


def documented_two_node_block() -> str:
    text = MULTI_NODE_PAGE.read_text()
    section = text[text.index("## Two nodes on one machine"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, f"{MULTI_NODE_PAGE.relative_to(REPO)}'s two-node section has no sh block"
    return block.group(1)




def run_documented_block(work: Path, fault: str | None) -> tuple[subprocess.Popen, str]:
    """The documented two-node block as is, with free ports and ``fault`` (None: a clean run)."""
    bindir = str(Path(sys.executable).parent)  # rankscope, ray and msrun of this venv
    env = dict(os.environ, PATH=os.pathsep.join([bindir, os.environ.get("PATH", "")]),
               W=str(work), TRAIN_SCRIPT=str(REPO / "examples" / "train_dp.py"), JOB="two-nodes-e2e",
               TRAIN_STEPS="10", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
               **{k: str(free_port()) for k in ("RAY_PORT", "RAY_CLIENT_PORT", "RAY_AGENT_PORT",
                                                 "COORD_PORT", "MASTER_PORT")})
    env.pop("RAY_ADDRESS", None)
    env.pop("TRAIN_FAULT", None)
    if fault:
        env["TRAIN_FAULT"] = fault
    proc = subprocess.Popen(["bash", "-c", documented_two_node_block()], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # ray start --block stops its own cluster on SIGTERM
        out, _ = proc.communicate(timeout=60)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted(work.glob("*.log")) if p.is_file())
    return proc, f"exit {proc.returncode}\n{out[-3000:]}\n{logs}"


HOSTS = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}


def test_a_fault_on_the_second_node_is_named_with_every_bundle_and_the_told_hosts(short_tmp):
    _, explain = run_documented_block(short_tmp, "scale_grad:3:5")
    inc, rows = grad_incident(short_tmp / "out" / "incidents", 3, 5, 4, explain)
    assert {r["assigned_rank"]: r["host"] for r in rows} == HOSTS, rows


@pytest.mark.parametrize("fault, detector, rank, step", [
    # A rank SIGKILLed on the second node: its node's agent reports the death, the
    # ranks left waiting at the collective on both nodes are not blamed. (A NaN's origin
    # is judged from records alone, whichever node sent them: the one-node launch tests
    # and the outlier case above cover it.)
    ("kill:2:4", "progress", 2, 4),
])
def test_other_faults_across_two_nodes_name_the_origin(short_tmp, fault, detector, rank, step):
    _, explain = run_documented_block(short_tmp, fault)
    _, rows = named_incident(short_tmp / "out" / "incidents", detector, rank, step, 4, explain)
    assert {r["assigned_rank"]: r["host"] for r in rows} == HOSTS, rows


def test_a_clean_two_node_run_has_no_incident_and_every_rank_watched(short_tmp):
    proc, explain = run_documented_block(short_tmp, None)
    assert not list((short_tmp / "out").glob("incidents/*/incident.json")), explain
    # The block's `rankscope status`: no incident, and said of every step of every rank.
    lines = explain.splitlines()
    assert "incidents: 0" in lines, explain
    assert "coverage: watched steps 0-9 on 4/4 ranks" in lines, explain
