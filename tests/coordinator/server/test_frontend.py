"""The ZeroMQ front end on real sockets, without Ray: bursts reach the handlers as
StepBatches, bad frames are refused and counted, control reaches every agent, and
other threads' calls run on the loop thread."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rankscope.coordinator.server.frontend import Frontend, Handlers
from rankscope.coordinator.server.ingest_load import simulated_batch
from rankscope.wire import protocol
from rankscope.wire.transport import TransportError
from tests.sim_agent import SimAgent, wait_for


class Recorder(Handlers):
    def __init__(self) -> None:
        self.batches: list = []
        self.messages: list = []
        self.ticks = 0
        self.threads: set[str] = set()

    def on_steps(self, batches):
        self.threads.add(threading.current_thread().name)
        self.batches += batches

    def on_message(self, msg, peer):
        self.messages.append((msg.type, msg.body, peer.identity))
        if msg.body.get("what") == "boom":
            raise RuntimeError("a handler bug must not kill the loop")

    def on_tick(self, now):
        self.ticks += 1


@pytest.fixture
def front():
    rec = Recorder()
    fe = Frontend(rec, "tcp://127.0.0.1:0", job="j", tick_s=0.02, ack_s=0.05)
    fe.start()
    yield fe, rec
    fe.stop()


def test_steps_arrive_as_batches_in_order_and_replays_are_dropped(front):
    fe, rec = front
    agent = SimAgent(fe.endpoint, "j")
    try:
        rng = np.random.default_rng(0)
        frames = [agent.step(simulated_batch("j", r, s, 8, rng)) for s in range(5) for r in range(3)]
        agent.sock.send(frames[4])  # replayed
        wait_for(lambda: len(rec.batches) == 15 and fe.replay.duplicates == 1)
        got = [(b.rank, b.step) for b in rec.batches]
        assert got == [(r, s) for s in range(5) for r in range(3)]
        assert rec.batches[0].new_names and rec.batches[0].stats.shape == (8, 4)
        assert rec.threads == {"rankscope-frontend"}
        assert wait_for(lambda: rec.ticks > 3)
    finally:
        agent.close()


def test_bad_frames_are_counted_and_the_loop_survives_a_failing_handler(front):
    fe, rec = front
    agent = SimAgent(fe.endpoint, "j")
    try:
        agent.sock.send(b"\xc1")
        agent.sock.send(protocol.encode(protocol.Message(protocol.HEARTBEAT, "j", "rank:1", 0, {"rank": 1})))
        agent.status("boom", 1, 0)
        agent.status("fine", 1, 0)
        wait_for(lambda: [m[1]["what"] for m in rec.messages] == ["boom", "fine"])
        assert fe.decoder.rejected == {"malformed": 1, "missing_field": 1}
        assert fe.alive
    finally:
        agent.close()


def test_control_reaches_every_agent_and_calls_run_on_the_loop(front):
    fe, rec = front
    agents = [SimAgent(fe.endpoint, "j", identity=f"agent:h{i}:1".encode()) for i in range(3)]
    try:
        for i, a in enumerate(agents):
            a.status("hello", i, 0)
        wait_for(lambda: len(fe.peers) == 3)
        assert fe.call_sync(lambda: threading.current_thread().name) == "rankscope-frontend"
        sent = fe.call_sync(fe.send_control, "step", job="j", args={"n": 2}, incident=None)
        assert sent == 3
        for a in agents:
            msg = a.expect_control("step")
            assert msg.body["args"] == {"n": 2} and msg.src == "coordinator"
        # acks tell each agent what arrived from it
        wait_for(lambda: agents[0].recv(0.1) is None and agents[0].acks)
        assert agents[0].acks[-1] == {"j|rank:simhost:0": 0}  # keyed as the agent keys its spool
        with pytest.raises(ZeroDivisionError):
            fe.call_sync(lambda: 1 / 0)
    finally:
        for a in agents:
            a.close()


def test_a_non_loopback_bind_without_curve_is_refused():
    fe = Frontend(Recorder(), "tcp://0.0.0.0:0")
    with pytest.raises(RuntimeError, match="CURVE") as err:
        fe.start()
    assert isinstance(err.value.__cause__, TransportError)
    assert fe.call(lambda: 1).exception() is not None  # not running: calls fail, never hang


def test_curve_front_end_admits_allowlisted_agents_only(tmp_path):
    import zmq
    import zmq.auth

    from rankscope.wire.transport import CurveKeys, connect_dealer

    allow = tmp_path / "allow"
    allow.mkdir()
    _, server_secret = zmq.auth.create_certificates(str(tmp_path), "coordinator")
    friend_pub, friend_secret = zmq.auth.create_certificates(str(allow), "friend")
    stranger_dir = tmp_path / "stranger"
    stranger_dir.mkdir()
    _, stranger_secret = zmq.auth.create_certificates(str(stranger_dir), "stranger")
    server = CurveKeys.from_files(server_secret, allow_dir=allow)
    rec = Recorder()
    fe = Frontend(rec, "tcp://0.0.0.0:0", curve=server, tick_s=0.02)
    endpoint = fe.start().replace("0.0.0.0", "127.0.0.1")
    ctx = zmq.Context()
    try:
        socks = {}
        for name, secret in (("friend", friend_secret), ("stranger", stranger_secret)):
            keys = CurveKeys.from_files(secret, server_public_file=tmp_path / "coordinator.key")
            socks[name] = connect_dealer(ctx, endpoint, f"agent:{name}:1".encode(), curve=keys)
        socks["friend"].setsockopt(zmq.SNDTIMEO, 20_000)
        socks["friend"].send(protocol.encode(protocol.Message(protocol.STATUS, "j", "rank:f", 0, {"what": "hi"})))
        wait_for(lambda: [m[1]["what"] for m in rec.messages] == ["hi"])
        time.sleep(0.5)  # the stranger had as long to shake hands; its keys are not on the list
        with pytest.raises(zmq.Again):
            socks["stranger"].send(b"x", flags=zmq.NOBLOCK)
        assert [p for p in fe.peers] == [b"agent:friend:1"]
    finally:
        for s in socks.values():
            s.close(linger=0)
        ctx.term()
        fe.stop()


def test_other_messages_never_overtake_the_steps_sent_before_them(front):
    fe, rec = front
    seen: list[str] = []
    rec.on_steps = lambda batches: seen.extend(f"step{b.step}" for b in batches)
    rec.on_message = lambda msg, peer: seen.append(msg.body["what"])
    agent = SimAgent(fe.endpoint, "j")
    try:
        rng = np.random.default_rng(0)
        for s in range(3):
            agent.step(simulated_batch("j", 0, s, 4, rng))
        agent.status("finished", 0, 2)
        agent.step(simulated_batch("j", 1, 0, 4, rng))
        wait_for(lambda: len(seen) == 5)
        assert seen == ["step0", "step1", "step2", "finished", "step0"]
    finally:
        agent.close()


def test_a_node_agent_answers_the_clock_probe_of_a_front_end_serving_one_job(front, tmp_path):
    """The probe carries the front end's job, so the agent's answer (which echoes it) is
    not refused as another job's frame and the agent's clock offset gets measured."""
    from rankscope.node.core import NodeCore
    from rankscope.node.settings import AgentSettings

    fe, _ = front
    core = NodeCore(AgentSettings(listen="ipc:///nowhere", bundle_dir=tmp_path), "h", "agent:h:1",
                    wall_clock=lambda: time.time() - 100.0)  # this host's clock is 100 s behind
    agent = SimAgent(fe.endpoint, "j")
    try:
        agent.status("hello", 0, 0)
        probe = wait_for(lambda: (m := agent.recv(0.2)) is not None and m.body.get("what") == "clock" and m)
        assert probe.job == "j"
        core.on_coordinator_frame(protocol.encode(probe))
        (answer,) = core.take().up_volatile
        agent.sock.send(answer)
        peer = wait_for(lambda: next((p for p in fe.call_sync(lambda: list(fe.peers.values()))
                                      if p.clock.error is not None), None))
        assert abs(peer.clock.offset - 100.0) < 1.0
        assert fe.decoder.rejected.get("wrong_job", 0) == 0
    finally:
        agent.close()


def test_a_front_end_without_clock_probes_only_acknowledges():
    """An ingest shard's front end: agents get acks from it, never a clock probe to answer."""
    fe = Frontend(Recorder(), "tcp://127.0.0.1:0", job="j", tick_s=0.02, ack_s=0.05, clock_probes=False)
    fe.start()
    agent = SimAgent(fe.endpoint, "j")
    try:
        agent.status("hello", 0, 0)
        wait_for(lambda: agent.recv(0.1) is None and agent.acks)  # recv keeps acks aside
        assert agent.recv(0.6) is None  # several ack periods: nothing but acks came
    finally:
        agent.close()
        fe.stop()
