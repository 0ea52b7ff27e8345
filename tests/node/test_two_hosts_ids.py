"""Job-wide ids across hosts, with real parts: one coordinator service (the object the Ray
actor wraps), two node agent processes told different hosts, and four DP inference
worker processes that all claim rank 0 in a world of 1, two per host.

Each agent can only make its own host's ids unique; the coordinator must make them 0..3
job-wide, and every rank must carry the host its agent was told. With the job-wide DP
index a vLLM-style launcher gives each worker (0..3 over both hosts), the ids are that
order; with none, they are still 0..3, one per process."""
from __future__ import annotations

import pytest
from node_harness import start_agent, start_rank, stop, wait_event

from rankscope.coordinator.server.service import CoordinatorService
from tests.sim_agent import wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("dp_index", [True, False], ids=["job-wide-dp-index", "no-dp-index"])
def test_workers_on_two_hosts_all_claiming_rank0_get_ids_0_to_3_and_their_hosts(tmp_path, dp_index):
    svc = CoordinatorService(tmp_path / "out", {"on_divergence": "continue"}, job="j")
    endpoint = svc.start()
    agents, ranks = [], []
    try:
        for host in ("node0", "node1"):
            d = tmp_path / host
            d.mkdir()
            agents.append(start_agent(d, endpoint, "--host", host, "--settle", "1.0"))
        workers = [(host, dp) for host in (0, 1) for dp in (0, 1)]
        for host, dp in workers:
            order = ["--dp-index", str(2 * host + dp)] if dp_index else []
            ranks.append(start_rank(agents[host][1], "--claim", "0", "--world-size", "1", *order,
                                    "--steps", "3", "--sleep", "0.2"))
        got = {w: wait_event(p, "registered")["rank"] for w, p in zip(workers, ranks)}
        for p in ranks:
            wait_event(p, "done")
            assert p.wait(30) == 0
    finally:
        for p in ranks:
            stop(p)
        for proc, _ in agents:
            stop(proc)
    try:
        assert sorted(got.values()) == [0, 1, 2, 3], got
        if dp_index:
            assert got == {(host, dp): 2 * host + dp for host, dp in workers}, got
        def four_ranks() -> dict | None:
            ranks = svc.status()["ranks"]
            return ranks if len(ranks) == 4 else None
        seen = wait_for(four_ranks, timeout=60.0)
        hosts = {int(r): v["host"] for r, v in seen.items()}
        assert hosts == {rank: f"node{host}" for (host, _), rank in got.items()}, (hosts, got)
    finally:
        svc.stop()
