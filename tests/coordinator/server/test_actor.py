"""The coordinator actor in a real local Ray, fed over real ZeroMQ sockets by a scripted
node agent: verdict -> pause -> export -> incident on disk -> resume, restarts, replays."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from repo_paths import REPO

from rankscope.coordinator.server.actor import get_coordinator, start_coordinator
from rankscope.coordinator.server.ingest_load import simulated_batch
from rankscope.wire import protocol
from tests.sim_agent import SimAgent, wait_for

pytestmark = pytest.mark.ray
NS = "rankscope-test-actor"


@pytest.fixture(scope="module", autouse=True)
def local_ray(folder_ray):
    """The folder's shared private Ray (conftest.py)."""


def _stop(handle) -> None:
    ray.get(handle.shutdown.remote(), timeout=30)
    ray.kill(handle)


def _run_steps(agent: SimAgent, ranks: int, steps, tensors: int = 12, fault=None) -> None:
    rng = np.random.default_rng(0)
    for step in steps:
        for r in range(ranks):
            agent.step(simulated_batch(agent.job, r, step, tensors, rng, fault=(r, step) == fault))


def _incident(handle, state=None):
    incs = ray.get(handle.incidents.remote())
    if incs and (state is None or incs[0]["state"] == state):
        return incs[0]
    return None


def test_divergence_pauses_exports_writes_and_resumes(tmp_path):
    cluster = {"on_divergence": "pause", "pause_timeout_s": 30, "export_timeout_s": 30}
    h = start_coordinator(str(tmp_path), cluster, name="pause-flow", namespace=NS, job="jobA")
    agent = SimAgent(ray.get(h.endpoint.remote()), "jobA")
    try:
        for r in range(4):
            agent.register(r, world_size=4)
        _run_steps(agent, 4, range(6), fault=(2, 4))
        pause = agent.expect_control("pause")
        iid = pause.body["incident"]
        assert iid and "nan_origin" in iid
        inc = wait_for(lambda: _incident(h))
        assert (inc["first_diverging_rank"], inc["step"], inc["detector"]) == (2, 4, "nan_origin")
        assert inc["state"] == "pausing"  # waits for every rank to block at a boundary
        # Steps 0-5 were handed over, so step 6 may have begun: the cut is step 7.
        inc = wait_for(lambda: (i := _incident(h)) and i["cut"]["step"] == 7 and i)
        for r in range(4):
            agent.status("paused", r, 5)  # held before step 6: not the cut, the pause waits
        time.sleep(1.0)
        assert _incident(h)["state"] == "pausing"
        for r in range(4):
            agent.status("paused", r, 6)
        export = agent.expect_control("export")
        assert export.body["incident"] == iid and export.body["args"]["transfer"] == iid
        for r in range(4):
            agent.send_bundle(r, iid, tmp_path / "rank_side")
        inc = wait_for(lambda: _incident(h, "written"))  # policy pause: held until resume
        assert sorted(inc["bundles"], key=int) == ["0", "1", "2", "3"]
        d = tmp_path / "incidents" / iid
        doc = json.loads((d / "incident.json").read_text())
        for key in ("incident_id", "detector", "first_diverging_rank", "step", "tensor", "detected_at",
                    "evidence", "ranks", "bundles"):
            assert key in doc, key
        assert doc["first_diverging_rank"] == 2 and doc["missing_bundles"] == []
        assert all(doc["ranks"][str(r)]["state"] == "paused" for r in range(4))
        for r in range(4):
            assert (d / f"rank_{r}" / "rdr" / "manifest.json").is_file()
        wait_for(lambda: (d / "report.html").is_file(), timeout=90)  # matplotlib on a loaded machine
        assert (d / "history.json").is_file() and (d / "rank_map.json").is_file()

        answer = ray.get(h.control.remote("resume", {}))
        assert answer["sent_to_agents"] == 1
        agent.expect_control("resume")
        assert wait_for(lambda: _incident(h, "resumed"))
        st = ray.get(h.status.remote())
        assert st["metrics"]["records_ingested"] == 4 * 6 * 12 and st["metrics"]["ray_metrics"]
        assert sorted(st["ranks"], key=int) == ["0", "1", "2", "3"]
    finally:
        agent.close()
        _stop(h)


def test_restarted_coordinator_keeps_its_incidents(tmp_path):
    cluster = {"on_divergence": "continue", "export_timeout_s": 0.5}
    h = start_coordinator(str(tmp_path), cluster, name="restart-1", namespace=NS, job="jobB")
    agent = SimAgent(ray.get(h.endpoint.remote()), "jobB")
    try:
        for r in range(3):
            agent.register(r, world_size=3)
        _run_steps(agent, 3, range(3), fault=(1, 1))
        agent.expect_control("export")  # continue: no pause, export right away
        first = wait_for(lambda: _incident(h, "continued"))  # nobody sent a bundle: export timed out
    finally:
        agent.close()
        _stop(h)
    assert json.loads((tmp_path / "incidents" / first["incident_id"] / "incident.json").read_text())[
        "missing_bundles"] == [0, 1, 2]
    h2 = start_coordinator(str(tmp_path), cluster, name="restart-2", namespace=NS, job="jobB")
    try:
        again = ray.get(h2.incidents.remote())
        assert [(i["incident_id"], i["state"], i["first_diverging_rank"]) for i in again] == \
            [(first["incident_id"], "continued", 1)]
    finally:
        _stop(h2)


def test_replays_are_counted_once_garbage_is_refused_and_frames_acked(tmp_path):
    h = start_coordinator(str(tmp_path), {}, name="replay", namespace=NS, job="jobC")
    agent = SimAgent(ray.get(h.endpoint.remote()), "jobC")
    try:
        agent.register(0, world_size=1)
        batch = simulated_batch("jobC", 0, 0, 10, np.random.default_rng(1))
        frame = agent.step(batch)
        agent.sock.send(frame)  # a spool replay: same (src, seq)
        agent.sock.send(b"\x93not msgpack at all")
        agent.sock.send(protocol.encode(protocol.Message(protocol.STEP, "otherjob", "rank:x", 0, {})))
        st = wait_for(lambda: (s := ray.get(h.status.remote()))["duplicates"] == 1
                      and sum(s["rejected"].values()) == 2 and s)
        assert st["metrics"]["records_ingested"] == 10
        assert st["rejected"] == {"malformed": 1, "wrong_job": 1}
        wait_for(lambda: agent.recv(0.2) is None and agent.acks)
        assert agent.acks[-1][f"{agent.job}|rank:simhost:0"] == 0  # the agent may trim its spool up to there
    finally:
        agent.close()
        _stop(h)


def test_drain_judges_incomplete_steps_and_returns_incidents(tmp_path):
    cluster = {"on_divergence": "continue", "export_timeout_s": 0.3, "deadline_s": 600}
    h = start_coordinator(str(tmp_path), cluster, name="drain", namespace=NS, job="jobD")
    agent = SimAgent(ray.get(h.endpoint.remote()), "jobD")
    try:
        for r in range(3):
            agent.register(r, world_size=4)  # rank 3 never reports: nothing is judged on its own
        _run_steps(agent, 3, range(2), fault=(0, 1))
        wait_for(lambda: ray.get(h.status.remote())["metrics"]["records_ingested"] == 3 * 2 * 12)
        time.sleep(0.3)
        assert ray.get(h.incidents.remote()) == []
        incs = ray.get(h.drain.remote(10.0))
        assert [(i["first_diverging_rank"], i["step"], i["state"]) for i in incs] == [(0, 1, "continued")]
        assert ray.get(h.status.remote())["last_judged_step"] == 1
    finally:
        agent.close()
        _stop(h)


def test_start_joins_a_running_coordinator_and_bad_settings_name_the_field(tmp_path):
    h = start_coordinator(str(tmp_path), {}, name="join", namespace=NS)
    try:
        again = start_coordinator(str(tmp_path / "other"), {}, name="join", namespace=NS)
        assert ray.get(again.endpoint.remote()) == ray.get(h.endpoint.remote())
        assert ray.get(get_coordinator("join", NS).endpoint.remote()) == ray.get(h.endpoint.remote())
    finally:
        _stop(h)
    with pytest.raises(Exception, match="on_divergence"):
        start_coordinator(str(tmp_path), {"on_divergence": "explode"}, name="bad", namespace=NS)
    with pytest.raises(ValueError, match="no coordinator actor named 'nobody'"):
        get_coordinator("nobody", NS)


def _rank_process(endpoint: str, job: str, claimed: int, steps: int, fault_step: int, bundle_root: str,
                  results, start, dump_root: str, leave) -> None:
    """A rank as the probe runs it: AgentClient + StepGate, a NaN local gradient on rank 1."""
    from rankscope.client.agent_client import AgentClient, RankClaim
    from rankscope.probe.gate import GateState, StepGate
    from rankscope.rdr.bundle import write_bundle
    from rankscope.wire.records import Kind, NameTable, StepBatchBuilder, StepOutput

    paused_at: list[int] = []
    gate = StepGate(on_state=lambda state, step: paused_at.append(step) if state is GateState.PAUSED else None)
    client = AgentClient(endpoint, job, gate, heartbeat_s=0.2, dump_path=dump_root,
                         on_export=lambda incident: [write_bundle(bundle_root, rank, reason=f"export {incident}",
                                                                  steps=[])])
    rank = client.register(RankClaim.here(claimed, world_size=3), timeout=20)
    for step in range(3):  # this rank's local msProbe-layout dump, for `rankscope collect`
        d = Path(dump_root) / f"step{step}" / f"rank{rank}"
        d.mkdir(parents=True)
        (d / "dump.json").write_text(json.dumps({"task": "statistics", "step": step, "rank": rank}))
    # Like a collective job: nobody trains ahead while a slow process is still starting
    # (else the progress detector rightly reports the late starter first).
    start.wait(60)
    names = NameTable()
    builder = StepBatchBuilder(names)
    # Train on until the coordinator has paused and resumed this rank (however slow a
    # loaded machine makes detection), within a bound.
    for step in range(steps):
        if step > fault_step + 2 and paused_at and gate.state is GateState.RUNNING:
            break
        builder.add("Sentinel.loss", Kind.LOSS, (2.0, 2.0, 2.0, 2.0), numel=1)
        for i in range(4):
            bad = rank == 1 and step == fault_step and i == 2
            builder.add(f"Grad.local.layer{i}", Kind.GRAD_LOCAL,
                        (float("nan"),) * 4 if bad else (0.1, -0.1, 0.0, 1.0 + 0.01 * rank), nan=3 if bad else 0,
                        numel=64)
        client.emit(StepOutput(builder.build(job, rank, step), f"rank{rank}"))
        gate.at_step_boundary(step)
        time.sleep(0.05)
    results.put({"claimed": claimed, "rank": rank, "paused_at": paused_at})
    leave.wait(120)  # stay attached for the collect
    client.close()


def test_real_node_agent_and_rank_clients_pause_export_and_resume(tmp_path):
    """The whole path with the real node agent (a process) and real rank clients (processes)."""
    import multiprocessing as mp
    import subprocess
    import sys

    job = "jobR"
    h = start_coordinator(str(tmp_path / "export"), {"on_divergence": "export", "pause_timeout_s": 30,
                                                     "export_timeout_s": 30},
                          name="real-agent", namespace=NS, job=job)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "agent", "--coordinator", ray.get(h.endpoint.remote()),
         "--listen", f"ipc://{sock}", "--job", job, "--spool", str(tmp_path / "spool"),
         "--bundle-dir", str(tmp_path / "agent_bundles"), "--settle", "0.1", "--log-level", "WARNING"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    procs = []
    leave = None
    try:
        wait_for(lambda: sock.exists() or agent.poll() is not None)
        assert agent.poll() is None, agent.stderr.read().decode()[-2000:]
        ctx = mp.get_context("spawn")
        results, start, leave = ctx.Queue(), ctx.Barrier(3), ctx.Event()
        procs = [ctx.Process(target=_rank_process, args=(f"ipc://{sock}", job, r, 1200, 3,
                                                         str(tmp_path / "rank_bundles"), results, start,
                                                         str(tmp_path / f"dump_{r}"), leave))
                 for r in range(3)]
        for p in procs:
            p.start()
        done = sorted((results.get(timeout=180) for _ in procs), key=lambda d: d["rank"])
        assert [d["rank"] for d in done] == [0, 1, 2]
        assert all(d["paused_at"] for d in done), done  # every rank really blocked at a boundary
        inc = wait_for(lambda: _incident(h, "resumed"))
        assert (inc["first_diverging_rank"], inc["step"], inc["detector"]) == (1, 3, "nan_origin")
        assert sorted(inc["bundles"], key=int) == ["0", "1", "2"]
        d = Path(inc["dir"])
        assert all((d / f"rank_{r}" / "rdr" / "manifest.json").is_file() for r in range(3))
        assert json.loads((d / "incident.json").read_text())["missing_bundles"] == []
        rank_map = json.loads(wait_for(lambda: (d / "rank_map.json").is_file() and d / "rank_map.json").read_text())["entries"]
        assert sorted(e["assigned_rank"] for e in rank_map) == [0, 1, 2], rank_map  # the node agent's map

        # rankscope collect: every rank streams its selected dump steps into one tree
        answer = ray.get(h.control.remote("collect", {"steps": "1-2"}))
        assert answer["sent_to_agents"] == 1
        progress = wait_for(lambda: (ray.get(h.status.remote())["collect"] or {}).get("done")
                            and ray.get(h.status.remote())["collect"], timeout=60)
        assert progress["files"] == 6 and not progress["problems"], progress
        dumps = tmp_path / "export" / "dumps"
        assert sorted(p.relative_to(dumps).as_posix() for p in dumps.rglob("dump.json")) == [
            f"step{s}/rank{r}/dump.json" for s in (1, 2) for r in range(3)]
        assert json.loads((dumps / "step2" / "rank1" / "dump.json").read_text())["rank"] == 1
    finally:
        if leave is not None:
            leave.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        agent.terminate()
        agent.wait(10)
        _stop(h)


def test_drain_out_of_time_still_writes_the_incident(tmp_path):
    """The job ended while the incident waited for pauses that will never come: drain's
    deadline times the incident out and incident.json is written with what arrived."""
    cluster = {"on_divergence": "pause", "pause_timeout_s": 600, "export_timeout_s": 600}
    h = start_coordinator(str(tmp_path), cluster, name="drain-late", namespace=NS, job="jobF")
    agent = SimAgent(ray.get(h.endpoint.remote()), "jobF")
    try:
        for r in range(2):
            agent.register(r, world_size=2)
        _run_steps(agent, 2, range(2), fault=(1, 0))
        agent.expect_control("pause")  # nobody answers it
        incs = ray.get(h.drain.remote(1.0))
        assert [(i["first_diverging_rank"], i["state"]) for i in incs] == [(1, "written")]
        doc = json.loads((tmp_path / "incidents" / incs[0]["incident_id"] / "incident.json").read_text())
        assert doc["missing_bundles"] == [0, 1] and doc["first_diverging_rank"] == 1
    finally:
        agent.close()
        _stop(h)
