"""The node agent loop: ranks in (ROUTER), coordinator out (DEALER), one thread.

Everything runs on one thread that owns both sockets; the decisions are
:class:`~.core.NodeCore`'s. Each turn: read rank frames and coordinator frames into the
core, let time pass (:meth:`NodeCore.tick`), then send what the core put in its outbox
and pump the spool.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time

import zmq

from rankscope.node.core import NodeCore
from rankscope.node.outbox import Outbox
from rankscope.node.pidfd import PidWatch
from rankscope.node.settings import AgentSettings
from rankscope.node.shard_route import ShardUplinks
from rankscope.node.spool import SpoolLog
from rankscope.node.uplink import Uplink
from rankscope.wire.transport import bind_router, stop_authenticator

log = logging.getLogger(__name__)

_BURST = 1024  # frames per socket per turn, so one flood cannot starve the other side

__all__ = ["AgentSettings", "NodeAgent"]


class NodeAgent:
    def __init__(self, settings: AgentSettings) -> None:
        self.s = settings
        self.host = settings.host or socket.gethostname()
        self.src = f"agent:{self.host}:{os.getpid()}"
        # Time-based start: a restarted agent's seqs stay above what the coordinator's
        # replay filter remembers from the previous one.
        self.core = NodeCore(settings, self.host, self.src, seq_start=time.time_ns() // 1000)
        self.ctx = zmq.Context()
        self.router, self.endpoint = bind_router(self.ctx, settings.listen, settings.listen_curve)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.uplink: Uplink | None = None
        self.shards: ShardUplinks | None = None
        if settings.coordinator:
            spool = SpoolLog(settings.spool_dir, max_bytes=settings.spool_max_bytes)
            self.uplink = Uplink(self.ctx, settings.coordinator, self.src.encode(), spool,
                                 curve=settings.coordinator_curve, replay_window_s=settings.replay_window_s)
            # Steps go straight to the ingest shards once the coordinator names them.
            self.shards = ShardUplinks(self.ctx, self.src.encode(), settings.spool_dir,
                                       spool_max_bytes=settings.spool_max_bytes, curve=settings.coordinator_curve,
                                       replay_window_s=settings.replay_window_s)
        self._stop = threading.Event()
        self._ranks_drained = True  # the last drain emptied the rank socket
        self.pidfds = PidWatch()

    # The daemon's collaborators, for callers that inspect a running agent.
    @property
    def registry(self):  # noqa: ANN201
        return self.core.registry

    @property
    def bundles(self):  # noqa: ANN201
        return self.core.bundles

    # --- lifecycle -------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        if self.uplink is not None:
            poller.register(self.uplink.sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                # A backlog (replay after a reconnect) is pumped without waiting for input.
                busy = self.uplink is not None and (self.uplink.connected and self.uplink.backlog
                                                    or self.shards.backlog)
                self.pidfds.sync(poller, self.core.watched_pids())
                events = dict(poller.poll(5 if busy else 50))
                self._drain_ranks()
                for pid in self.pidfds.ended(events):
                    self.core.on_pid_exit(pid)
                if self.uplink is not None:
                    self._drain_uplink()
                    for up in self.uplink.poll_link():
                        if up:
                            self.core.on_link_up()
                            names = self.core.names
                            self.uplink.rewrite = names.attach if names.owed else None
                    self.shards.poll()
                self.core.tick(self._ranks_drained, self._link_stats())
                self._flush(self.core.take())
                if self.uplink is not None:
                    self.uplink.confirm()
                    self.uplink.pump()
                    if self.core.names.owed and not self.uplink.backlog:
                        self.core.names.replay_done(everyone=self.core.route.active)
                    self.shards.pump()
            self._drain_on_stop()
        finally:
            self.close()

    def _link_stats(self) -> dict | None:
        if self.uplink is None:
            return None
        return {"spool_bytes": self.uplink.spool.bytes_on_disk, "spool_dropped": self.uplink.spool.dropped,
                "routed_steps": self.core.route.routed, **self.shards.stats()}

    def _drain_on_stop(self) -> None:
        """Stopping (SIGTERM at job end): take what ranks still sent and hand the backlog to
        the coordinator for up to ``drain_s``; what does not go stays in the spool."""
        self._drain_ranks()
        self._flush(self.core.take())
        if self.uplink is None:
            return
        deadline = time.monotonic() + self.s.drain_s
        while (self.uplink.connected and self.uplink.backlog or self.shards.backlog) \
                and time.monotonic() < deadline:
            if not (self.uplink.pump() + self.shards.pump()):
                time.sleep(0.01)
            self.uplink.poll_link()
            self.shards.poll()
        if self.uplink.backlog or any(link.backlog for link in self.shards.links):
            log.warning("stopping with frames not yet sent; they stay in the spool %s and go first "
                        "when an agent starts on it again", self.s.spool_dir)

    def close(self) -> None:
        self.core.remove_stack_files()
        self.pidfds.close()
        if self.uplink is not None:
            self.uplink.close()
            self.uplink = None
            self.shards.close()
        self.router.close(0)
        stop_authenticator(self.ctx)
        self.ctx.term()

    # --- sockets -----------------------------------------------------------------------
    def _drain_ranks(self) -> None:
        self._ranks_drained = False
        for _ in range(_BURST):
            try:
                parts = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                self._ranks_drained = True
                return
            if len(parts) != 2:
                self.core.decoder.rejected["bad_multipart"] += 1
                continue
            self.core.on_rank_frame(parts[0], parts[1])

    def _drain_uplink(self) -> None:
        assert self.uplink is not None
        for _ in range(_BURST):
            frame = self.uplink.recv()
            if frame is None:
                return
            self.core.on_coordinator_frame(frame)

    def _flush(self, out: Outbox) -> None:
        for ident, frame in out.to_ranks:
            try:
                self.router.send_multipart([ident, frame], zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # gone (ROUTER_MANDATORY) or its queue is full
                log.warning("cannot reach rank %r: %s", ident[:40], exc)
        if self.uplink is None:
            return
        for high in out.acks:
            self.uplink.on_ack(high)
        for frame, key in out.up:
            self.uplink.send(frame, key)
        self.shards.sync(self.core.route)  # cheap when the endpoints did not change
        for shard, frame, key in out.shards:
            self.shards.send(shard, frame, key)
        for frame in out.up_volatile:
            self.uplink.send_volatile(frame)
