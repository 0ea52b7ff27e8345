"""Whether the coordinator terminated a job, as a node agent heard it: the question
``rankscope launch --agent`` asks its host's agent while the command runs.

A single-node launch sees the coordinator's ``terminated`` in its status and kills the
command's tree after a grace period, because ranks blocked inside a collective (their
peer on another node died) never reach the step boundary where they would obey. A
launch on another node has no coordinator handle: the node agent relayed the terminate
to its ranks, so it is the one to ask. Same STATUS shape as :mod:`.job_config`.
"""
from __future__ import annotations

from typing import Any

from rankscope.wire.job_config import detail_value

#: STATUS ``what`` of launch's question and the agent's answer.
WHAT = "job_state"


def body(terminated: bool | None) -> dict:
    """The STATUS body: None asks, a bool answers."""
    return {"what": WHAT, "detail": {} if terminated is None else {"terminated": bool(terminated)}}


def terminated_of(msg_body: Any) -> bool | None:
    """The answer a STATUS body carries, or None when it carries none."""
    value = detail_value(msg_body, WHAT, "terminated")
    return value if isinstance(value, bool) else None


class TerminatedWatch:
    """Asks this host's node agent, at most once per ``every_s``, whether the job was
    terminated; :meth:`poll` never blocks (launch's loop calls it every half second)."""

    def __init__(self, endpoint: str, job: str, every_s: float = 1.0) -> None:
        import os

        import zmq

        from rankscope.wire import protocol
        from rankscope.wire.transport import connect_dealer
        self._zmq, self._protocol = zmq, protocol
        self.job, self.every_s = job, every_s
        self._src = f"launch-watch:{os.getpid()}"
        self._sock = connect_dealer(zmq.Context.instance(), endpoint, f"launch-watch-{os.getpid()}".encode())
        self._decoder = protocol.Decoder(job=None)
        self._seq = protocol.SeqCounter()
        self._next = 0.0
        self.terminated = False

    def poll(self, now: float) -> bool:
        zmq, protocol = self._zmq, self._protocol
        while self._sock.poll(0):
            msg = self._decoder.decode(self._sock.recv())
            if msg is not None and msg.type == protocol.STATUS and terminated_of(msg.body):
                self.terminated = True
        if not self.terminated and now >= self._next:
            self._next = now + self.every_s
            frame = protocol.encode(protocol.Message(protocol.STATUS, self.job, self._src, self._seq(), body(None)))
            try:
                self._sock.send(frame, flags=zmq.NOBLOCK)
            except zmq.Again:  # the agent is not reachable right now: ask at the next turn
                pass
        return self.terminated

    def close(self) -> None:
        self._sock.close(linger=0)
