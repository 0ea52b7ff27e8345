"""The node agent's decisions: no sockets, no threads, time from an injected clock.

:class:`NodeCore` is fed every frame a rank sends (:meth:`on_rank_frame`), every frame the
coordinator sends (:meth:`on_coordinator_frame`), connection changes (:meth:`on_link_up`) and
the passing of time (:meth:`tick`). What it decides to send goes into an :class:`Outbox` that
the loop (:mod:`.daemon`) empties onto its sockets; files it owns (bundles written on a dead
rank's behalf, ``rank_map.json``) it writes itself. Tests drive it with encoded frames and a
scripted clock. Rank frames are forwarded byte for byte (src/seq intact, so the coordinator
de-duplicates spool replays), or a STEP split over the ingest shards with the same src/seq
(:mod:`.shard_route`); the agent adds its own REGISTER, RANK_LOST, RANK_MAP and STATUS.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from typing import Callable

from rankscope.node.assign import HeldAnswers
from rankscope.node.bundles import RankBundles
from rankscope.node.exports import RecentExports
from rankscope.node.from_coordinator import CoordinatorFrames
from rankscope.node.liveness import LivenessMonitor, Lost, ProcStat, read_stat
from rankscope.node.name_ledger import NameLedger
from rankscope.node.outbox import Key, Outbox
from rankscope.node.registry import ProcessState, RankEntry, RankRegistry
from rankscope.node.relay import QUESTIONS, ControlRelay
from rankscope.node.settings import AgentSettings
from rankscope.node.shard_route import ShardRouting
from rankscope.node.stacks import StackRequests
from rankscope.wire import layout_facts, protocol, rerun_facts
from rankscope.wire.layout import position_file, rank_to_wire, safe_id
from rankscope.wire.position import read_rank_file
from rankscope.wire.protocol import Message, encode
from rankscope.wire.rank_map import write_rank_map

log = logging.getLogger(__name__)

#: How long a gone rank may still deliver what it sent (already in our socket: one loop turn reads it).
EXIT_GRACE_S = 0.3
#: A rank that said goodbye but whose process has not ended after this long is judged by its goodbye.
BYE_WAIT_S = 5.0
LIVENESS_EVERY_S, STATUS_EVERY_S = 0.2, 2.0


class NodeCore(CoordinatorFrames):
    def __init__(self, settings: AgentSettings, host: str, src: str, *,
                 clock: Callable[[], float] = time.monotonic, seq_start: int = 0,
                 read_proc: Callable[[int], ProcStat | None] = read_stat,
                 wall_clock: Callable[[], float] = time.time,
                 send_signal: Callable[[int, int], None] = os.kill, machine: str | None = None) -> None:
        self.s = settings
        self.host, self.src = host, src
        self.machine = machine if machine is not None else socket.gethostname()  # what ranks here say
        self.clock, self.wall = clock, wall_clock
        self._seq = protocol.SeqCounter(start=seq_start)
        self.registry = RankRegistry(settle_s=settings.settle_s, clock=clock)
        self.stacks = StackRequests(self.registry, host, clock, wall_clock, send_signal)
        self.liveness = LivenessMonitor(host, settings.heartbeat_timeout_s, read_proc)
        self.bundles = RankBundles(settings.bundle_dir, settings.flight_recorder_steps)
        self.relay = ControlRelay()
        self.names = NameLedger()
        self.route = ShardRouting(self.names, settings.route_steps)  # steps straight to the ingest shards
        self.decoder = protocol.Decoder(job=settings.job)
        self._updecoder = protocol.Decoder(job=None)
        self.forwarded, self.out = 0, Outbox()
        self._dying: dict[int, tuple[float, Lost, float]] = {}  # id(entry) -> (first seen dead, Lost, wall time)
        self.exports = RecentExports(self.clock)
        self.held = HeldAnswers(settings.assign_wait_s if settings.coordinator else 0.0)
        self._next_liveness = self._next_status = 0.0
        self.job_config: dict | None = None  # as the coordinator greeted us; launch --agent asks

    def take(self) -> Outbox:
        self.route.flush(self.out, self.src, self._seq)  # the parts routed since the last take, packed
        out, self.out = self.out, Outbox()
        return out

    # --- building frames -------------------------------------------------------------
    def _msg(self, mtype: str, job: str, body: dict, src: str | None = None) -> bytes:
        return encode(Message(mtype, job, src or self.src, self._seq(), body))

    def _up_own(self, mtype: str, job: str, body: dict, src: str | None = None) -> None:
        seq, src = self._seq(), src or self.src
        self.out.up.append((encode(Message(mtype, job, src, seq, body)), (f"{job}|{src}", seq)))

    def _to_rank(self, entry: RankEntry, frame: bytes) -> None:
        self.out.to_ranks.append((entry.identity, frame))

    def publish_map(self, job: str) -> None:
        rows = self.registry.rank_map(job)
        try:
            write_rank_map(self.bundles.root / safe_id(job) / "rank_map.json", rows)
        except OSError as exc:
            log.error("cannot write rank_map.json for job %s: %s", job, exc)
        self._up_own(protocol.RANK_MAP, job, {"entries": rows})

    # --- ranks -> agent ---------------------------------------------------------------
    def on_rank_frame(self, ident: bytes, frame: bytes) -> None:
        if (msg := self.decoder.decode(frame)) is None:
            return
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
            self.route.step(frame, msg, key, self.out)
            self.forwarded += 1
        elif msg.type == protocol.HEARTBEAT:
            if entry is not None:
                entry.extra["src"] = key[0]
                entry.extra["state"] = msg.body["state"]
                if msg.body.get("sync") is not None:
                    entry.extra["sync"] = msg.body["sync"]
                if self.liveness.heartbeat(entry, self.clock()):
                    self._up_own(protocol.STATUS, entry.job, {"what": "rank_back", "detail": {
                        "rank": entry.assigned_rank, "pid": entry.pid}})
            self.out.up_volatile.append(frame)
        elif msg.type == protocol.REGISTER:
            self._on_register(ident, msg, key)
        elif msg.type == protocol.STATUS and msg.body["what"] in QUESTIONS:
            answer = self.relay.answer(msg, self.job_config)
            self.out.to_ranks.append((ident, self._msg(protocol.STATUS, msg.job, answer)))
        elif msg.type == protocol.STATUS:
            self._on_rank_status(entry, frame, msg, key)
        elif msg.type == protocol.BUNDLE_CHUNK:
            if entry is not None:
                entry.extra.setdefault("exported", set()).add(msg.body["transfer"])
            self.out.up.append((frame, key))
        else:
            self.decoder.rejected[f"unexpected_{msg.type}"] += 1

    def _on_register(self, ident: bytes, msg: Message, key: Key) -> None:
        body = dict(msg.body)
        if body["pid"] <= 0 or not body["host"]:
            self.decoder.rejected["bad_register"] += 1
            log.warning("REGISTER from %s refused: pid %r, host %r", msg.src, body["pid"], body["host"][:60])
            return
        if body["claimed_rank"] is not None and body["claimed_rank"] < 0:
            body["claimed_rank"] = None  # "-1" is how some frameworks say "no rank"
        if body["host"] == self.machine:
            body["host"] = self.host  # a rank on this machine is on the host this agent was told it is
        entry = self.registry.claim(ident, msg.job, body)
        entry.extra["src"] = key[0]
        if entry.state is ProcessState.LIVE:
            self._answer(entry, forward=False)  # a reconnecting rank: same id again

    def _on_rank_status(self, entry: RankEntry | None, frame: bytes, msg: Message, key: Key) -> None:
        what = msg.body["what"]
        if entry is not None and what == "bye":
            detail = msg.body.get("detail") or {}
            entry.extra["bye"] = (self.clock(), self.wall())
            self.liveness.forget(entry)  # no heartbeats after a goodbye; only its exit counts
            if detail.get("ok", True) is False:
                entry.extra["exception"] = str(detail.get("error") or "uncaught exception")[:300]
            if entry.host != self.host:
                self._end(entry, None)  # no process to watch: the goodbye is all we get
            elif "exception" in entry.extra:
                # Dying of an uncaught exception: lost now, though the process may take
                # seconds to exit (its threads, the runtime's teardown).
                self._seen_dead(entry, Lost(entry, None, "exited"), self.clock())
            # Otherwise a local process is judged when it has ended: its exit status can
            # still say it failed (sys.exit(1) after a clean goodbye).
        elif entry is not None and what == "export_none":
            # The rank has no bundle of its own: send what this agent saw of it.
            detail = msg.body.get("detail") or {}
            transfer = str(detail.get("transfer") or detail.get("incident") or "export")
            self._export_on_behalf(entry, transfer, f"export requested; the rank had no bundle "
                                                    f"({detail.get('error') or 'no RDR recorder'})", final=False)
        else:
            if entry is not None and what == "terminated":
                entry.extra["state"] = "terminated"  # its exit that follows is not a loss
            if entry is not None and what == layout_facts.WHAT:
                entry.extra["layout_status"] = msg.body  # said again to a coordinator that lost it
            if entry is not None and what == rerun_facts.WHAT and (msg.body.get("detail") or {}).get("replay"):
                # A bundle written for this rank once it has ended carries the record too.
                entry.extra["replay"] = str(msg.body["detail"]["replay"])
            self.out.up.append((frame, key))

    def _end(self, e: RankEntry, exit_status: int | None, died_at: float | None = None) -> None:
        """The rank's process is over (or, remote, said goodbye): finished or lost?"""
        self.liveness.forget(e)
        self.route.retire(e.extra.get("src", ""))
        exception = e.extra.get("exception")
        bye = e.extra.get("bye")
        died_at = died_at if died_at is not None else (bye[1] if bye else self.wall())
        if exception:
            # Ended by an uncaught exception: lost to the job, with what it said.
            e.exit_status = exit_status
            self._lose(e, exit_status, f"raised: {exception}", died_at)
        elif e.extra.get("state") == "terminated" or (bye and exit_status in (0, None)) or exit_status == 0:
            # A clean end, or the exit the coordinator asked for (on_terminate=exit).
            e.exit_status = exit_status
            self.registry.finish(e)
            self._rank_file(e)  # nothing to report: only the file goes
            self.bundles.retire(e)
            self._up_own(protocol.STATUS, e.job, {"what": "finished", "detail": {
                "rank": e.assigned_rank, "step": e.last_step, "pid": e.pid}})
            self._answer_owed(e, "rank finished before answering the export", final=False)
            self.publish_map(e.job)
        else:
            self._lose(e, exit_status, "exited", died_at)

    def _answer(self, entry: RankEntry, forward: bool = True) -> None:
        body = {"assigned_rank": entry.assigned_rank, "claimed_rank": entry.claimed_rank,
                "remapped": entry.remapped, **entry.extra.get("settings", {})}
        self._to_rank(entry, self._msg(protocol.REGISTERED, entry.job, body))
        if not forward:
            return
        self.liveness.watch(entry, self.clock())
        if entry.remapped:
            log.warning("job %s: pid %d on %s claimed rank %s, which another live process holds: "
                        "assigned rank %d", entry.job, entry.pid, entry.host, entry.claimed_rank,
                        entry.assigned_rank)
        if not entry.extra.pop("forwarded", False):
            self._forward_register(entry)
        self.publish_map(entry.job)
        sticky = self.relay.for_newcomer(entry.job)
        if sticky is not None:
            self._to_rank(entry, sticky)

    def _forward_register(self, entry: RankEntry) -> None:
        # Its own src: agents proposing one id are no replays of each other.
        self._up_own(protocol.REGISTER, entry.job, entry.register_body())

    # --- time ---------------------------------------------------------------------------
    def tick(self, ranks_drained: bool = True, link_stats: dict | None = None) -> None:
        """Answer registrations whose settle window passed; every so often check liveness
        and report the agent's status. ``ranks_drained``: nothing from ranks is waiting
        unread (a dead rank's last frames are read before it is declared lost)."""
        now = self.clock()
        for entry in self.held.route(self.registry.due(now), now, self._forward_register):
            self._answer(entry)
        if now >= self._next_liveness:
            self._next_liveness = now + LIVENESS_EVERY_S
            self._check_liveness(now, ranks_drained)
        if now >= self._next_status:
            self._next_status = now + STATUS_EVERY_S
            self._status(link_stats)

    def on_pid_exit(self, pid: int) -> None:
        """The kernel says a local process ended (pidfd): start its grace at once."""
        now = self.clock()
        for e in self.registry.live():
            if e.pid == pid and e.host == self.host:
                dead, status = self.liveness.dead(pid)
                if dead:
                    self._seen_dead(e, Lost(e, status, "exited"), now)

    def _seen_dead(self, e: RankEntry, lost: Lost, now: float) -> None:
        if id(e) in self._dying:
            return
        self._dying[id(e)] = (now, lost, self.wall())
        clean = lost.exit_status == 0 or (lost.exit_status is None and "bye" in e.extra
                                            and "exception" not in e.extra)
        if e.extra.get("state") != "terminated" and not clean:
            # The launcher is about to take the others down: ask them where they are now.
            self.stacks.ask(e.job, why=f"rank {e.assigned_rank} ended", exclude=e.pid)

    def _check_liveness(self, now: float, ranks_drained: bool) -> None:
        for lost in self.liveness.check(self.registry.live(), now):
            e = lost.entry
            if lost.reason == "exited":
                # Its last steps and its goodbye may still be queued in our socket: first
                # sight only starts a grace period (keeping the exit status read now,
                # while the kernel still shows it).
                self._seen_dead(e, lost, now)
            else:
                seen = self.liveness.last_seen(e)
                silent_since = self.wall() - (now - seen) if seen is not None else self.wall()
                self._report_lost(e, None, f"unresponsive: no heartbeat for {self.s.heartbeat_timeout_s:g}s",
                                  silent_since)
        for key, (since, lost, died_at) in list(self._dying.items()):
            e = lost.entry
            if e.state is not ProcessState.LIVE:
                del self._dying[key]
            elif now - since >= EXIT_GRACE_S and ranks_drained:
                del self._dying[key]
                self._end(e, lost.exit_status, died_at)
        for e in self.registry.live():
            bye = e.extra.get("bye")
            if bye and id(e) not in self._dying and now - bye[0] >= BYE_WAIT_S:
                self._end(e, None)  # said goodbye, still there: take its word

    def _lose(self, e: RankEntry, exit_status: int | None, reason: str, died_at: float | None = None) -> None:
        """The rank is gone: mark it, write its bundle from what this agent saw, tell the coordinator."""
        self.registry.lose(e, exit_status, reason)
        status = "unknown" if exit_status is None else str(exit_status)
        why = f"rank lost ({reason}, exit status {status}); written by the node agent from its flight recorder"
        self.bundles.write_on_behalf(e, why, self.registry.rank_map(e.job))
        self._report_lost(e, exit_status, reason, died_at)
        self._answer_owed(e, why)

    def _answer_owed(self, e: RankEntry, why: str, final: bool = True) -> None:
        """Exports asked just before the rank ended (dead, or a worker on its way out) it never answered."""
        for transfer in self.exports.owed(e.job):
            if transfer not in e.extra.get("exported", ()):
                self._export_on_behalf(e, transfer, why, final=final)

    def _report_lost(self, e: RankEntry, exit_status: int | None, reason: str, died_at: float | None = None) -> None:
        log.warning("job %s rank %s (pid %d) lost: %s, last step %d, exit status %s",
                    e.job, e.assigned_rank, e.pid, reason, e.last_step, exit_status)
        body = {"rank": rank_to_wire(e.assigned_rank), "pid": e.pid, "last_step": e.last_step,
                "exit_status": exit_status, "reason": reason,
                "died_at": self.wall() if died_at is None else died_at,
                "signal": -exit_status if exit_status is not None and exit_status < 0 else None}
        position, sync = self._rank_file(e)  # its sync point: newer than the last heartbeat's
        body["sync"] = sync or e.extra.get("sync")
        body.update({k: v for k, v in {"position": position, "exception": e.extra.get("exception")}.items() if v})
        self._up_own(protocol.RANK_LOST, e.job, body)
        self.publish_map(e.job)

    def _rank_file(self, e: RankEntry) -> tuple[dict | None, dict | None]:
        """A local rank's position and newest sync point, read from (and removing) its file."""
        return read_rank_file(position_file(e.job, e.pid)) if e.host == self.host else (None, None)

    def remove_stack_files(self) -> int:
        """The agent is done: the stack files of its ranks that ended (kept until now for
        bundles written on their behalf) go, with their job's folder once it is empty."""
        removed = 0
        for e in self.registry.entries():
            path = e.extra.get("stacks_file")
            if e.host != self.host or not isinstance(path, str) or e.state is ProcessState.LIVE:
                continue
            try:
                os.unlink(path)
                removed += 1
                os.rmdir(os.path.dirname(path))
            except OSError:
                pass  # gone already, or the folder still holds a live rank's file
        return removed

    def watched_pids(self) -> set[int]:
        """Local processes whose end the loop should be told about at once."""
        return {e.pid for e in self.registry.live() if e.host == self.host}

    def _status(self, link_stats: dict | None) -> None:
        if link_stats is None:
            return  # no coordinator to tell
        detail = {"host": self.host, "ranks": len(self.registry.live()), "forwarded": self.forwarded,
                  "rejected": sum(self.decoder.rejected.values()), **link_stats}
        for job in {e.job for e in self.registry.live()} or {self.s.job or ""}:
            self.out.up_volatile.append(self._msg(protocol.STATUS, job, {"what": "agent", "detail": detail}))
