"""Ingest shards as real Ray actors on real sockets: a scripted node agent learns the shard
map from its registration reply, routes each batch's records to their shards, and the
verdict actor names the rank one coordinator names, then pauses the cluster as usual."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import ray

from rankscope.coordinator.server.actor import start_coordinator
from rankscope.coordinator.server.ingest_load import simulated_batch
from tests.sim_agent import RoutingAgent, SimAgent, wait_for

pytestmark = pytest.mark.ray
NS = "rankscope-test-shards"


@pytest.fixture(scope="module", autouse=True)
def local_ray(folder_ray):
    """The folder's shared private Ray (conftest.py)."""


def _steps(agent, ranks, steps, fault, tensors=12):
    rng = np.random.default_rng(0)
    for step in steps:
        for r in range(ranks):
            agent.step(simulated_batch(agent.job, r, step, tensors, rng, fault=(r, step) == fault))


def test_two_shards_name_the_rank_and_the_cluster_pauses(tmp_path):
    h = start_coordinator(str(tmp_path), {"shards": 2, "on_divergence": "pause", "pause_timeout_s": 30},
                          name="sharded", namespace=NS, job="jobS")
    agent = RoutingAgent(ray.get(h.endpoint.remote()), "jobS")
    try:
        for r in range(4):
            agent.register(r, world_size=4)
        detail = agent.learn_shards(4)
        assert detail["count"] == 2 and len(set(detail["endpoints"])) == 2
        _steps(agent, 4, range(6), fault=(2, 4))
        pause = agent.expect_control("pause")  # control still comes from the one coordinator socket
        incs = wait_for(lambda: ray.get(h.incidents.remote()))
        inc = incs[0]
        assert (inc["first_diverging_rank"], inc["step"], inc["detector"]) == (2, 4, "nan_origin")
        assert pause.body["incident"] == inc["incident_id"]
        st = ray.get(h.status.remote())
        assert [s["shard"] for s in st["shards"]] == [0, 1]
        assert all(s["records"] > 0 for s in st["shards"])  # both took records straight from the agent
        assert st["metrics"]["records_ingested"] == 0  # none went through the verdict actor
        assert sum(s["records"] for s in st["shards"]) == 4 * 6 * 12
        assert st["counters"]["records"] == 4 * 6 * 12  # the status counters are the shards'
        assert wait_for(lambda: ray.get(h.status.remote())["last_judged_step"] >= 4)
        # The verdict actor knows where every rank is, though it saw none of their records:
        # steps 0-5 handed over, so the cut is step 7, as with one coordinator.
        inc = wait_for(lambda: (i := ray.get(h.incidents.remote())[0])["state"] == "pausing"
                       and i["cut"]["step"] == 7 and i)
        for r in range(4):
            agent.status("paused", r, 6)
        export = agent.expect_control("export")
        assert export.body["incident"] == inc["incident_id"]
    finally:
        agent.close()
        ray.get(h.shutdown.remote(), timeout=30)
        ray.kill(h)


def test_an_agent_that_does_not_route_is_split_by_the_verdict_actor(tmp_path):
    h = start_coordinator(str(tmp_path), {"shards": 3, "on_divergence": "continue", "export_timeout_s": 1},
                          name="sharded-plain", namespace=NS, job="jobP")
    agent = SimAgent(ray.get(h.endpoint.remote()), "jobP", identity=b"agent:sim:2")
    try:
        for r in range(5):
            agent.register(r, world_size=5)
        rng = np.random.default_rng(1)
        for step in range(5):
            for r in range(5):
                b = simulated_batch("jobP", r, step, 16, rng)
                if (r, step) == (3, 3):
                    b.stats[0, 2] *= 1e4  # the loss of rank 3 (record 0 is the loss)
                agent.step(b)
        inc = wait_for(lambda: ray.get(h.incidents.remote()))[0]
        assert (inc["first_diverging_rank"], inc["step"], inc["detector"]) == (3, 3, "outlier")
        st = ray.get(h.status.remote())
        assert st["metrics"]["records_ingested"] == 5 * 5 * 16
        assert sum(s["records"] for s in st["shards"]) == 5 * 5 * 16
        # What the verdict actor keeps of records it never saw, from the shards' summaries:
        # the steps judged per rank, the report's curves and the proof around the verdict.
        ray.get(h.drain.remote(5.0), timeout=60)
        cov = ray.get(h.status.remote())["coverage"]["jobP"]
        assert (cov["steps"], cov["watched_ranks"], cov["complete"]) == ([0, 4], 5, True), cov
        history = json.loads((Path(inc["dir"]) / "history.json").read_text())
        assert history["steps"] == [0, 1, 2, 3, 4] and history["ranks"] == [0, 1, 2, 3, 4]
        assert history["loss"][3][3] > 100 * history["loss"][0][3]  # rank 3's loss at step 3
        assert all(v is not None for row in history["grad_norm"] for v in row)
        assert history["tensor_window"]["tensor"] == inc["tensor"]
    finally:
        agent.close()
        ray.get(h.shutdown.remote(), timeout=30)
        ray.kill(h)
