"""AgentClient against a stand-in agent ROUTER on real sockets (and with no agent at all)."""
from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time

import pytest
import zmq
from node_harness import ROOT, FakeCoordinator, free_port, start_agent, stop

from rankscope.client.agent_client import AgentClient, RankClaim, batch_bytes
from rankscope.probe.gate import GateState, RankscopeTerminated, StepGate
from rankscope.rdr.transfer import BundleAssembler
from rankscope.wire import protocol
from rankscope.wire.protocol import Message
from rankscope.wire.records import Kind, NameTable, StepBatchBuilder, StepOutput
from rankscope.wire.transport import bind_router

pytestmark = pytest.mark.timeout(60)


class StubAgent:
    """The agent's side of the socket: a thread owns it, auto-answers REGISTER, and the
    test reads what arrived / queues what to send."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.endpoint = endpoint
        self.sock, _ = bind_router(self.ctx, endpoint)
        self.dec = protocol.Decoder()
        self.got: list[tuple[bytes, Message]] = []
        self.seq = protocol.SeqCounter()
        self._out: "queue.SimpleQueue[tuple[bytes, bytes]]" = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(20):
                ident, frame = self.sock.recv_multipart()
                msg = self.dec.decode(frame)
                if msg is not None:
                    self.got.append((ident, msg))
                    if msg.type == protocol.REGISTER:
                        self.reply(ident, protocol.REGISTERED, {
                            "assigned_rank": 40 + msg.body["claimed_rank"],
                            "claimed_rank": msg.body["claimed_rank"], "remapped": True})
            while not self._out.empty():
                self.sock.send_multipart(list(self._out.get()))
        self.sock.close(0)

    def pump(self, pred=None, timeout: float = 10.0) -> list[Message]:
        """Wait until a message matching ``pred`` arrived; return everything so far."""
        deadline = time.monotonic() + timeout
        while pred is not None and time.monotonic() < deadline:
            if any(pred(m) for _, m in list(self.got)):
                break
            time.sleep(0.02)
        return [m for _, m in list(self.got)]

    def reply(self, ident: bytes, mtype: str, body: dict) -> None:
        self._out.put((ident, protocol.encode(Message(mtype, "j", "agent:x", self.seq(), body))))

    def control(self, command: str, **body) -> None:
        for ident in {i for i, _ in list(self.got)}:
            self.reply(ident, protocol.CONTROL, {"command": command, **body})

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.ctx.destroy(linger=0)


def _outs(n: int, names: NameTable, new_each_step: bool = True):
    b = StepBatchBuilder(names)
    for step in range(n):
        b.add("shared", Kind.LOSS, (1.0, 1.0, 1.0, 1.0))
        if new_each_step:
            b.add(f"t{step}", Kind.FORWARD, (2.0, 0.0, 1.0, 3.0))
        yield StepOutput(b.build("j", 0, step), "rank0")


def test_without_an_agent_register_is_none_emit_drops_and_nothing_raises(tmp_path):
    c = AgentClient(f"ipc://{tmp_path}/nobody.sock", "j", StepGate(), queue_max=4)
    try:
        assert c.register(RankClaim.here(0), timeout=2.0) is None
        for out in _outs(10, NameTable()):
            c.emit(out)
        assert c.dropped == 6 and c.sent == 0
    finally:
        c.close(timeout=0.2)
    c2 = AgentClient(f"tcp://127.0.0.1:{free_port()}", "j", StepGate())
    try:
        assert c2.register(RankClaim.here(0), timeout=1.0) is None
    finally:
        c2.close(timeout=0.2)


def test_names_of_dropped_steps_arrive_with_the_next_sent_step():
    ep = f"tcp://127.0.0.1:{free_port()}"
    c = AgentClient(ep, "j", StepGate(), queue_max=3)
    try:
        for out in _outs(10, NameTable()):  # nobody listens yet: the newest 3 kept, 7 dropped
            c.emit(out)
        assert c.dropped == 7
        stub = StubAgent(ep)
        steps = stub.pump(lambda m: m.type == protocol.STEP and m.body["step"] == 9)
        steps = [m for m in steps if m.type == protocol.STEP]
        # The steps nearest now are the ones a fault is in: the oldest went.
        assert [m.body["step"] for m in steps] == [7, 8, 9]
        names = {}
        for m in steps:
            names.update(m.body["new_names"])
        assert set(names.values()) == {"shared"} | {f"t{i}" for i in range(10)}
        stub.close()
    finally:
        c.close(timeout=0.2)


def test_the_byte_cap_bounds_the_buffer_and_drops_the_oldest():
    ep = f"tcp://127.0.0.1:{free_port()}"
    one = batch_bytes(next(_outs(1, NameTable(), new_each_step=False)).batch)
    c = AgentClient(ep, "j", StepGate(), queue_max=1000, queue_max_bytes=4 * one)
    try:
        for out in _outs(10, NameTable(), new_each_step=False):
            c.emit(out)
        assert (c.dropped, len(c.state.queue)) == (6, 4)
        assert [b.step for b in c.state.queue] == [6, 7, 8, 9]
    finally:
        c.close(timeout=0.2)


def test_register_remap_and_reconnect_resends_registration_and_name_table(tmp_path):
    ep = f"ipc://{tmp_path}/a.sock"
    stub = StubAgent(ep)
    c = AgentClient(ep, "j", StepGate())
    try:
        assert c.register(RankClaim.here(2, world_size=4, dp_index=1), timeout=5.0) == 42
        assert c.remapped and c.rank == 42
        names = NameTable()
        outs = _outs(6, names, new_each_step=False)
        c.emit(next(outs))
        first = stub.pump(lambda m: m.type == protocol.STEP)
        step0 = [m for m in first if m.type == protocol.STEP][0]
        assert step0.body["rank"] == 42 and step0.body["new_names"] == {0: "shared"}
        c.emit(next(outs))
        stub.pump(lambda m: m.type == protocol.STEP and m.body["step"] == 1)
        stub.close()  # the agent restarts...
        stub = StubAgent(ep)
        regs = [m for m in stub.pump(lambda m: m.type == protocol.REGISTER) if m.type == protocol.REGISTER]
        assert regs and regs[0].body["claimed_rank"] == 2 and regs[0].body["dp_index"] == 1
        c.emit(next(outs))
        later = [m for m in stub.pump(lambda m: m.type == protocol.STEP) if m.type == protocol.STEP]
        assert later[0].body["step"] == 2 and later[0].body["new_names"] == {0: "shared"}
    finally:
        c.close(timeout=0.5)
        stub.close()


def test_control_drives_the_step_gate_and_heartbeats_report_it(tmp_path):
    ep = f"ipc://{tmp_path}/a.sock"
    stub = StubAgent(ep)
    gate = StepGate()
    c = AgentClient(ep, "j", gate, heartbeat_s=0.2)
    try:
        assert c.register(RankClaim.here(0), timeout=5.0) == 40
        stub.control("pause", incident="inc9")
        deadline = time.monotonic() + 10
        while gate.state is not GateState.PAUSED and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.state is GateState.PAUSED and gate.incident == "inc9"
        passed = []
        t = threading.Thread(target=lambda: (gate.at_step_boundary(7), passed.append(7)), daemon=True)
        t.start()
        hb = stub.pump(lambda m: m.type == protocol.STATUS and m.body["what"] == "paused")
        assert [m.body["detail"] for m in hb if m.type == protocol.STATUS][0] == {"rank": 40, "step": 7, "started": 7}
        assert not passed
        stub.control("resume")
        t.join(10)
        assert passed == [7]
        stub.control("terminate", incident="inc9", args={"reason": "bad rank"})
        while gate.state is not GateState.TERMINATED and time.monotonic() < deadline + 10:
            time.sleep(0.01)
        with pytest.raises(RankscopeTerminated, match="inc9.*bad rank"):
            gate.at_step_boundary(8)
    finally:
        c.close(timeout=0.5)
        stub.close()


def test_export_sends_bundle_chunks_or_says_it_has_none(tmp_path):
    ep = f"ipc://{tmp_path}/a.sock"
    bundle = tmp_path / "rank_40" / "rdr"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text(json.dumps({"files": []}))
    (bundle / "big.bin").write_bytes(bytes(range(256)) * 9000)  # > 2 chunks
    asked = []
    stub = StubAgent(ep)
    c = AgentClient(ep, "j", StepGate(), on_export=lambda inc: (asked.append(inc), [bundle])[1])
    try:
        c.register(RankClaim.here(0), timeout=5.0)
        stub.control("export", incident="inc7", args={"transfer": "inc7"})
        asm = BundleAssembler(tmp_path / "dest")
        stub.pump(lambda m: m.type == protocol.BUNDLE_CHUNK and m.body["final"] and m.body["path"] == "rdr/big.bin")
        stub.pump(lambda m: m.type == protocol.BUNDLE_CHUNK and m.body["path"] == "rdr/manifest.json")
        for _, m in stub.got:
            if m.type == protocol.BUNDLE_CHUNK:
                asm.accept(m.body)
        assert asked == ["inc7"] and not asm.problems
        assert (tmp_path / "dest" / "rank_40" / "rdr" / "big.bin").read_bytes() == (bundle / "big.bin").read_bytes()
    finally:
        c.close(timeout=0.5)
        stub.close()

    stub = StubAgent(ep)
    c = AgentClient(ep, "j", StepGate())  # no on_export: the agent must answer for it
    try:
        c.register(RankClaim.here(1), timeout=5.0)
        stub.control("export", incident="inc8")
        none = stub.pump(lambda m: m.type == protocol.STATUS and m.body["what"] == "export_none")
        detail = [m for m in none if m.type == protocol.STATUS and m.body["what"] == "export_none"][0].body["detail"]
        assert detail["incident"] == "inc8" and detail["rank"] == 41
    finally:
        c.close(timeout=0.5)
        stub.close()


_SCRIPT = """
import sys
from rankscope.client.agent_client import AgentClient, RankClaim
from rankscope.probe.gate import StepGate
c = AgentClient(sys.argv[1], "j", StepGate())
print(c.register(RankClaim.here(int(sys.argv[2]), world_size=1), timeout=10.0), flush=True)
if sys.argv[3] == "raise":
    raise RuntimeError("boom in the training loop")
"""


def test_process_exit_says_goodbye_and_an_uncaught_exception_is_a_loss(tmp_path):
    coord = FakeCoordinator(f"tcp://127.0.0.1:{free_port()}")
    agent, ep = start_agent(tmp_path, coord.bound)
    try:
        for claim, how in ((0, "ok"), (1, "raise")):
            p = subprocess.run([sys.executable, "-c", _SCRIPT, ep, str(claim), how], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
            assert p.stdout.strip() == str(claim), p.stderr
        fin = coord.wait_for(lambda m: m.type == protocol.STATUS and m.body["what"] == "finished")
        assert fin[0].body["detail"]["rank"] == 0
        lost = coord.wait_for(lambda m: m.type == protocol.RANK_LOST)
        assert [m.body["rank"] for m in lost] == [1]
        assert "boom in the training loop" in lost[0].body["reason"]
        assert (tmp_path / "bundles" / "j" / "rank_1" / "rdr" / "manifest.json").is_file()
        assert not (tmp_path / "bundles" / "j" / "rank_0").exists()
    finally:
        stop(agent)
        coord.close()


_LINGER = """
import sys, threading, time
from rankscope.client.agent_client import AgentClient, RankClaim
from rankscope.probe.gate import StepGate
c = AgentClient(sys.argv[1], "j", StepGate())
c.register(RankClaim.here(0, world_size=1), timeout=10.0)
threading.Thread(target=time.sleep, args=(30,)).start()  # non-daemon: the exit waits for it
raise RuntimeError("boom while a worker thread runs")
"""


def test_an_uncaught_exception_says_goodbye_before_the_process_can_exit(tmp_path):
    ep = f"ipc://{tmp_path}/a.sock"
    stub = StubAgent(ep)
    proc = subprocess.Popen([sys.executable, "-c", _LINGER, ep], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        msgs = stub.pump(lambda m: m.type == protocol.STATUS and m.body["what"] == "bye", timeout=30)
        byes = [m.body["detail"] for m in msgs if m.type == protocol.STATUS and m.body["what"] == "bye"]
        assert byes and byes[0]["ok"] is False and "boom while a worker thread runs" in byes[0]["error"]
        assert proc.poll() is None  # still inside its 30 s thread: the goodbye did not wait for the exit
    finally:
        proc.kill()
        proc.wait()
        stub.close()


def test_collect_streams_this_ranks_selected_dump_files(tmp_path):
    dump = tmp_path / "dump"
    for step in (0, 1, 2):
        for label in ("rank40", "rank41"):
            d = dump / f"step{step}" / label
            d.mkdir(parents=True)
            (d / "dump.json").write_text(json.dumps({"step": step, "rank": label}))
    (dump / "step1" / "rank40" / "dump_tensor_data").mkdir()
    (dump / "step1" / "rank40" / "dump_tensor_data" / "x.npy").write_bytes(b"\x93NUMPY" + b"\0" * 300)
    ep = f"ipc://{tmp_path}/a.sock"
    stub = StubAgent(ep)
    c = AgentClient(ep, "j", StepGate(), dump_path=str(dump))
    try:
        assert c.register(RankClaim.here(0), timeout=5.0) == 40
        stub.control("collect", args={"transfer": "collect-t1", "steps": "1-2", "ranks": None, "resume": {}})
        msgs = stub.pump(lambda m: m.type == protocol.STATUS and m.body["what"] == "collect_done")
        done = [m for m in msgs if m.type == protocol.STATUS and m.body["what"] == "collect_done"][0]
        assert done.body["detail"] == {"rank": 40, "transfer": "collect-t1", "files": 3}
        asm = BundleAssembler(tmp_path / "out", per_rank_dirs=False)
        for m in msgs:
            if m.type == protocol.BUNDLE_CHUNK:
                asm.accept(m.body)
        got = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
        assert got == ["step1/rank40/dump.json", "step1/rank40/dump_tensor_data/x.npy", "step2/rank40/dump.json"]
        assert not asm.problems
        stub.control("collect", args={"transfer": "collect-t2", "ranks": [41]})  # not this rank: silence
        time.sleep(0.5)
        assert not [m for m in stub.pump() if m.type == protocol.STATUS and m.body["detail"].get("transfer") == "collect-t2"]
    finally:
        c.close(timeout=0.5)
        stub.close()


def test_an_uncaught_error_is_said_in_one_readable_line():
    from rankscope.client.agent_client import error_line
    framed = RuntimeError("\n" + "-" * 52 + "\n- Kernel error:\n" + "-" * 52 + "\nLaunch kernel failed: "
                          "Default/AllReduce-op13\n" + "-" * 52 + "\n- The Function Call Stack:\nIn file a.py:3")
    assert error_line(framed) == "RuntimeError: Kernel error: Launch kernel failed: Default/AllReduce-op13"
    assert error_line(ValueError("bad batch")) == "ValueError('bad batch')"
    assert len(error_line(ValueError("x" * 2000))) == 500
