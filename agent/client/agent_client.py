"""The in-rank client: a probe Sink that streams steps to the node agent.

The training thread only ever appends to a bounded deque (``emit``); a background thread
owns the ZeroMQ socket and does everything else: registration, sending, heartbeats,
reconnection, control (pause / resume / step N / terminate -> :class:`StepGate`) and
export (bundle files -> BUNDLE_CHUNKs). When the queue is full the oldest step is dropped
and counted -- training never waits for the wire. Names of a dropped step are carried on the
next one sent, and after a reconnect the whole name table is sent again, so the receiver
can always read ids. Without a node agent the client stays silent: ``register`` returns
None quickly and ``emit`` costs one append. The I/O thread's work is in
:mod:`rankscope.client.io_thread`, file transfers in :mod:`rankscope.client.transfers`.
"""
from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable

import zmq

from rankscope.client.claim import RankClaim
from rankscope.client.io_thread import ClientIO
from rankscope.client.state import ClientState
from rankscope.probe.gate import RankscopeTerminated, StepGate
from rankscope.probe.comm.sync_tracker import SyncTracker
from rankscope.wire import protocol
from rankscope.wire.records import StepBatch, StepOutput
from rankscope.wire.transport import CurveKeys, connect_watched_dealer

log = logging.getLogger(__name__)

#: The in-rank buffer: enough steps to ride out a node agent restart (a second or two) at
#: any realistic step rate, and a byte cap so a model with many tensors stays small.
QUEUE_MAX_STEPS = 1024
QUEUE_MAX_BYTES = 64 << 20

#: How long ``register`` waits for a connection to exist before concluding there is no agent.
#: Generous: on a loaded node a local connect can take a second, and a rank that gives
#: up too soon runs unwatched; only a rank configured for an agent ever waits.
CONNECT_GRACE_S = 2.0


def error_line(value: BaseException, limit: int = 500) -> str:
    """An uncaught exception as the one line a verdict shows: its repr, or, for a message
    of several lines (MindSpore frames its kernel errors in banners and call stacks), its
    type and the first two lines that say something."""
    text = str(value)
    if "\n" not in text:
        return repr(value)[:limit]
    said = [ln.strip().lstrip("- ").strip() for ln in text.splitlines()]
    said = [ln for ln in said if ln and set(ln) - set("-=*#~ ")]
    return f"{type(value).__name__}: {' '.join(said[:2])}"[:limit]


def batch_bytes(batch: StepBatch) -> int:
    """What a queued step holds, near enough (its arrays; names are few after step 0)."""
    return 73 * len(batch) + 64


class AgentClient:
    def __init__(self, endpoint: str, job: str, gate: StepGate, *, queue_max: int = QUEUE_MAX_STEPS,
                 queue_max_bytes: int = QUEUE_MAX_BYTES,
                 heartbeat_s: float = 1.0, curve: CurveKeys | None = None,
                 on_export: Callable[[str | None], Iterable[Path]] | None = None,
                 dump_path: str | None = None, sync: SyncTracker | None = None) -> None:
        if queue_max < 1:
            raise ValueError(f"queue_max must be >= 1, got {queue_max}")
        self.endpoint = endpoint
        self._curve = curve
        src = f"rank:{socket.gethostname()}:{os.getpid()}"
        self.state = ClientState(job=job, src=src, gate=gate, queue_max=queue_max, heartbeat_s=heartbeat_s,
                                 queue_max_bytes=queue_max_bytes,
                                 on_export=on_export,
                                 dump_path=dump_path or os.environ.get("RANKSCOPE_DUMP_PATH"), sync=sync)
        self._identity = f"{src}:{uuid.uuid4().hex[:8]}".encode()
        self._thread = threading.Thread(target=self._run, name="rankscope-agent-client", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)
        self._chain_excepthook()

    # --- what the probe reads ---------------------------------------------------------
    @property
    def job(self) -> str:
        return self.state.job

    @property
    def assigned(self) -> int | None:
        """The node agent's (possibly remapped) id, once it answered."""
        return self.state.assigned

    @property
    def remapped(self) -> bool:
        return self.state.remapped

    @property
    def dropped(self) -> int:
        return self.state.dropped

    @property
    def sent(self) -> int:
        return self.state.sent

    @property
    def rank(self) -> int | None:
        return self.state.rank

    # --- training thread ------------------------------------------------------------
    def emit(self, out: StepOutput) -> None:
        """Queue the step for sending; drop (and count) when the queue is full. Never blocks."""
        st = self.state
        try:
            if os.getpid() != st.pid or st.closing.is_set():
                return  # a forked child has no I/O thread
            batch = out.batch
            st.last_step = batch.step
            # Full (in steps, or in bytes judged by this step's size): the oldest step
            # goes, so what is kept is the newest - the steps nearest a fault.
            while st.queue and (len(st.queue) >= st.queue_max
                                or (len(st.queue) + 1) * batch_bytes(batch) > st.queue_max_bytes):
                try:
                    old = st.queue.popleft()
                except IndexError:  # the I/O thread took it meanwhile
                    break
                st.dropped += 1
                if old.new_names:
                    with st.lock:
                        st.lost_names.update(old.new_names)
            st.queue.append(batch)
        except Exception:  # a Sink must never raise into training
            pass

    def say_first(self, kind: str, body: dict) -> None:
        """A STATUS the coordinator needs before this rank's next step (its layout facts):
        sent ahead of every step queued after it, and again after a reconnect. Never blocks."""
        if kind != "status" or os.getpid() != self.state.pid:
            return
        with self.state.lock:
            self.state.first = dict(body)

    def register(self, claim: RankClaim, timeout: float = 2.0) -> int | None:
        """Tell the agent who this rank is; return the id to use (maybe remapped), or
        None when no agent answers within ``timeout``."""
        st = self.state
        st.claim = claim
        st.registered.clear()
        st.want_register = True
        if self.endpoint.startswith("ipc://") and not os.path.exists(self.endpoint[len("ipc://"):]):
            return None  # nobody listens there: do not make training wait
        start = time.monotonic()
        if not st.connected.wait(min(timeout, CONNECT_GRACE_S)):
            return None
        if not st.registered.wait(max(0.0, timeout - (time.monotonic() - start))):
            return None
        return st.assigned

    def close(self, timeout: float = 2.0, ok: bool = True, error: str = "") -> None:
        """Flush what is queued (up to ``timeout``), say goodbye, stop the thread."""
        st = self.state
        if st.closing.is_set() or os.getpid() != st.pid:
            return
        st.bye = {"ok": ok, "error": error}
        deadline = time.monotonic() + timeout
        while st.queue and st.connected.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        st.closing.set()
        self._thread.join(max(0.1, deadline - time.monotonic()))
        try:
            atexit.unregister(self._at_exit)
        except Exception:
            pass

    def _chain_excepthook(self) -> None:
        """An uncaught exception ends the rank, but the process may take seconds more to
        exit (non-daemon threads, runtime teardown): tell the node agent at once."""
        prev = sys.excepthook

        def hook(tp, value, tb):
            if not issubclass(tp, (SystemExit, RankscopeTerminated)):
                self.dying(error_line(value))
            prev(tp, value, tb)
        sys.excepthook = hook

    def dying(self, error: str) -> None:
        """The rank is going down with ``error``: say goodbye now (the I/O thread sends it
        after what is queued), without waiting for the interpreter's exit."""
        st = self.state
        if os.getpid() != st.pid or st.closing.is_set():
            return
        st.bye = {"ok": False, "error": error}
        st.dying.set()
        deadline = time.monotonic() + 1.0
        while not st.bye_sent.is_set() and st.connected.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _at_exit(self) -> None:
        # An uncaught exception has been printed by now and left in sys.last_value.
        exc = getattr(sys, "last_value", None)
        failed = exc is not None and not isinstance(exc, (SystemExit, RankscopeTerminated))
        self.close(timeout=1.0, ok=not failed, error=repr(exc)[:500] if failed else "")

    # --- I/O thread ------------------------------------------------------------------
    def _bye(self, io: ClientIO) -> None:
        st = self.state
        if io.send(protocol.STATUS, {"what": "bye", "detail": {**st.bye, "step": st.last_step}}):
            st.bye_sent.set()

    def _run(self) -> None:
        st = self.state
        ctx = zmq.Context()
        try:
            sock, watch = connect_watched_dealer(ctx, self.endpoint, self._identity, self._curve)
        except Exception as exc:
            log.warning("rankscope: cannot connect to the node agent at %s: %s", self.endpoint, exc)
            ctx.term()
            return
        io = ClientIO(st, sock, protocol.SeqCounter())
        progressed: bool | None = None  # did the last pump send anything (None: not connected)
        try:
            while not st.closing.is_set():
                for up in watch.changes():
                    if up:
                        io.on_connect()
                        st.connected.set()
                    else:
                        st.connected.clear()
                if st.want_register and watch.connected and st.claim is not None:
                    body = st.claim.body()
                    if st.assigned is not None:
                        body["assigned_rank"] = st.assigned  # keep our id across an agent restart
                    st.want_register = not io.send(protocol.REGISTER, body)
                # Do not sleep in poll while steps are waiting and the socket takes them;
                # when it does not (high-water mark), back off instead of spinning.
                busy = progressed and (st.queue or io.pending_out is not None or not st.outbox.empty())
                # Disconnected, wake rarely: a rank with no agent should not pay for one.
                idle_ms = 20 if watch.connected else 100
                if sock.poll(0 if busy else (5 if progressed else idle_ms), zmq.POLLIN):
                    io.receive()
                progressed = io.pump() > 0 if watch.connected else None
                if st.dying.is_set() and not st.bye_sent.is_set() and watch.connected and not st.queue:
                    self._bye(io)
            if watch.connected:
                io.pump()
                if not st.bye_sent.is_set():
                    self._bye(io)
        except Exception:
            log.exception("rankscope: node agent client stopped")
        finally:
            watch.close()
            sock.close(linger=500)
            ctx.term()
