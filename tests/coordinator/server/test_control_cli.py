"""``rankscope status|pause|resume|step|terminate|export|collect`` against a coordinator
actor in a real local Ray, with a scripted node agent on a real socket answering."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import ray
from repo_paths import REPO

from rankscope.coordinator.cli import control as control_cli
from rankscope.coordinator.server.actor import start_coordinator
from rankscope.coordinator.server.ingest_load import simulated_batch
from rankscope.wire import protocol
from tests.sim_agent import SimAgent, wait_for

pytestmark = pytest.mark.ray
NS = "rankscope-test-cli"
ROOT = REPO


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, folder_ray):
    export_dir = tmp_path_factory.mktemp("export")
    h = start_coordinator(str(export_dir), {"on_divergence": "pause", "export_timeout_s": 30},
                          name="rankscope-cli", namespace=NS, job="jobE")
    agent = SimAgent(ray.get(h.endpoint.remote()), "jobE")
    for r in range(2):
        agent.register(r, world_size=2)
    rng = np.random.default_rng(0)
    for step in range(3):
        for r in range(2):
            agent.step(simulated_batch("jobE", r, step, 8, rng))
    wait_for(lambda: ray.get(h.status.remote())["last_judged_step"] == 2)
    yield h, agent, export_dir
    agent.close()
    ray.get(h.shutdown.remote())
    ray.kill(h)


def cli(*argv: str) -> int:
    return control_cli.main([*argv, "--namespace", NS])


def test_status_shows_ranks_steps_and_incidents(cluster, capsys):
    assert cli("status") == 0
    out = capsys.readouterr().out
    assert "ranks: 0:running@2, 1:running@2" in out and "incidents: 0" in out
    assert cli("status", "--json") == 0
    st = json.loads(capsys.readouterr().out)
    assert st["job"] == "jobE" and st["last_judged_step"] == 2


def test_pause_step_resume_reach_the_agent_and_bad_counts_are_refused(cluster, capsys):
    _, agent, _ = cluster
    assert cli("pause") == 0
    assert "pause sent to 1 node agent(s)" in capsys.readouterr().out
    at = agent.expect_control("pause").body["args"]["at"]
    assert at == 4  # steps 0-2 handed over: step 3 may have begun, so every rank holds before 4
    assert cli("step", "3") == 0
    assert agent.expect_control("step").body["args"] == {"n": 3, "at": 6}
    assert cli("resume") == 0
    agent.expect_control("resume")
    assert cli("step", "0") == 2
    assert "N must be >= 1" in capsys.readouterr().err


def test_export_collects_every_rank_bundle_into_an_incident(cluster, capsys, tmp_path):
    h, agent, export_dir = cluster
    assert cli("export") == 0
    out = capsys.readouterr().out
    assert "export started: incident" in out
    # A second export while the first is open: one plain line from the real command.
    gcs = ray.get_runtime_context().gcs_address
    again = subprocess.run([sys.executable, "-m", "rankscope", "export", "--address", gcs, "--namespace", NS],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2, again.stderr[-2000:]
    assert again.stderr.strip().splitlines() == [again.stderr.strip()], again.stderr
    assert "already open" in again.stderr and "Traceback" not in again.stderr and "\x1b" not in again.stderr
    at = agent.expect_control("pause").body["args"]["at"]
    for r in range(2):
        agent.status("paused", r, at - 1)
    iid = agent.expect_control("export").body["args"]["transfer"]
    for r in range(2):
        agent.send_bundle(r, iid, tmp_path)
    agent.expect_control("resume")  # an operator export resumes once written
    for r in range(2):
        agent.status("resumed", r, 2)
    inc = wait_for(lambda: [i for i in ray.get(h.incidents.remote()) if i["incident_id"] == iid
                            and i["state"] == "resumed"])[0]
    assert inc["detector"] == "manual" and sorted(inc["bundles"]) == ["0", "1"]
    assert (export_dir / "incidents" / iid / "rank_1" / "rdr" / "manifest.json").is_file()


def _dump_tree(root: Path) -> list[Path]:
    files = []
    for step in range(2):
        for r in range(2):
            d = root / f"step{step}" / f"rank{r}"
            d.mkdir(parents=True)
            (d / "dump.json").write_text(json.dumps({"task": "statistics", "step": step, "rank": r,
                                                     "pad": "x" * 3000}))
            (d / "stack.json").write_text("{}")
            files += [d / "dump.json", d / "stack.json"]
    return files


def test_collect_streams_every_rank_dump_resumably_with_progress(cluster, capsys, tmp_path):
    _, agent, export_dir = cluster
    files = _dump_tree(tmp_path / "dump")
    first = files[0]

    def answer(resume_expected: bool) -> None:
        ctrl = agent.expect_control("collect")
        args = ctrl.body["args"]
        assert args["steps"] == "0-1"
        from rankscope.rdr.transfer import iter_file_chunks
        if not resume_expected:
            # cut off mid-file: only the first 1000 bytes of one file arrive
            body = next(iter_file_chunks([first], tmp_path / "dump", 0, args["transfer"], chunk_bytes=1000))
            agent.send(protocol.BUNDLE_CHUNK, body, "rank:simhost:0")
            return
        assert args["resume"] == {"step0/rank0/dump.json": 1000}
        for r in range(2):
            mine = [f for f in files if f.parent.name == f"rank{r}"]
            from rankscope.rdr.transfer import iter_file_chunks as chunks
            for body in chunks(mine, tmp_path / "dump", r, args["transfer"], chunk_bytes=1000,
                               resume=args["resume"] if r == 0 else None):
                agent.send(protocol.BUNDLE_CHUNK, body, f"rank:simhost:{r}")
            agent.status("collect_done", r, 2, transfer=args["transfer"], files=len(mine))

    t = threading.Thread(target=answer, args=(False,))
    t.start()
    assert cli("collect", "--steps", "0-1", "--no-wait") == 0
    t.join(20)
    capsys.readouterr()
    t = threading.Thread(target=answer, args=(True,))
    t.start()
    assert cli("collect", "--steps", "0-1", "--timeout", "20") == 0
    t.join(20)
    out = capsys.readouterr().out
    assert "2/2 ranks done, 8 files" in out
    for f in files:
        got = export_dir / "dumps" / f.relative_to(tmp_path / "dump")
        assert got.read_bytes() == f.read_bytes(), got


def test_real_cli_process_finds_the_coordinator_by_address(cluster):
    h, _, _ = cluster
    gcs = ray.get_runtime_context().gcs_address
    out = subprocess.run([sys.executable, "-m", "rankscope", "status", "--address", gcs,
                          "--namespace", NS, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["endpoint"] == ray.get(h.endpoint.remote())


def test_without_address_the_cli_reaches_the_job_recorded_on_this_machine_and_refuses_ambiguity(
        cluster, tmp_path, monkeypatch):
    from rankscope.coordinator.server import job_index
    h, _, export_dir = cluster
    gcs = ray.get_runtime_context().gcs_address
    monkeypatch.setenv("RANKSCOPE_HOME", str(tmp_path))  # this test's own index, for it and its children

    def status(*extra):
        return subprocess.run([sys.executable, "-m", "rankscope", "status", "--json", *extra], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)

    none = status()
    assert none.returncode == 1 and "no running rankscope job on this machine" in none.stderr
    # Records as a launch writes them, owned by live processes of ours.
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        job_index.record(job_index.JobRecord("jobE", gcs, NS, "rankscope-cli", owner.pid, str(export_dir)))
        one = status()
        assert one.returncode == 0, one.stderr[-2000:]
        assert json.loads(one.stdout.strip().splitlines()[-1])["endpoint"] == ray.get(h.endpoint.remote())
        job_index.record(job_index.JobRecord("jobF", "127.0.0.1:1", NS, "rankscope-jobF", os.getpid(), "/elsewhere"))
        two = status()
        assert two.returncode == 1 and "2 rankscope jobs" in two.stderr and "jobF" in two.stderr
        picked = status("--job", "jobE")
        assert picked.returncode == 0, picked.stderr[-2000:]
    finally:
        owner.kill()
        owner.wait()
    # Its owner gone, the record is stale: it no longer counts.
    gone = status("--job", "jobE")
    assert gone.returncode == 1 and "no running job 'jobE'" in gone.stderr


def test_no_coordinator_is_a_clear_error(cluster, capsys):
    assert control_cli.main(["status", "--namespace", "nobody-here"]) == 1
    assert "no rankscope coordinator" in capsys.readouterr().err


def test_rankscope_coordinator_serves_until_sigterm_and_detached_outlives_its_command(cluster, tmp_path):
    import signal
    gcs = ray.get_runtime_context().gcs_address
    base = [sys.executable, "-m", "rankscope", "coordinator", "--address", gcs, "--namespace", NS,
            "--export-dir", str(tmp_path)]
    ep_file = tmp_path / "endpoint"
    proc = subprocess.Popen([*base, "--name", "served", "--endpoint-file", str(ep_file), "--job", "jobS"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: ep_file.exists() or proc.poll() is not None, timeout=120)
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        served = ray.get_actor("served", namespace=NS)
        assert ray.get(served.endpoint.remote()) == ep_file.read_text().strip()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        with pytest.raises(Exception):  # stopped with its command
            ray.get(ray.get_actor("served", namespace=NS).ping.remote(), timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = subprocess.run([*base, "--name", "served-detached", "--detached", "--on-divergence", "terminate"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "listening on tcp://127.0.0.1:" in out.stdout
    detached = ray.get_actor("served-detached", namespace=NS)
    try:
        assert ray.get(detached.ping.remote(), timeout=30) is True
    finally:
        ray.kill(detached)
    bad = subprocess.run([*base, "--name", "x", "--on-divergence", "explode"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--on-divergence" in bad.stderr
