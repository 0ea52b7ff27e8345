"""The node agent loop: ranks in (ROUTER), coordinator out (DEALER), one thread.

Everything runs on one thread that owns both sockets, so no state needs a lock. Each
turn: drain rank frames (validate, record, forward), drain coordinator frames (control,
acks), answer registrations whose settle window passed, check liveness, pump the spool.
Rank frames are forwarded byte for byte (their src/seq intact, so the coordinator
de-duplicates spool replays); the agent adds its own REGISTER (with the assigned id),
RANK_LOST, RANK_MAP and STATUS messages.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import zmq

from agent import protocol
from agent.node.bundles import RankBundles
from agent.node.liveness import LivenessMonitor
from agent.node.names import NameLedger
from agent.node.registry import RankEntry, RankRegistry, RankState, write_rank_map
from agent.node.relay import ControlRelay
from agent.node.spool import SpoolLog
from agent.node.uplink import Uplink
from agent.protocol import Message, encode
from agent.transport import CurveKeys, bind_router, stop_authenticator

log = logging.getLogger(__name__)

_BURST = 1024  # frames per socket per turn, so one flood cannot starve the other side
#: How long a rank whose process is gone may still deliver what it sent before dying.
_EXIT_GRACE_S = 1.0


@dataclass
class AgentSettings:
    listen: str
    coordinator: str | None = None
    job: str | None = None  # None: serve any job
    spool_dir: Path = Path("rankscope-spool")
    bundle_dir: Path = Path("rankscope-agent-bundles")
    flight_recorder_steps: int = 8
    spool_max_bytes: int = 1 << 30
    heartbeat_timeout_s: float = 15.0
    settle_s: float = 0.3
    replay_window_s: float = 10.0
    listen_curve: CurveKeys | None = None  # CURVE server keys when --listen is not local
    coordinator_curve: CurveKeys | None = None  # CURVE client keys for a non-local coordinator
    host: str | None = None  # default: socket.gethostname()
    drain_s: float = 5.0  # on stop, how long to keep sending the backlog


class NodeAgent:
    def __init__(self, settings: AgentSettings) -> None:
        self.s = settings
        self.host = settings.host or socket.gethostname()
        self.src = f"agent:{self.host}:{os.getpid()}"
        # Time-based start: a restarted agent's seqs stay above what the coordinator's
        # replay filter remembers from the previous one.
        self._seq = protocol.SeqCounter(start=time.time_ns() // 1000)
        self.registry = RankRegistry(settle_s=settings.settle_s)
        self.liveness = LivenessMonitor(self.host, settings.heartbeat_timeout_s)
        self.bundles = RankBundles(Path(settings.bundle_dir), settings.flight_recorder_steps)
        self.relay = ControlRelay()
        self.decoder = protocol.Decoder(job=settings.job)
        self._updecoder = protocol.Decoder(job=None)
        self.names = NameLedger()
        self.forwarded = 0
        self.ctx = zmq.Context()
        self.router, self.endpoint = bind_router(self.ctx, settings.listen, settings.listen_curve)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.uplink: Uplink | None = None
        if settings.coordinator:
            spool = SpoolLog(settings.spool_dir, max_bytes=settings.spool_max_bytes)
            ident = self.src.encode()
            self.uplink = Uplink(self.ctx, settings.coordinator, ident, spool,
                                 curve=settings.coordinator_curve, replay_window_s=settings.replay_window_s)
        self._stop = threading.Event()
        self._dying: dict[int, tuple[float, object]] = {}  # id(entry) -> (first seen dead, Lost)
        self._ranks_drained = True  # the last drain emptied the rank socket

    # --- lifecycle -------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        if self.uplink is not None:
            poller.register(self.uplink.sock, zmq.POLLIN)
        next_check = next_status = 0.0
        try:
            while not self._stop.is_set():
                # A backlog (replay after a reconnect) is pumped without waiting for input.
                busy = self.uplink is not None and self.uplink.connected and self.uplink.backlog
                poller.poll(5 if busy else 50)
                self._drain_ranks()
                if self.uplink is not None:
                    self._drain_uplink()
                    for up in self.uplink.poll_link():
                        if up:
                            self._resend_state()
                for entry in self.registry.due():
                    self._answer(entry)
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + 0.2
                    self._check_liveness(now)
                if now >= next_status:
                    next_status = now + 2.0
                    self._status()
                if self.uplink is not None:
                    self.uplink.confirm()
                    self.uplink.pump()
            self._drain_on_stop()
        finally:
            self.close()

    def _drain_on_stop(self) -> None:
        """Stopping (SIGTERM at job end): take what ranks still sent and hand the backlog to
        the coordinator for up to ``drain_s``; what does not go stays in the spool."""
        self._drain_ranks()
        if self.uplink is None:
            return
        deadline = time.monotonic() + self.s.drain_s
        while self.uplink.connected and self.uplink.backlog and time.monotonic() < deadline:
            if not self.uplink.pump():
                time.sleep(0.01)
            self.uplink.poll_link()
        if self.uplink.backlog:
            log.warning("stopping with frames not yet sent; they stay in the spool %s and go first "
                        "when an agent starts on it again", self.s.spool_dir)

    def close(self) -> None:
        if self.uplink is not None:
            self.uplink.close()
            self.uplink = None
        self.router.close(0)
        stop_authenticator(self.ctx)
        self.ctx.term()

    # --- upstream helpers ----------------------------------------------------------------
    def _msg(self, mtype: str, job: str, body: dict, src: str | None = None) -> bytes:
        return encode(Message(mtype, job, src or self.src, self._seq(), body))

    def _up(self, frame: bytes, key: tuple[str, int] | None = None) -> None:
        if self.uplink is not None:
            self.uplink.send(frame, key)

    def _up_own(self, mtype: str, job: str, body: dict, src: str | None = None) -> None:
        seq = self._seq()
        src = src or self.src
        self._up(encode(Message(mtype, job, src, seq, body)), (f"{job}|{src}", seq))

    def _publish_map(self, job: str) -> None:
        rows = self.registry.rank_map(job)
        try:
            write_rank_map(self.bundles.root / job_dir(job) / "rank_map.json", rows)
        except OSError as exc:
            log.error("cannot write rank_map.json for job %s: %s", job, exc)
        self._up_own(protocol.RANK_MAP, job, {"entries": rows})

    # --- ranks -> agent ---------------------------------------------------------------
    def _drain_ranks(self) -> None:
        self._ranks_drained = False
        for _ in range(_BURST):
            try:
                parts = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                self._ranks_drained = True
                return
            if len(parts) != 2:
                self.decoder.rejected["bad_multipart"] += 1
                continue
            ident, frame = parts
            msg = self.decoder.decode(frame)
            if msg is not None:
                try:
                    self._on_rank(ident, frame, msg)
                except Exception:  # one odd message must not stop the node's agent
                    log.exception("handling %s from %s failed", msg.type, msg.src)

    def _on_rank(self, ident: bytes, frame: bytes, msg: Message) -> None:
        entry = self.registry.by_identity(ident)
        key = (f"{msg.job}|{msg.src}", msg.seq)
        if msg.type == protocol.STEP:
            self.names.note(key[0], msg.body["new_names"])
            if entry is not None:
                entry.last_step = max(entry.last_step, msg.body["step"])
                self.bundles.record(entry, protocol.step_from_message(msg))
            self._up(frame, key)
            self.forwarded += 1
        elif msg.type == protocol.HEARTBEAT:
            if entry is not None:
                entry.extra["src"] = key[0]
                entry.extra["state"] = msg.body["state"]
                if self.liveness.heartbeat(entry):
                    self._up_own(protocol.STATUS, entry.job, {"what": "rank_back", "detail": {
                        "rank": entry.assigned_rank, "pid": entry.pid}})
            if self.uplink is not None:
                self.uplink.send_volatile(frame)
        elif msg.type == protocol.REGISTER:
            body = dict(msg.body)
            if body["pid"] <= 0 or not body["host"]:
                self.decoder.rejected["bad_register"] += 1
                log.warning("REGISTER from %s refused: pid %r, host %r", msg.src, body["pid"], body["host"][:60])
                return
            if body["claimed_rank"] is not None and body["claimed_rank"] < 0:
                body["claimed_rank"] = None  # "-1" is how some frameworks say "no rank"
            entry = self.registry.claim(ident, msg.job, body)
            entry.extra["src"] = key[0]
            if entry.state is RankState.LIVE:
                self._answer(entry, forward=False)  # a reconnecting rank: same id again
        elif msg.type == protocol.STATUS:
            self._on_rank_status(entry, frame, msg, key)
        elif msg.type == protocol.BUNDLE_CHUNK:
            self._up(frame, key)
        else:
            self.decoder.rejected[f"unexpected_{msg.type}"] += 1

    def _on_rank_status(self, entry: RankEntry | None, frame: bytes, msg: Message, key) -> None:
        what = msg.body["what"]
        if entry is not None and what == "bye":
            detail = msg.body.get("detail") or {}
            self.liveness.forget(entry)
            self.names.retire(key[0])
            if detail.get("ok", True) is False:
                # Ended by an uncaught exception: lost to the job, with what it said.
                error = str(detail.get("error") or "uncaught exception")[:300]
                self._lose(entry, None, f"raised: {error}")
                return
            self.registry.finish(entry)
            self.bundles.retire(entry)
            self._up_own(protocol.STATUS, entry.job, {"what": "finished", "detail": {
                "rank": entry.assigned_rank, "step": entry.last_step, "pid": entry.pid}})
            self._publish_map(entry.job)
        elif entry is not None and what == "export_none":
            # The rank has no bundle of its own: send what this agent saw of it.
            detail = msg.body.get("detail") or {}
            transfer = str(detail.get("transfer") or detail.get("incident") or "export")
            self._export_on_behalf(entry, transfer, f"export requested; the rank had no bundle "
                                                    f"({detail.get('error') or 'no RDR recorder'})", final=False)
        else:
            if entry is not None and what == "terminated":
                entry.extra["state"] = "terminated"  # its exit that follows is not a loss
            self._up(frame, key)

    def _answer(self, entry: RankEntry, forward: bool = True) -> None:
        body = {"assigned_rank": entry.assigned_rank, "claimed_rank": entry.claimed_rank,
                "remapped": entry.remapped}
        self._to_rank(entry, self._msg(protocol.REGISTERED, entry.job, body))
        if not forward:
            return
        self.liveness.watch(entry)
        if entry.remapped:
            log.warning("job %s: pid %d on %s claimed rank %s, which another live process holds: "
                        "assigned rank %d", entry.job, entry.pid, entry.host, entry.claimed_rank,
                        entry.assigned_rank)
        self._forward_register(entry)
        self._publish_map(entry.job)
        sticky = self.relay.for_newcomer(entry.job)
        if sticky is not None:
            self._to_rank(entry, sticky)

    def _forward_register(self, entry: RankEntry) -> None:
        body = {"host": entry.host, "pid": entry.pid, "claimed_rank": entry.claimed_rank,
                "world_size": entry.world_size, "dp_index": entry.dp_index, "device_id": entry.device_id,
                "local_rank": entry.local_rank, "label": entry.label, "assigned_rank": entry.assigned_rank}
        if "versions" in entry.extra:
            body["versions"] = entry.extra["versions"]
        # src "rank:<id>" is how the coordinator reads the id of a registration.
        self._up_own(protocol.REGISTER, entry.job, body, src=f"rank:{entry.assigned_rank}")

    def _to_rank(self, entry: RankEntry, frame: bytes) -> bool:
        try:
            self.router.send_multipart([entry.identity, frame], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:  # gone (ROUTER_MANDATORY) or its queue is full
            log.warning("cannot reach rank %s (pid %d): %s", entry.assigned_rank, entry.pid, exc)
            return False

    # --- liveness ---------------------------------------------------------------------
    def _check_liveness(self, now: float) -> None:
        for lost in self.liveness.check(self.registry.live(), now):
            e = lost.entry
            if lost.reason == "exited":
                # Its last steps and its goodbye may still be queued in our socket: first
                # sight only starts a grace period (keeping the exit status read now,
                # while the kernel still shows it).
                self._dying.setdefault(id(e), (now, lost))
            else:
                self._report_lost(e, None, f"unresponsive: no heartbeat for {self.s.heartbeat_timeout_s:g}s")
        for key, (since, lost) in list(self._dying.items()):
            e = lost.entry
            if e.state is not RankState.LIVE:
                del self._dying[key]  # it said goodbye after all
            elif now - since >= _EXIT_GRACE_S and self._ranks_drained:
                del self._dying[key]
                self.liveness.forget(e)
                self.names.retire(e.extra.get("src", ""))
                if e.extra.get("state") == "terminated":
                    # The coordinator terminated it and it exited (on_terminate=exit): done.
                    e.exit_status = lost.exit_status
                    self.registry.finish(e)
                    self.bundles.retire(e)
                    self._publish_map(e.job)
                else:
                    self._lose(e, lost.exit_status, "exited")

    def _lose(self, e: RankEntry, exit_status: int | None, reason: str) -> None:
        """The rank is gone: mark it, write its bundle from what this agent saw, tell the coordinator."""
        self.registry.lose(e, exit_status, reason)
        status = "unknown" if exit_status is None else str(exit_status)
        self.bundles.write_on_behalf(e, f"rank lost ({reason}, exit status {status}); written by the node "
                                        f"agent from its flight recorder", self.registry.rank_map(e.job))
        self._report_lost(e, exit_status, reason)

    def _report_lost(self, e: RankEntry, exit_status: int | None, reason: str) -> None:
        log.warning("job %s rank %s (pid %d) lost: %s, last step %d, exit status %s",
                    e.job, e.assigned_rank, e.pid, reason, e.last_step, exit_status)
        self._up_own(protocol.RANK_LOST, e.job, {
            "rank": e.assigned_rank if e.assigned_rank is not None else -1, "pid": e.pid,
            "last_step": e.last_step, "exit_status": exit_status, "reason": reason})
        self._publish_map(e.job)

    # --- coordinator -> agent ----------------------------------------------------------
    def _drain_uplink(self) -> None:
        assert self.uplink is not None
        for _ in range(_BURST):
            frame = self.uplink.recv()
            if frame is None:
                return
            msg = self._updecoder.decode(frame)
            if msg is None:
                continue
            if msg.type == protocol.CONTROL:
                self._on_control(frame, msg)
            elif msg.type == protocol.STATUS and msg.body["what"] == "ack":
                high = (msg.body.get("detail") or {}).get("high")
                if isinstance(high, dict):
                    self.uplink.on_ack(high)

    def _on_control(self, frame: bytes, msg: Message) -> None:
        self.relay.remember(msg, frame)
        for entry in self.relay.targets(self.registry, msg):
            self._to_rank(entry, frame)
        if msg.body["command"] == "export":
            args = msg.body.get("args") or {}
            transfer = str(args.get("transfer") or msg.body.get("incident") or "export")
            for entry in self.relay.gone(self.registry, msg):
                why = "rank lost before the export" if entry.state is RankState.LOST else \
                    "rank had finished before the export"
                self._export_on_behalf(entry, transfer, why)
            jobs = {msg.job} if msg.job else {e.job for e in self.registry.entries()}
            for job in jobs:
                self._publish_map(job)

    def _export_on_behalf(self, entry: RankEntry, transfer: str, reason: str, final: bool = True) -> None:
        self.bundles.write_on_behalf(entry, reason, self.registry.rank_map(entry.job), final=final)
        n = 0
        for body in self.bundles.chunks(entry, transfer):
            self._up_own(protocol.BUNDLE_CHUNK, entry.job, body)
            n += 1
        log.info("sent %d bundle chunks for rank %s (transfer %s)", n, entry.assigned_rank, transfer)

    def _resend_state(self) -> None:
        """A (re)connected coordinator may have lost everything: registrations, the rank
        map, and the name tables the ranks sent long ago."""
        assert self.uplink is not None
        jobs = set()
        for e in self.registry.live():
            self._forward_register(e)
            jobs.add(e.job)
        for job in jobs:
            self._publish_map(job)
        self.names.owe_all()
        self.uplink.rewrite = self.names.attach if self.names.owed else None

    def _status(self) -> None:
        if self.uplink is None:
            return
        detail = {"host": self.host, "ranks": len(self.registry.live()), "forwarded": self.forwarded,
                  "rejected": sum(self.decoder.rejected.values()), "spool_bytes": self.uplink.spool.bytes_on_disk,
                  "spool_dropped": self.uplink.spool.dropped}
        for job in {e.job for e in self.registry.live()} or {self.s.job or ""}:
            self.uplink.send_volatile(self._msg(protocol.STATUS, job, {"what": "agent", "detail": detail}))


def job_dir(job: str) -> str:
    from agent.node.bundles import transfer_id

    return transfer_id(job)
