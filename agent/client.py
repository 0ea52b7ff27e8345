"""The in-rank client: a probe Sink that streams steps to the node agent.

The training thread only ever appends to a bounded deque (``emit``); a background thread
owns the ZeroMQ socket and does everything else: registration, sending, heartbeats,
reconnection, control (pause / resume / step N / terminate -> :class:`StepGate`) and
export (bundle files -> BUNDLE_CHUNKs). When the queue is full the step is dropped and
counted -- training never waits for the wire. Names of a dropped step are carried on the
next one sent, and after a reconnect the whole name table is sent again, so the receiver
can always read ids. Without a node agent the client stays silent: ``register`` returns
None quickly and ``emit`` costs one append. The I/O thread's work is in
:mod:`agent.client_io`, file transfers in :mod:`agent.client_transfer`.
"""
from __future__ import annotations

import atexit
import collections
import logging
import os
import queue
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

import zmq

from agent import protocol
from agent.control import RankscopeTerminated, StepGate
from agent.records import StepOutput
from agent.client_io import ClientIO
from agent.transport import CurveKeys, connect_watched_dealer

log = logging.getLogger(__name__)

#: How long ``register`` waits for a connection to exist before concluding there is no agent.
CONNECT_GRACE_S = 0.5


@dataclass
class RankClaim:
    """What a rank process says about itself when it registers."""

    host: str
    pid: int
    claimed_rank: int | None
    world_size: int | None = None
    dp_index: int | None = None
    device_id: int | None = None
    local_rank: int | None = None
    label: str = ""

    @classmethod
    def here(cls, claimed_rank: int | None, **fields) -> "RankClaim":
        return cls(host=socket.gethostname(), pid=os.getpid(), claimed_rank=claimed_rank, **fields)

    def body(self) -> dict:
        body = {k: v for k, v in asdict(self).items() if v is not None and v != "" or k == "claimed_rank"}
        body["versions"] = _versions()
        return body


def _versions() -> dict:
    """What this rank runs, for the coordinator's report (mismatched builds are a classic)."""
    import importlib.metadata
    import platform

    out = {"python": platform.python_version()}
    for dist in ("rankscope", "mindspore", "numpy", "pyzmq"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except Exception:  # not installed (or broken metadata): leave it out
            pass
    return out


class AgentClient:
    def __init__(self, endpoint: str, job: str, gate: StepGate, *, queue_max: int = 256,
                 heartbeat_s: float = 1.0, curve: CurveKeys | None = None,
                 on_export: Callable[[str | None], Iterable[Path]] | None = None,
                 dump_path: str | None = None) -> None:
        if queue_max < 1:
            raise ValueError(f"queue_max must be >= 1, got {queue_max}")
        self.endpoint, self.job, self.gate = endpoint, job, gate
        self.queue_max, self.heartbeat_s, self.on_export = queue_max, heartbeat_s, on_export
        # For ``rankscope collect``: where this rank's msProbe-layout dump is.
        self.dump_path = dump_path or os.environ.get("RANKSCOPE_DUMP_PATH")
        self._curve = curve
        self._pid = os.getpid()
        self.src = f"rank:{socket.gethostname()}:{self._pid}"
        self._identity = f"{self.src}:{uuid.uuid4().hex[:8]}".encode()
        self._q: collections.deque = collections.deque()
        self._lost_names: dict[int, str] = {}
        self._lock = threading.Lock()
        self.dropped = 0  # steps dropped because the queue was full
        self.sent = 0
        self.assigned: int | None = None
        self.remapped = False
        self._claim: RankClaim | None = None
        self._want_register = False  # set by register(), cleared by the I/O thread once sent
        self._registered = threading.Event()
        self._connected = threading.Event()
        self._outbox: queue.Queue = queue.Queue(maxsize=16)  # ("chunk"|"status", body) from exporters
        self._closing = threading.Event()
        self._last_step = -1
        self._thread = threading.Thread(target=self._run, name="rankscope-agent-client", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    # --- training thread ------------------------------------------------------------
    def emit(self, out: StepOutput) -> None:
        """Queue the step for sending; drop (and count) when the queue is full. Never blocks."""
        try:
            if os.getpid() != self._pid or self._closing.is_set():
                return  # a forked child has no I/O thread
            batch = out.batch
            self._last_step = batch.step
            if len(self._q) >= self.queue_max:
                self.dropped += 1
                if batch.new_names:
                    with self._lock:
                        self._lost_names.update(batch.new_names)
                return
            self._q.append(batch)
        except Exception:  # a Sink must never raise into training
            pass

    def register(self, claim: RankClaim, timeout: float = 2.0) -> int | None:
        """Tell the agent who this rank is; return the id to use (maybe remapped), or
        None when no agent answers within ``timeout``."""
        self._claim = claim
        self._registered.clear()
        self._want_register = True
        if self.endpoint.startswith("ipc://") and not os.path.exists(self.endpoint[len("ipc://"):]):
            return None  # nobody listens there: do not make training wait
        start = time.monotonic()
        if not self._connected.wait(min(timeout, CONNECT_GRACE_S)):
            return None
        if not self._registered.wait(max(0.0, timeout - (time.monotonic() - start))):
            return None
        return self.assigned

    @property
    def rank(self) -> int | None:
        if self.assigned is not None:
            return self.assigned
        return self._claim.claimed_rank if self._claim is not None else None

    def close(self, timeout: float = 2.0, ok: bool = True, error: str = "") -> None:
        """Flush what is queued (up to ``timeout``), say goodbye, stop the thread."""
        if self._closing.is_set() or os.getpid() != self._pid:
            return
        self._bye = {"ok": ok, "error": error}
        deadline = time.monotonic() + timeout
        while self._q and self._connected.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._closing.set()
        self._thread.join(max(0.1, deadline - time.monotonic()))
        try:
            atexit.unregister(self._at_exit)
        except Exception:
            pass

    def _at_exit(self) -> None:
        # An uncaught exception has been printed by now and left in sys.last_value.
        exc = getattr(sys, "last_value", None)
        failed = exc is not None and not isinstance(exc, (SystemExit, RankscopeTerminated))
        self.close(timeout=1.0, ok=not failed, error=repr(exc)[:500] if failed else "")

    # --- I/O thread ------------------------------------------------------------------
    def _run(self) -> None:
        ctx = zmq.Context()
        seq = protocol.SeqCounter()
        try:
            sock, watch = connect_watched_dealer(ctx, self.endpoint, self._identity, self._curve)
        except Exception as exc:
            log.warning("rankscope: cannot connect to the node agent at %s: %s", self.endpoint, exc)
            ctx.term()
            return
        io = ClientIO(self, sock, seq)
        progressed: bool | None = None  # did the last pump send anything (None: not connected)
        try:
            while not self._closing.is_set():
                for up in watch.changes():
                    if up:
                        io.on_connect()
                        self._connected.set()
                    else:
                        self._connected.clear()
                if self._want_register and watch.connected and self._claim is not None:
                    body = self._claim.body()
                    if self.assigned is not None:
                        body["assigned_rank"] = self.assigned  # keep our id across an agent restart
                    self._want_register = not io.send(protocol.REGISTER, body)
                # Do not sleep in poll while steps are waiting and the socket takes them;
                # when it does not (high-water mark), back off instead of spinning.
                busy = progressed and (self._q or io.pending_out is not None or not self._outbox.empty())
                # Disconnected, wake rarely: a rank with no agent should not pay for one.
                idle_ms = 20 if watch.connected else 100
                if sock.poll(0 if busy else (5 if progressed else idle_ms), zmq.POLLIN):
                    io.receive()
                progressed = io.pump() > 0 if watch.connected else None
            if watch.connected:
                io.pump()
                bye = getattr(self, "_bye", {"ok": True, "error": ""})
                io.send(protocol.STATUS, {"what": "bye", "detail": {**bye, "step": self._last_step}})
        except Exception:
            log.exception("rankscope: node agent client stopped")
        finally:
            watch.close()
            sock.close(linger=500)
            ctx.term()
