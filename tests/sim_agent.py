"""A scripted node agent for coordinator tests: a real DEALER on a real socket speaking
the real wire protocol, so each test decides exactly what the coordinator sees and
checks exactly what it sends back."""
from __future__ import annotations

import time
from pathlib import Path

import zmq

from rankscope.wire import protocol
from rankscope.wire.protocol import Message
from rankscope.wire.records import StepBatch
from rankscope.wire.shards import ShardMap
from rankscope.wire.transport import connect_dealer


class SimAgent:
    def __init__(self, endpoint: str, job: str, identity: bytes = b"agent:sim:1") -> None:
        self.job = job
        self.ctx = zmq.Context()
        self.sock = connect_dealer(self.ctx, endpoint, identity)
        self.decoder = protocol.Decoder()
        self.seqs: dict[str, protocol.SeqCounter] = {}
        self.acks: list[dict] = []
        self.last_frame: bytes | None = None

    def send(self, mtype: str, body: dict, src: str) -> bytes:
        seq = self.seqs.setdefault(src, protocol.SeqCounter())()
        frame = protocol.encode(Message(mtype, self.job, src, seq, body))
        self.sock.send(frame)
        self.last_frame = frame
        return frame

    def register(self, rank: int, world_size: int) -> None:
        self.send(protocol.REGISTER, {"host": "simhost", "pid": 1000 + rank, "claimed_rank": rank, "assigned_rank": rank,
                                      "world_size": world_size}, f"rank:{rank}")

    def step(self, batch: StepBatch) -> bytes:
        msg = protocol.step_message(batch, f"rank:simhost:{batch.rank}", 0)
        seq = self.seqs.setdefault(msg.src, protocol.SeqCounter())()
        msg.seq = seq
        frame = protocol.encode(msg)
        self.sock.send(frame)
        return frame

    def status(self, what: str, rank: int, step: int, **detail) -> None:
        self.send(protocol.STATUS, {"what": what, "detail": {"rank": rank, "step": step, **detail}},
                  f"rank:simhost:{rank}")

    def send_files(self, paths: list[Path], root: Path, rank: int, transfer: str) -> int:
        from rankscope.rdr.transfer import iter_file_chunks
        n = 0
        for body in iter_file_chunks(paths, root, rank, transfer):
            self.send(protocol.BUNDLE_CHUNK, body, f"rank:simhost:{rank}")
            n += 1
        return n

    def send_bundle(self, rank: int, transfer: str, root: Path) -> Path:
        """Write a real RDR bundle (the bundle writer) and send it chunked, as a rank does on export."""
        from rankscope.rdr.bundle import write_bundle
        d = write_bundle(root, rank, reason=f"export {transfer}", steps=[])
        self.send_files([d], d.parent, rank, transfer)
        return d

    def recv(self, timeout: float = 10.0) -> Message | None:
        """Next message other than an ack (acks are kept in ``self.acks``)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                return None
            msg = self.decoder.decode(self.sock.recv())
            if msg is None:
                continue
            if msg.type == protocol.STATUS and msg.body.get("what") == "ack":
                self.acks.append(msg.body["detail"]["high"])
                continue
            return msg

    def expect_control(self, command: str, timeout: float = 15.0) -> Message:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.recv(deadline - time.monotonic())
            if msg is not None and msg.type == protocol.CONTROL and msg.body["command"] == command:
                return msg
        raise AssertionError(f"no CONTROL {command!r} within {timeout}s")

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


class RoutingAgent(SimAgent):
    """SimAgent that sends STEP records to the shards named in the registration reply."""

    def learn_shards(self, ranks: int) -> dict:
        detail, answered = None, 0
        while answered < ranks:
            msg = self.recv(30.0)
            assert msg is not None, "no registration reply within 30 s"
            if msg.body.get("what") == "job_config":  # the coordinator's greeting to every agent
                continue
            assert msg.body["what"] == "assigned", msg
            detail, answered = msg.body["detail"]["shards"], answered + 1
        self.map = ShardMap.from_wire(detail)
        self.shard_socks = [connect_dealer(self.ctx, ep, b"agent:sim:1") for ep in detail["endpoints"]]
        return detail

    def step(self, batch) -> bytes:
        for sock, part in zip(self.shard_socks, self.map.split(batch)):
            msg = protocol.step_message(part, f"rank:simhost:{batch.rank}", 0)
            msg.seq = self.seqs.setdefault(msg.src, protocol.SeqCounter())()
            sock.send(protocol.encode(msg))
        return b""

    def close(self) -> None:
        for s in getattr(self, "shard_socks", ()):
            s.close(linger=0)
        super().close()


def wait_for(fn, timeout: float = 20.0, every: float = 0.05):
    """Poll ``fn`` until it returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s (last value: {last!r:.500})")
