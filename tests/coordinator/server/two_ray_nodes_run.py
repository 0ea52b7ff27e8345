"""Ingest shards on two real Ray nodes: a head and a worker node started here, on this
machine, each with its own temp dir; the two shards land on different nodes and a
divergence sent through them is named by the verdict actor. Both nodes are stopped by
the pid of their own `ray start --block`, never `ray stop` (that would stop every Ray
here).

Run as a process of its own (``python -m tests.coordinator.server.two_ray_nodes_run``,
which test_shards_two_ray_nodes.py does): this cluster runs without auth, and Ray keeps
a process's auth mode, so a private Ray started later in the same process would fail its
GCS start. Prints one line starting ``VERDICT`` and exits 0 when the check held."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ray

from rankscope.coordinator.server.actor import start_coordinator
from rankscope.coordinator.server.ingest_load import simulated_batch
from tests.sim_agent import RoutingAgent, wait_for

NS = "rankscope-test-two-nodes"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_start(args: list[str], log: Path, env: dict) -> subprocess.Popen:
    ray_bin = str(Path(sys.executable).parent / "ray")
    out = open(log, "w")
    return subprocess.Popen([ray_bin, "start", "--block", *args], stdout=out, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def _wait_log(proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while "block forever" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"ray start did not come up:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: this node's processes only
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    try:  # what it left in its session (a raylet slow to follow)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def two_nodes():
    work = Path(tempfile.mkdtemp(prefix="rsrn-", dir="/tmp"))  # short: unix socket paths
    port = _port()
    # A loaded machine starts a node's agents slowly: give them time to register.
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_agent_register_timeout_ms="120000")
    env.pop("RAY_ADDRESS", None)
    def common() -> list[str]:  # ports of each node's own agents: two nodes on one machine must not share them
        return ["--num-cpus=1", f"--dashboard-agent-listen-port={_port()}", f"--dashboard-agent-grpc-port={_port()}",
                f"--metrics-export-port={_port()}", f"--runtime-env-agent-port={_port()}", "--disable-usage-stats"]
    head = _ray_start(["--head", f"--port={port}", f"--ray-client-server-port={_port()}", "--include-dashboard=false",
                       f"--temp-dir={work}/h", *common()], work / "head.log", env)
    procs = [head]
    try:
        _wait_log(head, work / "head.log")
        # Ray gives a joining node a fixed 30 s to start its processes, which a loaded
        # machine can miss: one more try before calling it a failure.
        for attempt in (1, 2):
            log = work / f"worker{attempt}.log"
            worker = _ray_start([f"--address=127.0.0.1:{port}", f"--temp-dir={work}/w{attempt}", *common()], log, env)
            procs.append(worker)
            try:
                _wait_log(worker, log)
                break
            except AssertionError:
                _stop(worker)
                procs.remove(worker)
                if attempt == 2:
                    raise
        os.environ["RAY_AUTH_MODE"] = "disabled"
        os.environ.pop("RAY_ADDRESS", None)
        ray.init(address=f"127.0.0.1:{port}", namespace=NS, log_to_driver=False)
        deadline = time.monotonic() + 60
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            assert time.monotonic() < deadline, ray.nodes()
            time.sleep(0.5)
        yield work
    finally:
        ray.shutdown()
        for p in reversed(procs):
            _stop(p)
        shutil.rmtree(work, ignore_errors=True)


def check(two_nodes: Path) -> None:
    t0 = time.monotonic()
    h = start_coordinator(str(two_nodes / "out"), {"shards": 2, "on_divergence": "continue", "export_timeout_s": 1},
                          name="two-nodes", namespace=NS, job="jobN")
    agent = RoutingAgent(ray.get(h.endpoint.remote()), "jobN")
    try:
        for r in range(4):
            agent.register(r, world_size=4)
        agent.learn_shards(4)
        nodes = [s["node"] for s in ray.get(h.status.remote())["shards"]]
        assert len(set(nodes)) == 2, f"both shards on one Ray node: {nodes}"
        rng = np.random.default_rng(0)
        for step in range(6):
            for r in range(4):
                agent.step(simulated_batch("jobN", r, step, 12, rng, fault=(r, step) == (1, 4)))
        inc = wait_for(lambda: ray.get(h.incidents.remote()), timeout=60)[0]
        assert (inc["first_diverging_rank"], inc["step"], inc["detector"]) == (1, 4, "nan_origin")
        st = ray.get(h.status.remote())
        assert all(s["records"] > 0 for s in st["shards"]), st["shards"]
        print(f"VERDICT rank {inc['first_diverging_rank']} step {inc['step']} {inc['detector']}; shards on nodes "
              f"{sorted(set(nodes))}; {time.monotonic() - t0:.1f} s after the cluster was up", flush=True)
    finally:
        agent.close()
        ray.get(h.shutdown.remote(), timeout=30)
        ray.kill(h)


def main() -> None:
    with two_nodes() as work:
        check(work)


if __name__ == "__main__":
    main()
