"""The job's config from a real coordinator service, through a real node agent process,
to ``rankscope launch --agent``'s question: one config on every node (no Ray: the
service is the plain Python object the Ray actor wraps)."""
from __future__ import annotations

import argparse
import json
import shutil

import pytest
from node_harness import start_agent, stop

from rankscope.config.job import job_config
from rankscope.coordinator.launch.runner import Launch
from rankscope.coordinator.server.service import CoordinatorService
from rankscope.wire.job_config import ask_agent

pytestmark = pytest.mark.timeout(120)


def test_launch_on_another_node_gets_the_coordinators_whole_config(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"level": "mix", "cluster": {"agent": "ipc:///node0/agent.sock", "sentinels": false, '
                   '"flight_recorder_steps": 3, '
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
        # launch --agent with a --config of its own: the coordinator's is in force, and said
        own = tmp_path / "own.json"
        own.write_text('{"level": "L1"}')
        launch = Launch(argparse.Namespace(job="j", export_dir=tmp_path / "export", quiet=True, config=own,
                                           on_divergence=None), job_config(own))
        try:
            launch.take_job_config(listen, timeout_s=60.0)
            written = json.loads(launch.write_job_config().read_text())
        finally:
            shutil.rmtree(launch.runtime_dir, ignore_errors=True)
        assert launch.job_config == job and launch.cluster["on_divergence"] == "export"
        # the ranks' copy: the same, less where one host's agent is (each node's launch says its own)
        assert written == {**job, "cluster": {k: v for k, v in job["cluster"].items() if k != "agent"}}
        assert "differ from the coordinator's config: the coordinator's is in force" in capsys.readouterr().err
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
