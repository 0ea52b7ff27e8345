"""Real processes on real sockets for the node-agent tests.

- :class:`FakeCoordinator`: a ROUTER in the test process standing in for the coordinator actor:
  decodes every frame, de-duplicates by (job|src, seq) with the protocol's ReplayFilter
  (kept across a "restart", as the real coordinator's would have to be for counting),
  sends control back.
- :func:`start_agent`: ``python -m rankscope.cli agent ...`` as a subprocess.
- :func:`start_rank`: ``tests/node_fake_rank.py`` as a subprocess; :func:`wait_event`
  reads its JSON event lines.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import zmq

from rankscope.wire import protocol
from rankscope.wire.ports import free_port  # noqa: F401 - the tests' one way to pick a port
from rankscope.wire.protocol import Message
from rankscope.wire.step_pack import parts_from_message
from rankscope.wire.transport import CurveKeys, bind_router, stop_authenticator

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


class FakeCoordinator:
    def __init__(self, endpoint: str, curve: CurveKeys | None = None) -> None:
        self.endpoint = endpoint
        self.curve = curve
        self.ctx = zmq.Context()
        self.decoder = protocol.Decoder()
        self.replay = protocol.ReplayFilter()
        self.messages: list[Message] = []  # fresh (de-duplicated) messages, in arrival order
        self.peers: set[bytes] = set()
        self.packs = 0  # STEPS frames taken apart
        self.sock: zmq.Socket | None = None
        self._seq = protocol.SeqCounter()
        self.open()

    def open(self) -> None:
        self.sock, self.bound = bind_router(self.ctx, self.endpoint, self.curve)

    def close_socket(self) -> None:
        """Stop like a crashed coordinator: whatever was not read yet is gone."""
        assert self.sock is not None
        self.sock.close(linger=0)
        self.sock = None

    def pump(self, timeout: float = 0.1) -> int:
        n = 0
        assert self.sock is not None
        if not self.sock.poll(int(timeout * 1000)):
            return 0
        while True:
            try:
                ident, frame = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return n
            self.peers.add(ident)
            msg = self.decoder.decode(frame)
            if msg is not None and msg.type == protocol.STEPS:
                # A node agent's pack, taken apart as a shard does: each part a rank's own STEP.
                self.packs += 1
                for src, seq, b in parts_from_message(msg):
                    if self.replay.fresh(f"{msg.job}|{src}", seq):
                        self.messages.append(protocol.step_message(b, src, seq))
                        n += 1
            elif msg is not None and self.replay.fresh(f"{msg.job}|{msg.src}", msg.seq):
                self.messages.append(msg)
                n += 1

    def wait_for(self, pred, timeout: float = 20.0) -> list[Message]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.05)
            hits = [m for m in self.messages if pred(m)]
            if hits:
                return hits
        raise AssertionError(f"no matching message within {timeout}s; got types "
                             f"{sorted({m.type for m in self.messages})}")

    def of_type(self, mtype: str) -> list[Message]:
        return [m for m in self.messages if m.type == mtype]

    def control(self, command: str, job: str = "j", incident: str | None = None, args: dict | None = None,
                target: int | None = None) -> int:
        body = {"command": command, "args": args or {}, "incident": incident, "target": target}
        frame = protocol.encode(Message(protocol.CONTROL, job, "coordinator", self._seq(), body))
        assert self.sock is not None
        for ident in self.peers:
            self.sock.send_multipart([ident, frame])
        return len(self.peers)

    def ack(self) -> None:
        frame = protocol.encode(protocol.ack_message(self.replay, self._seq(), job="j"))
        for ident in self.peers:
            self.sock.send_multipart([ident, frame])

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
        stop_authenticator(self.ctx)
        self.ctx.term()


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RANKSCOPE_ATTACH", None)
    return env


def start_agent(tmp: Path, coordinator: str | None, *extra: str, listen: str | None = None,
                job: str = "j") -> tuple[subprocess.Popen, str]:
    listen = listen or f"ipc://{tmp}/agent.sock"
    cmd = [PY, "-m", "rankscope", "agent", "--listen", listen, "--job", job,
           "--spool", str(tmp / "spool"), "--bundle-dir", str(tmp / "bundles"), *extra]
    if coordinator:
        cmd += ["--coordinator", coordinator]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(tmp / "agent.log", "ab"),
                            cwd=ROOT, env=_env(), text=True)
    _reader(proc)
    line = _readline(proc, 30.0)
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(f"agent did not start: {line!r}; log: {(tmp / 'agent.log').read_text()[-2000:]}")
    return proc, line.rsplit(" ", 1)[-1].strip()


def start_rank(endpoint: str, *args: str) -> subprocess.Popen:
    cmd = [PY, str(ROOT / "tests" / "node_fake_rank.py"), "--endpoint", endpoint, *args]
    return _reader(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=_env(),
                                    text=True))


def _reader(proc: subprocess.Popen) -> subprocess.Popen:
    # A thread per process: select() on a buffered text pipe misses lines already read
    # into Python's buffer.
    proc.lines = queue.Queue()  # type: ignore[attr-defined]

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            proc.lines.put(line)  # type: ignore[attr-defined]

    threading.Thread(target=pump, daemon=True).start()
    return proc


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    try:
        return proc.lines.get(timeout=max(0.0, timeout))  # type: ignore[attr-defined]
    except queue.Empty:
        return ""


def wait_event(proc: subprocess.Popen, event: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = _readline(proc, max(0.0, deadline - time.monotonic()))
        if not line:
            if proc.poll() is not None:
                break
            continue
        doc = json.loads(line)
        if doc.get("event") == event:
            return doc
    err = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
    raise AssertionError(f"rank pid {proc.pid}: no {event!r} event (exit {proc.poll()}): {err[-2000:]}")


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode
