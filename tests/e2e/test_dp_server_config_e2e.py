"""A DP inference server written another way (jobs/dp_queue_server.py: a router feeding
three spawned workers over queues, all RANK_ID=0 in a world of 1, started in reverse
order of their VLLM_DP_RANK a second apart) under ``rankscope launch --config X``.

One launch proves: a bare ``PrecisionDebugger()`` takes the job's config (L0 Cell names)
and dumps under the export folder; ids follow the server's worker order, not the order
the workers registered in; the rank map has one shape in incident.json and its files,
labels naming the folders; a worker whose own config disagrees on ``on_divergence`` is
told once on launch's terminal and the job's ``export`` is what happens; the drifted
worker is named by its DP index.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from repo_paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

SERVER = REPO / "tests" / "e2e" / "jobs" / "dp_queue_server.py"
WORKERS, OWN_CONFIG_DP, DRIFT_DP = 3, 0, 1


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp_server")
    (tmp / "job.json").write_text(json.dumps({"level": "L0", "cluster": {"groups": "replicas",
                                                                          "on_divergence": "export"}}))
    (tmp / "own.json").write_text(json.dumps({"level": "L0", "cluster": {"groups": "replicas",
                                                                          "on_divergence": "pause"}}))
    (tmp / "results").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "VLLM_", "SGLANG_"))}
    env.update(OWN_CONFIG=str(tmp / "own.json"), OWN_CONFIG_DP=str(OWN_CONFIG_DP), DRIFT_DP=str(DRIFT_DP))
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(tmp / "export"),
           "--config", str(tmp / "job.json"), "--", sys.executable, str(SERVER), str(tmp / "results")]
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    incidents = sorted((tmp / "export" / "incidents").glob("*/incident.json"))
    assert len(incidents) == 1, proc.stdout[-4000:]
    pids = {json.loads((tmp / "results" / f"worker{dp}.json").read_text())["pid"]: dp for dp in range(WORKERS)}
    return {"tmp": tmp, "proc": proc, "incident": json.loads(incidents[0].read_text()), "dir": incidents[0].parent,
            "pids": pids}


def test_ids_follow_the_servers_worker_order_and_the_map_has_one_shape(run):
    doc = run["incident"]["rank_map"]
    assert doc["format"] == "rankscope-rank-map/1"
    rows = doc["entries"]
    assert {r["pid"]: r["assigned_rank"] for r in rows} == run["pids"]  # worker k is rank k
    assert all(r["claimed_rank"] == 0 and r["dp_index"] == r["assigned_rank"] for r in rows)
    assert all(r["label"] == f"rank{r['assigned_rank']}" and r["claimed_label"] == f"proc{r['pid']}" for r in rows)
    agent_map = json.loads(next((run["tmp"] / "export" / "agent_bundles").glob("*/rank_map.json")).read_text())
    assert agent_map["format"] == doc["format"] and {r["pid"] for r in agent_map["entries"]} == set(run["pids"])
    for dp in range(WORKERS):
        assert f"DP index {dp} from VLLM_DP_RANK" in run["proc"].stderr


def test_a_bare_debugger_takes_the_jobs_config_and_dumps_under_the_export(run):
    step0 = run["tmp"] / "export" / "local_dump" / "step0"
    assert sorted(p.name for p in step0.iterdir()) == [f"rank{i}" for i in range(WORKERS)]
    names = json.loads((step0 / "rank2" / "dump.json").read_text())["data"]
    assert names and all(n.startswith("Cell.") for n in names), list(names)[:5]  # L0, the job's level
    assert not (run["tmp"] / "dump_path").exists()  # msProbe's default folder was not used


def test_a_disagreeing_worker_config_is_said_once_and_the_jobs_action_is_taken(run):
    err = run["proc"].stderr
    said = [line for line in err.splitlines() if "disagrees with the job's" in line and "(pid " in line]
    assert len(said) == 1, err[-3000:]
    assert "on_divergence: 'pause' here, 'export' for the job" in said[0]
    inc = run["incident"]
    assert inc["policy"] == "export" and inc["state"] in ("written", "resumed")  # never held paused


def test_the_drifted_worker_is_named_by_its_place_in_the_server(run):
    inc = run["incident"]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == ("replica", DRIFT_DP, 0)
    assert inc["tensor"].startswith("Cell.2.")  # the drifted layer
