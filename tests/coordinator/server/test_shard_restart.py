"""An ingest shard whose process is killed (a real SIGKILL of its Ray worker) is started
again by Ray on the same port: the node agent's socket reconnects by itself, the shard is
told the job again and re-learns the tensor names the ranks sent once, the next fault is
named as before, and the steps it lost are "not seen" in the coverage, never "judged"."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import ray

from rankscope.coordinator.server.actor import start_coordinator
from rankscope.coordinator.server.ingest_load import simulated_batch
from tests.sim_agent import RoutingAgent, wait_for

pytestmark = pytest.mark.ray
NS = "rankscope-test-shard-restart"


@pytest.fixture(scope="module", autouse=True)
def local_ray(folder_ray):
    """The folder's shared private Ray (conftest.py)."""


def test_a_killed_shard_comes_back_on_its_port_and_what_it_lost_is_not_seen(tmp_path):
    h = start_coordinator(str(tmp_path), {"shards": 2, "on_divergence": "continue", "export_timeout_s": 1,
                                          "deadline_s": 3}, name="restart", namespace=NS, job="jobR")
    agent = RoutingAgent(ray.get(h.endpoint.remote()), "jobR")
    rng = np.random.default_rng(0)

    def send(step, ranks, fault=None):
        for r in ranks:
            agent.step(simulated_batch("jobR", r, step, 12, rng, fault=(r, step) == fault))

    def shard(i):
        return ray.get(h.status.remote())["shards"][i]

    try:
        for r in range(4):
            agent.register(r, world_size=4)
        agent.learn_shards(4)
        for step in range(4):
            send(step, range(4))
        wait_for(lambda: ray.get(h.status.remote())["last_judged_step"] >= 3)
        # Shard 1 holds the local gradients, where the fault below is. Steps 4 and 5 of
        # ranks 0-2 wait in it for rank 3 when its process is killed.
        send(4, range(3))
        send(5, range(3))
        before = wait_for(lambda: (s := shard(1)).get("pending_steps") == 2 and s)
        os.kill(before["pid"], signal.SIGKILL)
        send(4, [3])
        send(5, [3])
        after = wait_for(lambda: (s := shard(1)).get("resynced") and s.get("restarted") and s, timeout=90)
        assert after["endpoint"] == before["endpoint"] and after["pid"] != before["pid"]
        for step in range(6, 10):
            send(step, range(4), fault=(1, 8))
        inc = wait_for(lambda: ray.get(h.incidents.remote()), timeout=30)[0]
        assert (inc["first_diverging_rank"], inc["step"], inc["detector"]) == (1, 8, "nan_origin"), inc
        ray.get(h.drain.remote(5.0), timeout=60)
        st = ray.get(h.status.remote())
        # Only the fault: the ranks the restarted shard missed at steps 4-5 are no finding.
        assert [i["detector"] for i in st["incidents"]] == ["nan_origin"]
        cov = st["coverage"]["jobR"]
        assert cov["steps"] == [0, 9] and not cov["complete"], cov
        lost = [e for e in cov["not_seen"] if e["rank"] != 3]
        assert lost == [{"rank": r, "steps": [[4, 5]]} for r in range(3)], cov
        # Rank 3's steps 4-5 were sent while the shard was down: seen if the socket kept them.
        assert [e for e in cov["not_seen"] if e["rank"] == 3] in ([], [{"rank": 3, "steps": [[4, 5]]}]), cov
    finally:
        agent.close()
        ray.get(h.shutdown.remote(), timeout=30)
        ray.kill(h)
