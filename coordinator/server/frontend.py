"""The coordinator's ZeroMQ front end: one thread owning the ROUTER socket.

Node agents (DEALER) send rank traffic here; control goes back on the same
connection. The thread is the only one touching the socket and the logic core, so
neither needs a lock: other threads (Ray method calls) hand work in through
:meth:`Frontend.call`, which runs a function on the loop thread between polls.

Ingest cost is per *frame* (one rank-step, or a node agent's pack of them: STEPS), never
per tensor: frames are drained in bursts, validated by ``protocol.Decoder``, de-duplicated
by ``ReplayFilter`` (a pack part by part) and the resulting StepBatches are handed to the
core together.
"""
from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq

from rankscope.coordinator.server.clock import ClockOffset
from rankscope.wire import protocol
from rankscope.wire.protocol import Message
from rankscope.wire.step_pack import StepPack

log = logging.getLogger(__name__)

#: How often each agent's clock offset is measured again.
CLOCK_PROBE_S = 5.0
#: At most this many frames are drained before the loop runs ticks and calls again,
#: so a flood of steps cannot starve detection or control.
MAX_BURST = 2048
#: Frames queued per connected agent before libzmq stops reading from it (its own send
#: queue then fills and it spools): a step of every rank behind one agent must fit, and
#: what is queued is this process's memory (~10 KB a frame of 128 records: 200 MB).
RCVHWM = 20_000
#: Frames queued to one agent before a send fails: with shards, the registration replies of
#: every rank behind an agent go out in one tick, and libzmq's default 1000 dropped the rest.
SNDHWM = 20_000


@dataclass
class Peer:
    """A connected sender (normally a node agent) and the ranks seen through it."""

    identity: bytes
    last_seen: float
    ranks: set[tuple[str, int]] = field(default_factory=set)
    #: "job|src" -> highest seq taken from this peer, acknowledged (STATUS "ack") so the
    #: node agent can trim its spool (it keys its frames the same way, as the replay
    #: filter does: two jobs' ranks may share a src); ``unacked`` says an ack is due.
    high: dict[str, int] = field(default_factory=dict)
    unacked: bool = False
    #: The agent's clock offset to ours: its times are moved onto our clock with it.
    clock: ClockOffset = field(default_factory=ClockOffset)
    next_clock_probe: float = 0.0


class Handlers:
    """What the front end calls with decoded traffic; the service implements it.

    ``on_steps`` gets every STEP of one burst at once (so the core can work on them
    together); ``on_message`` gets every other message type; ``on_tick`` runs every
    ``tick_s`` on the loop thread.
    """

    def on_steps(self, batches: list) -> None: ...

    def on_message(self, msg: Message, peer: Peer) -> None: ...

    def on_tick(self, now: float) -> None: ...


class Frontend:
    def __init__(self, handlers: Handlers, bind: str = "tcp://127.0.0.1:0", *, curve: Any = None,
                 job: str | None = None, tick_s: float = 0.05, ack_s: float = 0.5,
                 clock_probes: bool = True, whole_packs: bool = False) -> None:
        """``clock_probes``: measure each agent's clock offset (a front end that moves no
        agent times onto its clock, an ingest shard's, asks for none). ``whole_packs``: hand
        a STEPS frame's parts on as one :class:`StepPack` (an ingest shard's core takes
        them whole), not as a StepBatch each."""
        self.handlers = handlers
        self.clock_probes = clock_probes
        self.whole_packs = whole_packs
        self.ack_s = ack_s
        self.bind = bind
        self.curve = curve
        self.tick_s = tick_s
        self.decoder = protocol.Decoder(job=job)
        self.replay = protocol.ReplayFilter()
        self.peers: dict[bytes, Peer] = {}
        self.endpoint: str | None = None
        self.frames_in = 0
        self.first_step_wall: float | None = None
        self.last_step_wall: float | None = None
        self._seq = protocol.SeqCounter()
        #: A STATUS body every agent gets once, when it is first heard (the job's config).
        self.greeting: dict | None = None
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._sock: zmq.Socket | None = None
        self._ctx: zmq.Context | None = None

    # --- lifecycle -------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> str:
        self._thread = threading.Thread(target=self._run, name="rankscope-frontend", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"front end did not bind {self.bind} within {timeout}s")
        if self._error is not None:
            raise RuntimeError(f"front end failed to bind {self.bind}: {self._error}") from self._error
        assert self.endpoint is not None
        return self.endpoint

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Run ``fn`` on the loop thread (the owner of the socket and the core)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if not self.alive:
            fut.set_exception(RuntimeError("front end is not running"))
            return fut
        self._calls.put((fut, fn, args, kwargs))
        return fut

    def call_sync(self, fn: Callable[..., Any], *args: Any, timeout: float = 30.0, **kwargs: Any) -> Any:
        return self.call(fn, *args, **kwargs).result(timeout)

    # --- sending (loop thread only) ----------------------------------------------------
    def send_status(self, ident: bytes, what: str, *, job: str = "", detail: dict | None = None) -> bool:
        """One STATUS to one peer; False when it could not be delivered."""
        frame = protocol.encode(Message(protocol.STATUS, job, "coordinator", self._seq(),
                                        {"what": what, "detail": dict(detail or {})}))
        try:
            self._sock.send_multipart([ident, frame], flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            log.warning("status %s not delivered to %r: %s", what, ident, exc)
            return False

    def send_control(self, command: str, *, job: str = "", args: dict | None = None,
                     incident: str | None = None, target: int | None = None,
                     peers: list[bytes] | None = None) -> int:
        """Send one CONTROL to every peer (or ``peers``); returns how many it reached."""
        body: dict[str, Any] = {"command": command, "args": dict(args or {}), "incident": incident,
                                "target": target}
        frame = protocol.encode(Message(protocol.CONTROL, job, "coordinator", self._seq(), body))
        sent = 0
        for ident in list(peers if peers is not None else self.peers):
            try:
                self._sock.send_multipart([ident, frame], flags=zmq.NOBLOCK)
                sent += 1
            except zmq.ZMQError as exc:  # gone (ROUTER_MANDATORY) or its queue is full
                log.warning("control %s not delivered to %r: %s", command, ident, exc)
                if exc.errno == zmq.EHOSTUNREACH:
                    self.peers.pop(ident, None)
        return sent

    def probe_clocks(self, now: float) -> None:
        """Ask each agent for its clock now and then (more often until it has answered)."""
        for peer in list(self.peers.values()):
            if now < peer.next_clock_probe:
                continue
            peer.next_clock_probe = now + (CLOCK_PROBE_S if peer.clock.error is not None else 0.5)
            body = {"what": "clock", "detail": {"t1": time.time()}}
            # Our job, not "": the agent answers with the probe's job, and a front end
            # serving one job rejects frames of any other.
            frame = protocol.encode(Message(protocol.STATUS, self.decoder.job or "", "coordinator", self._seq(), body))
            try:
                self._sock.send_multipart([peer.identity, frame], flags=zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:
                    self.peers.pop(peer.identity, None)

    def _greet(self, peer: Peer) -> None:
        if self.greeting is None:
            return
        frame = protocol.encode(Message(protocol.STATUS, "", "coordinator", self._seq(), self.greeting))
        try:
            self._sock.send_multipart([peer.identity, frame], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the agent is asked again if it reconnects as a new peer
            log.warning("job config not delivered to %r: %s", peer.identity, exc)

    def send_acks(self) -> None:
        """Tell each agent what arrived, per sender: its spool may drop those frames."""
        for peer in list(self.peers.values()):
            if not peer.unacked:
                continue
            body = {"what": "ack", "detail": {"high": dict(peer.high)}}
            frame = protocol.encode(Message(protocol.STATUS, "", "coordinator", self._seq(), body))
            try:
                self._sock.send_multipart([peer.identity, frame], flags=zmq.NOBLOCK)
                peer.unacked = False
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:
                    self.peers.pop(peer.identity, None)

    def peers_for(self, job: str, rank: int | None = None) -> list[bytes]:
        return [p.identity for p in self.peers.values()
                if any(j == job and (rank is None or r == rank) for j, r in p.ranks)]

    # --- the loop ----------------------------------------------------------------------
    def _open(self) -> None:
        from rankscope.wire.transport import (
            bind_router,  # CURVE, MAXMSGSIZE, refuses non-local plaintext
        )
        self._ctx = zmq.Context()
        self._sock, self.endpoint = bind_router(self._ctx, self.bind, curve=self.curve, rcvhwm=RCVHWM,
                                                 sndhwm=SNDHWM)
        # Fail loudly on unknown identities instead of dropping control silently.
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)

    def _run(self) -> None:
        try:
            self._open()
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        next_tick = time.monotonic() + self.tick_s
        next_ack = time.monotonic() + self.ack_s
        try:
            while not self._stop.is_set():
                # At least 1 ms: libzmq takes whole milliseconds, and 0 would spin until the tick.
                wait_ms = max(1, int((next_tick - time.monotonic()) * 1000.0))
                if poller.poll(min(wait_ms, self.tick_s * 1000.0)):
                    self._drain()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + self.tick_s
                    self._guard(self.handlers.on_tick, now)
                # After the tick, not before: a status or a console snapshot asked meanwhile
                # never holds back the steps due to be judged (the tick is where they are).
                self._run_calls()
                if now >= next_ack:
                    next_ack = now + self.ack_s
                    self._guard(self.send_acks)
                    if self.clock_probes:
                        self._guard(self.probe_clocks, now)
        finally:
            from rankscope.wire.transport import stop_authenticator
            self._fail_pending_calls()
            self._sock.close(linger=0)
            stop_authenticator(self._ctx)
            self._ctx.term()

    def _drain(self) -> None:
        sock, decode, fresh = self._sock, self.decoder.decode, self.replay.fresh
        steps: list = []
        now = time.monotonic()
        for _ in range(MAX_BURST):
            try:
                parts = sock.recv_multipart(flags=zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            self.frames_in += 1
            if len(parts) < 2:
                continue
            msg = decode(parts[-1])
            if msg is None:
                continue
            packed = msg.type == protocol.STEPS
            key = f"{msg.job}|{msg.src}"
            # A STEPS frame is de-duplicated part by part: each part is a rank's own STEP.
            if not (packed or fresh(key, msg.seq)):
                continue
            ident = parts[0]
            peer = self.peers.get(ident)
            if peer is None:
                peer = self.peers[ident] = Peer(ident, now)
                self._greet(peer)
            peer.last_seen = now
            peer.unacked = True
            if packed:
                self._take_pack(msg, peer, steps)
                continue
            if msg.seq > peer.high.get(key, -1):
                peer.high[key] = msg.seq
            if msg.type == protocol.STATUS and msg.body["what"] == "clock":
                d = msg.body.get("detail") or {}
                if isinstance(d.get("t1"), (int, float)) and isinstance(d.get("t2"), (int, float)):
                    peer.clock.add(float(d["t1"]), float(d["t2"]), time.time())
                continue
            if msg.type == protocol.STEP:
                steps.append(protocol.step_from_message(msg))
                peer.ranks.add((msg.job, msg.body["rank"]))
            else:
                # Keep arrival order: a rank's "finished" or "paused" must not overtake its steps.
                if steps:
                    self._steps(steps)
                    steps = []
                rank = msg.body.get("rank")
                if isinstance(rank, int) and msg.type != protocol.BUNDLE_CHUNK:
                    peer.ranks.add((msg.job, rank))
                self._guard(self.handlers.on_message, msg, peer)
        if steps:
            self._steps(steps)

    def _take_pack(self, msg: Message, peer: Peer, steps: list) -> None:
        pack = StepPack(msg)
        fresh, high, ranks, job = self.replay.fresh, peer.high, peer.ranks, msg.job
        kept = []
        for i, (src, seq, rank) in enumerate(zip(pack.src, pack.seq, pack.ranks)):
            key = f"{job}|{src}"
            if not fresh(key, seq):
                continue
            if seq > high.get(key, -1):
                high[key] = seq
            kept.append(i)
            ranks.add((job, rank))
        if self.whole_packs and len(kept) == len(pack.ranks):
            steps.append(pack)
        else:  # parts already taken (a replay) are dropped one by one
            parts = pack.batches()
            steps += [parts[i] for i in kept]

    def _steps(self, steps: list) -> None:
        wall = time.time()
        if self.first_step_wall is None:
            self.first_step_wall = wall
        self.last_step_wall = wall
        self._guard(self.handlers.on_steps, steps)

    def _run_calls(self) -> None:
        while True:
            try:
                fut, fn, args, kwargs = self._calls.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                fut.set_exception(exc)

    def _fail_pending_calls(self) -> None:
        while True:
            try:
                fut, *_ = self._calls.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(RuntimeError("front end stopped"))

    @staticmethod
    def _guard(fn: Callable[..., Any], *args: Any) -> None:
        # One bad message or handler bug must not kill the only ingest thread.
        try:
            fn(*args)
        except Exception:
            log.exception("front end handler %s failed", getattr(fn, "__name__", fn))
