"""End to end under real Slurm: ``deploy/slurm/rankscope.sbatch`` submitted with
``sbatch`` to a one-machine cluster this test starts (munged, slurmctld, slurmd; see
slurm_cluster.py) and stops by pid. The script's own steps run: a Ray head, the
coordinator and the node agent as ``srun --overlap`` steps, then msrun with 4 CPU ranks
under ``rankscope launch --agent``. The training script is a stranger's (jobs/conv_text.py:
an embedding + conv text model, a TrainOneStepCell subclass); rank 3's gradients are x50
at step 5. The policy is ``export``, so the job trains on and ends by itself.

The export must hold that incident with every rank's bundle and one job-wide rank map,
and the job's end must stop the daemon steps gracefully (the agent drains, Ray's files
stay in the job's own folder), not by Slurm's SIGKILL.

Skipped where Slurm is not installed or the test is not root (slurmd needs it).
"""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import slurm_cluster
from incident_checks import grad_incident
from node_harness import free_port
from repo_paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
JOBS = Path(__file__).parent / "jobs"




def test_sbatch_script_under_real_slurm_exports_the_incident_with_every_bundle(short_tmp):
    work = short_tmp
    why = slurm_cluster.missing()
    if why:
        pytest.skip(why)
    bindir = Path(sys.executable).parent  # rankscope, ray and msrun of this venv
    keys = work / "keys"
    for name in ("coordinator", "agent"):
        subprocess.run([str(bindir / "rankscope"), "keys", "new", name, "--dir", str(keys)], check=True,
                       capture_output=True)
    subprocess.run([str(bindir / "rankscope"), "keys", "allow", str(keys / "agent.key"),
                    "--allow-dir", str(keys / "allowed")], check=True, capture_output=True)
    exports, run_dir = work / "exports", work / "run"
    run_dir.mkdir()
    with slurm_cluster.slurm_cluster(work / "slurm") as cluster:
        env = dict(cluster.env, PATH=os.pathsep.join([str(bindir), os.environ.get("PATH", "")]),
                   RANKS_PER_NODE="4", EXPORT_DIR=str(exports), CURVE_DIR=str(keys),
                   SOCKET_DIR=str(work / "s"), ON_DIVERGENCE="export",
                   TEXT_FAULT="grads:3:5",
                   RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
                   **{k: str(free_port()) for k in ("RAY_PORT", "RAY_CLIENT_PORT", "RAY_AGENT_PORT",
                                                     "COORDINATOR_PORT", "MASTER_PORT")})
        env.pop("RAY_ADDRESS", None)
        sub = cluster.run(["sbatch", "--parsable", "--nodes=1", "--time=10", f"--chdir={run_dir}",
                           str(REPO / "deploy" / "slurm" / "rankscope.sbatch"),
                           str(JOBS / "conv_text.py")], env=env, timeout=60)
        assert sub.returncode == 0, sub.stderr
        state, code = cluster.wait_job(sub.stdout.strip().split(";")[0], timeout=540)
        outs = sorted(run_dir.glob("rankscope-*.out"))
        out = outs[0].read_text(errors="replace") if outs else ""
        explain = f"job {state} exit {code}\n{out[-5000:]}\n{cluster.logs()}"
    # export: the job trains on after the incident and ends well, daemon steps and all.
    assert (state, code) == ("COMPLETED", "0:0") and len(outs) == 1, explain
    inc, rows = grad_incident(exports / "incidents", 3, 5, 4, explain)
    assert sorted(r["assigned_rank"] for r in rows) == [0, 1, 2, 3], rows
    assert {r["host"] for r in rows} == {socket.gethostname()}, rows  # the agent's --host $(hostname)
    # The job's end stopped its daemon steps with SIGTERM: none was killed by Slurm, and
    # the Ray head kept its session files in the job's folder, not the machine's /tmp/ray.
    assert "Killed" not in out, explain
    assert list((work / "s" / "ray").glob("session_*")), explain
