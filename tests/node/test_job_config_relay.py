"""The job's config from a real coordinator service, through a real node agent process,
to ``rankscope launch --agent``'s question: one config on every node (no Ray: the
service is the plain Python object the Ray actor wraps)."""
from __future__ import annotations

import pytest
from node_harness import start_agent, stop

from rankscope.config.job import job_config
from rankscope.coordinator.server.service import CoordinatorService
from rankscope.wire.job_config import ask_agent

pytestmark = pytest.mark.timeout(120)


def test_launch_on_another_node_gets_the_coordinators_whole_config(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"level": "mix", "cluster": {"sentinels": false, "flight_recorder_steps": 3, '
                   '"groups": "replicas", "detectors": {"outlier": {"z": 9.0}}}}')
    job = job_config(cfg, "export")
    svc = CoordinatorService(tmp_path / "out", job["cluster"], job="j", config=job)
    endpoint = svc.start()
    agent = None
    try:
        agent, listen = start_agent(tmp_path, endpoint)
        got = ask_agent(listen, "j", timeout_s=60.0)
        assert got == job
        assert got["cluster"]["on_divergence"] == "export" and got["level"] == "mix"
    finally:
        if agent is not None:
            stop(agent)
        svc.stop()


def test_asking_an_agent_without_a_coordinator_gives_up_with_none(tmp_path):
    agent, listen = start_agent(tmp_path, None)
    try:
        assert ask_agent(listen, "j", timeout_s=1.5) is None
    finally:
        stop(agent)
