"""The node agent with real processes on real sockets.

A fake coordinator ROUTER lives in the test process; the agent and the ranks are
subprocesses. No timing assertions: every wait is "until it happens, or fail after a
generous timeout".
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
from node_harness import FakeCoordinator, free_port, start_agent, start_rank, stop, wait_event

from rankscope.rdr.steps_file import load_steps
from rankscope.rdr.transfer import BundleAssembler
from rankscope.wire import protocol

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def coord():
    c = FakeCoordinator(f"tcp://127.0.0.1:{free_port()}")
    yield c
    c.close()


@pytest.fixture
def agent(tmp_path, coord):
    proc, endpoint = start_agent(tmp_path, coord.bound, "--settle", "1.0", "--heartbeat-timeout", "30")
    yield proc, endpoint
    stop(proc)


def test_three_processes_claiming_rank0_get_three_ids_folders_and_a_rank_map(tmp_path, coord, agent):
    _, endpoint = agent
    dump = tmp_path / "dump"
    # dp_index order differs from start order: the assignment must follow dp_index.
    ranks = [start_rank(endpoint, "--claim", "0", "--dp-index", str(dp), "--steps", "2", "--dump", str(dump))
             for dp in (2, 0, 1)]
    try:
        got = {dp: wait_event(p, "registered")["rank"] for dp, p in zip((2, 0, 1), ranks)}
        for p in ranks:
            wait_event(p, "done")
            assert p.wait(30) == 0
    finally:
        for p in ranks:
            stop(p)
    assert got == {0: 0, 1: 1, 2: 2}, got
    folders = sorted(d.name for d in (dump / "step0").iterdir())
    assert folders == ["rank0", "rank1", "rank2"]
    assert all((dump / "step1" / f / "dump.json").is_file() for f in folders)

    # The coordinator heard the map (written to rank_map.json just before it was sent).
    coord.wait_for(lambda m: m.type == protocol.RANK_MAP and len(m.body["entries"]) == 3)
    rank_map = json.loads((tmp_path / "bundles" / "j" / "rank_map.json").read_text())["entries"]
    assert sorted(r["assigned_rank"] for r in rank_map) == [0, 1, 2]
    assert all(r["claimed_rank"] == 0 for r in rank_map)
    assert sorted(r["remapped"] for r in rank_map) == [False, True, True]
    by_dp = {r["dp_index"]: r for r in rank_map}
    assert {dp: by_dp[dp]["pid"] for dp in (0, 1, 2)} == {dp: p.pid for dp, p in zip((2, 0, 1), ranks)}
    # The coordinator heard the assigned ids and the map too.
    regs = coord.wait_for(lambda m: m.type == protocol.REGISTER and m.body.get("assigned_rank") == 2)
    assert regs[0].src.startswith("agent:") and regs[0].body["claimed_rank"] == 0
    assert regs[0].body["versions"]["python"] and "pyzmq" in regs[0].body["versions"]
    maps = coord.wait_for(lambda m: m.type == protocol.RANK_MAP and len(m.body["entries"]) == 3)
    assert sorted(e["assigned_rank"] for e in maps[-1].body["entries"]) == [0, 1, 2]


def test_sigkilled_rank_gets_its_bundle_written_and_exported_by_the_agent(tmp_path, coord, agent):
    _, endpoint = agent
    rank = start_rank(endpoint, "--claim", "5", "--world-size", "1", "--steps", "12", "--then", "hang")
    try:
        assert wait_event(rank, "registered")["rank"] == 5
        wait_event(rank, "done")
        # Every step reached the coordinator, so it reached the agent's flight recorder.
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] == 11)
        os.kill(rank.pid, signal.SIGKILL)
        # Do not reap it yet: while it is a zombie the agent can read its exit status.
        lost = coord.wait_for(lambda m: m.type == protocol.RANK_LOST)[0]
    finally:
        stop(rank)
    assert lost.body["rank"] == 5 and lost.body["pid"] == rank.pid
    assert lost.body["last_step"] == 11
    assert lost.body["exit_status"] == -signal.SIGKILL
    bundle = tmp_path / "bundles" / "j" / "rank_5" / "rdr"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["on_behalf"] is True and manifest["complete"] is True
    batches, names = load_steps((bundle / "flight_recorder_steps.msgpack").read_bytes())
    assert [b.step for b in batches] == list(range(4, 12))  # the default K = 8 last steps
    assert names[0] == "Cell.layer0.Dense.forward.0"  # names sent at step 0 survive the ring

    # Export: the agent answers for the dead rank over the wire.
    coord.control("export", incident="inc1", args={"transfer": "inc1"})
    dest = tmp_path / "incident"
    asm = BundleAssembler(dest)
    deadline = time.monotonic() + 30
    done: set[str] = set()
    seen = 0

    def complete() -> bool:
        if "rdr/manifest.json" not in done:
            return False
        listed = json.loads((dest / "rank_5" / "rdr" / "manifest.json").read_text())["files"]
        return all(f"rdr/{f['path']}" in done for f in listed)

    while time.monotonic() < deadline and not complete():
        coord.pump(0.1)
        chunks = coord.of_type(protocol.BUNDLE_CHUNK)
        for m in chunks[seen:]:
            if asm.accept(m.body) is not None:
                done.add(m.body["path"])
        seen = len(chunks)
    assert complete() and not asm.problems, (done, asm.problems)
    got = json.loads((dest / "rank_5" / "rdr" / "manifest.json").read_text())
    assert got["on_behalf"] is True
    for f in got["files"]:
        assert (dest / "rank_5" / "rdr" / f["path"]).is_file(), f


def test_coordinator_restart_loses_no_record(tmp_path, coord, agent):
    _, endpoint = agent
    steps = 300
    rank = start_rank(endpoint, "--claim", "0", "--world-size", "1", "--steps", str(steps), "--sleep", "0.01")
    try:
        wait_event(rank, "registered")
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] >= 60)
        coord.close_socket()  # "crash": frames queued in the old socket are lost
        time.sleep(1.0)  # the rank keeps training; the agent spools
        coord.replay = protocol.ReplayFilter()  # a restarted coordinator remembers nothing
        coord.open()  # same port: the agent reconnects and replays
        done = wait_event(rank, "done", timeout=60)
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] == steps - 1, timeout=60)
        assert rank.wait(30) == 0
    finally:
        stop(rank)
    assert done["dropped"] == 0
    got = sorted({m.body["step"] for m in coord.of_type(protocol.STEP)})
    assert got == list(range(steps)), f"missing {sorted(set(range(steps)) - set(got))[:20]}"
    # The restarted coordinator got the name table again with the first step it saw.
    with_names = [m.body["step"] for m in coord.of_type(protocol.STEP) if m.body["new_names"]]
    assert with_names[0] == 0 and len(with_names) >= 2, with_names
    log = (tmp_path / "agent.log").read_text()
    assert "disconnected" in log and "connected" in log


def test_pause_resume_and_step_reach_the_rank(tmp_path, coord, agent):
    _, endpoint = agent
    rank = start_rank(endpoint, "--claim", "0", "--world-size", "1", "--steps", "400", "--sleep", "0.02")
    try:
        wait_event(rank, "registered")
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] >= 3)
        coord.control("pause", incident="inc-p")
        paused = coord.wait_for(lambda m: m.type == protocol.STATUS and m.body["what"] == "paused")[0]
        at = paused.body["detail"]["step"]
        coord.pump(0.5)
        last = max(m.body["step"] for m in coord.of_type(protocol.STEP))
        assert last == at - 1  # blocked at the boundary before step `at`: nothing after it
        coord.control("step", args={"n": 3})
        again = coord.wait_for(lambda m: m.type == protocol.STATUS and m.body["what"] == "paused"
                               and m.body["detail"]["step"] > at)[0]
        assert again.body["detail"]["step"] == at + 3
        coord.control("terminate", incident="inc-p", args={"reason": "test"})
        ev = wait_event(rank, "terminated")
        assert "inc-p" in ev["message"]
        assert rank.wait(30) == 3
    finally:
        stop(rank)


def test_agent_restart_ranks_keep_their_ids_and_keep_streaming(tmp_path, coord):
    proc, endpoint = start_agent(tmp_path, coord.bound, "--settle", "1.0")
    ranks = [start_rank(endpoint, "--claim", "0", "--dp-index", str(dp), "--steps", "300", "--sleep", "0.01")
             for dp in (1, 0)]
    try:
        ids = {p.pid: wait_event(p, "registered")["rank"] for p in ranks}
        assert sorted(ids.values()) == [0, 1]
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] >= 30)
        proc.kill()  # the agent dies hard; its socket file stays behind
        proc.wait(10)
        seen_before = len(coord.messages)
        proc, _ = start_agent(tmp_path, coord.bound, "--settle", "1.0")
        for p in ranks:
            wait_event(p, "done", timeout=60)
            assert p.wait(30) == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the new agent's registrations and goodbyes
            coord.pump(0.1)
            new = coord.messages[seen_before:]
            if sum(m.type == protocol.STATUS and m.body["what"] == "finished" for m in new) == 2:
                break
        after = {m.body["pid"]: m.body["assigned_rank"] for m in coord.messages[seen_before:]
                 if m.type == protocol.REGISTER}
        assert after == ids  # same ids from the new agent
        last = {}
        for m in coord.of_type(protocol.STEP):
            last[m.body["rank"]] = max(last.get(m.body["rank"], -1), m.body["step"])
        assert last == {0: 299, 1: 299}
    finally:
        for p in ranks:
            stop(p)
        stop(proc)


def test_stopped_rank_is_reported_unresponsive_then_back(tmp_path, coord):
    proc, endpoint = start_agent(tmp_path, coord.bound, "--heartbeat-timeout", "2")
    rank = start_rank(endpoint, "--claim", "3", "--world-size", "1", "--steps", "5", "--then", "hang")
    try:
        wait_event(rank, "done")
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] == 4)
        os.kill(rank.pid, signal.SIGSTOP)  # alive, but neither training nor heart-beating
        lost = coord.wait_for(lambda m: m.type == protocol.RANK_LOST, timeout=30)[0]
        assert lost.body["rank"] == 3 and lost.body["reason"].startswith("unresponsive")
        assert lost.body["exit_status"] is None and lost.body["last_step"] == 4
        os.kill(rank.pid, signal.SIGCONT)
        back = coord.wait_for(lambda m: m.type == protocol.STATUS and m.body["what"] == "rank_back", timeout=30)
        assert back[0].body["detail"]["rank"] == 3
    finally:
        stop(rank)
        stop(proc)


def test_agent_without_a_coordinator_still_registers_and_writes_bundles(tmp_path):
    proc, endpoint = start_agent(tmp_path, None)
    rank = start_rank(endpoint, "--claim", "1", "--world-size", "1", "--steps", "3", "--then", "hang")
    try:
        assert wait_event(rank, "registered")["rank"] == 1
        wait_event(rank, "done")
        os.kill(rank.pid, signal.SIGKILL)
        map_file = tmp_path / "bundles" / "j" / "rank_map.json"

        def states():
            if not map_file.exists():
                return []
            return [(r["assigned_rank"], r["state"]) for r in json.loads(map_file.read_text())["entries"]]

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and states() != [(1, "lost")]:
            time.sleep(0.1)
        assert states() == [(1, "lost")]  # written after the bundle
        manifest = tmp_path / "bundles" / "j" / "rank_1" / "rdr" / "manifest.json"
        assert json.loads(manifest.read_text())["on_behalf"] is True
    finally:
        stop(rank)
        stop(proc)


def test_rank_exiting_right_after_a_burst_is_finished_not_lost(tmp_path, coord, agent):
    # The agent sees the pid gone while the rank's last steps and goodbye are still
    # queued in its socket: that is a normal end, and every step must still be forwarded.
    _, endpoint = agent
    ranks = [start_rank(endpoint, "--claim", str(r), "--world-size", "4", "--steps", "300", "--tensors", "256",
                        "--burst") for r in range(4)]
    try:
        for p in ranks:
            assert p.wait(60) == 0
        fin = coord.wait_for(lambda m: m.type == protocol.STATUS and m.body["what"] == "finished"
                             and len([x for x in coord.messages if x.type == protocol.STATUS
                                      and x.body["what"] == "finished"]) == 4, timeout=60)
        assert sorted(m.body["detail"]["rank"] for m in fin) == [0, 1, 2, 3]
        assert [m.body["detail"]["step"] for m in fin] == [299] * 4
    finally:
        for p in ranks:
            stop(p)
    coord.pump(1.5)
    assert coord.of_type(protocol.RANK_LOST) == []
    assert len(coord.of_type(protocol.STEP)) == 1200


def test_rank_that_exits_on_terminate_is_not_a_loss(tmp_path, coord, agent):
    _, endpoint = agent
    rank = start_rank(endpoint, "--claim", "0", "--world-size", "1", "--steps", "1000", "--sleep", "0.01",
                      "--exit-on-terminate")
    try:
        wait_event(rank, "registered")
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] >= 2)
        coord.control("terminate", incident="inc-t")
        assert rank.wait(30) == 86  # StepGate's exit code: os._exit, no atexit, no goodbye
        coord.wait_for(lambda m: m.type == protocol.STATUS and m.body["what"] == "terminated")
        map_file = tmp_path / "bundles" / "j" / "rank_map.json"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = json.loads(map_file.read_text())["entries"]
            if rows[0]["state"] != "live":
                break
            time.sleep(0.1)
        assert rows[0]["state"] == "finished"
    finally:
        stop(rank)
    coord.pump(0.5)
    assert coord.of_type(protocol.RANK_LOST) == []
    assert not (tmp_path / "bundles" / "j" / "rank_0").exists()


def test_acknowledged_frames_are_not_replayed_after_a_restart(tmp_path, coord, agent):
    _, endpoint = agent
    rank = start_rank(endpoint, "--claim", "0", "--world-size", "1", "--steps", "200", "--sleep", "0.01",
                      "--then", "hang")
    try:
        wait_event(rank, "registered")
        # Without acknowledgements: a crash makes the agent resend what was in flight.
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] >= 50)
        coord.close_socket()
        time.sleep(0.5)
        coord.open()
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] == 199, timeout=60)
        resent = coord.replay.duplicates
        assert resent > 0
        # With them: nothing acknowledged comes back after the next crash.
        coord.ack()
        coord.pump(1.0)
        coord.close_socket()
        time.sleep(0.5)
        before = len(coord.messages)
        coord.open()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(  # the agent is back and resent its state
                m.type == protocol.RANK_MAP for m in coord.messages[before:]):
            coord.pump(0.1)
        coord.pump(2.0)
        assert coord.replay.duplicates == resent
        assert sorted(m.body["step"] for m in coord.of_type(protocol.STEP)) == list(range(200))
    finally:
        stop(rank)


def test_live_rank_without_its_own_bundle_is_exported_by_the_agent(tmp_path, coord, agent):
    _, endpoint = agent
    rank = start_rank(endpoint, "--claim", "2", "--world-size", "1", "--steps", "6", "--then", "hang")
    try:
        wait_event(rank, "registered")
        coord.wait_for(lambda m: m.type == protocol.STEP and m.body["step"] == 5)
        for n, transfer in enumerate(("incA", "incB")):
            coord.control("export", incident=transfer, args={"transfer": transfer})
            finals = coord.wait_for(lambda m: m.type == protocol.BUNDLE_CHUNK and m.body["transfer"] == transfer
                                    and m.body["final"] and m.body["path"].endswith("manifest.json"))
            assert finals[0].body["on_behalf"] is True and finals[0].body["rank"] == 2
        # Each request got a bundle of its own, nothing overwritten.
        dirs = sorted(p.name for p in (tmp_path / "bundles" / "j" / "rank_2").iterdir())
        assert dirs == ["rdr", "rdr.1"]
        assert rank.poll() is None  # exporting did not disturb the rank
    finally:
        stop(rank)


def test_odd_registrations(tmp_path, coord, agent):
    import zmq

    from rankscope.wire.protocol import Message
    from rankscope.wire.transport import connect_dealer

    _, endpoint = agent
    ctx = zmq.Context()
    try:
        socks = {}
        for name, pid, claim in (("zero-pid", 0, 0), ("minus-one", os.getpid(), -1)):
            socks[name] = connect_dealer(ctx, endpoint, name.encode())
            socks[name].send(protocol.encode(Message(protocol.REGISTER, "j", f"rank:{name}", 0, {
                "host": "h", "pid": pid, "claimed_rank": claim, "world_size": 1})))
        assert socks["minus-one"].poll(20000)
        reply = protocol.Decoder().decode(socks["minus-one"].recv())
        assert reply.type == protocol.REGISTERED
        assert reply.body["claimed_rank"] is None and reply.body["assigned_rank"] == 0
        assert not socks["zero-pid"].poll(1500)  # refused: never answered
    finally:
        ctx.destroy(linger=0)


def test_spool_outlives_the_agent_and_is_replayed_by_the_next_one(tmp_path):
    port = free_port()
    proc, endpoint = start_agent(tmp_path, f"tcp://127.0.0.1:{port}", "--drain", "0.5")  # nobody there
    rank = start_rank(endpoint, "--claim", "0", "--world-size", "1", "--steps", "50")
    try:
        wait_event(rank, "done")
        assert rank.wait(30) == 0
        time.sleep(0.5)  # let the agent take the last frames and the goodbye
        assert stop(proc) == 0
        assert "stay in the spool" in (tmp_path / "agent.log").read_text()
        coord = FakeCoordinator(f"tcp://127.0.0.1:{port}")
        try:
            proc, _ = start_agent(tmp_path, coord.bound)
            coord.wait_for(lambda m: m.type == protocol.STATUS and m.body["what"] == "finished")
            coord.pump(0.5)
            assert sorted(m.body["step"] for m in coord.of_type(protocol.STEP)) == list(range(50))
        finally:
            coord.close()
    finally:
        stop(rank)
        stop(proc)


def test_export_after_a_rank_finished_still_gets_its_bundle(tmp_path, coord, agent):
    _, endpoint = agent
    rank = start_rank(endpoint, "--claim", "1", "--world-size", "1", "--steps", "4")
    try:
        assert rank.wait(30) == 0
        coord.wait_for(lambda m: m.type == protocol.STATUS and m.body["what"] == "finished")
    finally:
        stop(rank)
    coord.control("export", incident="late", args={"transfer": "late"})
    finals = coord.wait_for(lambda m: m.type == protocol.BUNDLE_CHUNK and m.body["final"]
                            and m.body["path"] == "rdr/rank_finished.json")
    assert finals[0].body["rank"] == 1 and finals[0].body["on_behalf"] is True
    batches, _ = load_steps((tmp_path / "bundles" / "j" / "rank_1" / "rdr" / "flight_recorder_steps.msgpack")
                            .read_bytes())
    assert [b.step for b in batches] == [0, 1, 2, 3]
