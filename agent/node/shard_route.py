"""Steps straight to the coordinator's ingest shards: the node agent's side of the shard map.

A coordinator with several ingest shards answers each registration ("assigned") with the
shard map and one endpoint per shard. From the first such answer on, every STEP a rank
sends is split by kind (:meth:`ShardMap.split`) and each shard gets its part -- an empty
part too, because a shard decides on its own that rank r reported step s (see
:mod:`rankscope.wire.shards`). The parts routed to one shard in one turn of the agent's loop
go in one STEPS frame (:mod:`rankscope.wire.step_pack`; the ranks of a node report a step
together), each part keeping its rank's src and seq, so each shard's replay filter drops
spool replays the way the verdict actor's does, and its acks name the same "job|src" keys
(a pack is confirmed once every part's key is). Each shard has its own :class:`Uplink` and
spool (``<spool>/shard-<i>``): a shard that was away gets exactly the frames it missed, and
its acks trim only its spool.

Everything else (registrations, heartbeats, losses, status, bundles) still goes to the
verdict actor, and so do steps sent before the first answer (it relays those to the shards).
A coordinator of one shard sends no map: nothing is routed.

:class:`ShardRouting` decides (the :class:`~.core.NodeCore` owns it; no sockets);
:class:`ShardUplinks` sends (the daemon owns it).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Iterator

import zmq

from rankscope.node.name_ledger import NameLedger
from rankscope.node.outbox import Key, Outbox
from rankscope.node.spool import SpoolLog
from rankscope.node.uplink import Uplink
from rankscope.wire import protocol
from rankscope.wire.protocol import Message, encode
from rankscope.wire.shards import ShardMap
from rankscope.wire.step_pack import Part, pack_message
from rankscope.wire.transport import CurveKeys

log = logging.getLogger(__name__)

#: Rows of one STEPS frame at most (~10 MB): a pack stays far below the frame cap.
PACK_ROWS = 1 << 17


def _chunks(parts: list[Part]) -> Iterator[list[Part]]:
    chunk: list[Part] = []
    rows = 0
    for part in parts:
        if chunk and rows + len(part[2]) > PACK_ROWS:
            yield chunk
            chunk, rows = [], 0
        chunk.append(part)
        rows += len(part[2])
    if chunk:
        yield chunk


class ShardRouting:
    """Where a rank's STEP goes: whole to the verdict actor, or split over the shards."""

    def __init__(self, names: NameLedger, enabled: bool = True) -> None:
        self.enabled = enabled
        self.map: ShardMap | None = None
        self.endpoints: list[str] = []
        #: Per shard, the names sent to it (re-sent after its link comes back).
        self.names: list[NameLedger] = []
        self._all_names = names  # the ledger of whole tables (steps sent to the verdict actor)
        #: Bumped when the endpoints change: the daemon then connects again.
        self.version = 0
        self.routed = 0  # steps split over the shards
        #: Per shard, job -> parts routed and not yet packed: (src, seq, batch).
        self._pending: list[dict[str, list[Part]]] = []

    @property
    def active(self) -> bool:
        return self.map is not None

    def learn(self, detail: Any) -> bool:
        """Take the shard map of an "assigned" answer; False (nothing changed) when it is malformed."""
        if not isinstance(detail, dict) or not self.enabled:
            return True  # not ours to judge: the caller refuses a malformed answer
        wire = detail.get("shards")
        if wire is None:
            if self.map is not None:
                log.warning("the coordinator no longer names ingest shards: steps go to it again")
                self.map, self.endpoints, self.names, self._pending = None, [], [], []
                self.version += 1
            return True
        try:
            smap = ShardMap.from_wire(wire)
        except ValueError as exc:
            log.warning("ignoring the coordinator's shard map: %s", exc)
            return False
        endpoints = wire.get("endpoints")
        if not (isinstance(endpoints, list) and len(endpoints) == smap.count
                and all(isinstance(e, str) and e for e in endpoints)):
            log.warning("ignoring the coordinator's shard map: expected %d endpoint strings, got %r",
                        smap.count, endpoints)
            return False
        if smap.count < 2 or endpoints == self.endpoints:
            return True  # one shard is the verdict actor's business; the same map: nothing to do
        if self.map is None or self.map.count != smap.count:
            self.map = smap
            self.names = [NameLedger() for _ in endpoints]
            # Parts routed in this loop turn, before the new map came, still go out.
            self._pending = [self._pending[i] if i < len(self._pending) else {} for i in range(len(endpoints))]
            for ledger in self.names:  # names sent before routing, owed to a shard that comes back
                ledger.seed(self._all_names)
        log.info("routing steps to %d ingest shards: %s", smap.count, ", ".join(endpoints))
        self.endpoints = list(endpoints)
        self.version += 1
        return True

    def step(self, frame: bytes, msg: Message, key: Key, out: Outbox) -> None:
        """Queue one rank STEP: the frame itself for the verdict actor, or its parts for
        the shards (sent packed by :meth:`flush`)."""
        if self.map is None:
            out.up.append((frame, key))
            return
        for i, part in enumerate(self.map.split(protocol.step_from_message(msg))):
            self.names[i].note(key[0], part.new_names)
            self._pending[i].setdefault(msg.job, []).append((msg.src, msg.seq, part))
        self.routed += 1

    def flush(self, out: Outbox, src: str, seq: Callable[[], int]) -> None:
        """The parts queued since the last flush, one STEPS frame per shard and job (at most
        PACK_ROWS rows each): a shard's cost is per frame, so the ranks of this node that
        reported together reach it together."""
        for i, jobs in enumerate(self._pending):
            for job, parts in jobs.items():
                for chunk in _chunks(parts):
                    keys = [(f"{job}|{psrc}", pseq) for psrc, pseq, _ in chunk]
                    out.shards.append((i, encode(pack_message(job, src, seq(), chunk)), keys))
            jobs.clear()

    def retire(self, key: str) -> None:
        """The rank is gone: its tables are kept for replays, in every ledger alike."""
        self._all_names.retire(key)
        for ledger in self.names:
            ledger.retire(key)


class ShardUplinks:
    """One uplink and spool per shard, following :class:`ShardRouting`'s endpoints."""

    def __init__(self, ctx: zmq.Context, identity: bytes, spool_dir: Path, *, spool_max_bytes: int,
                 curve: CurveKeys | None, replay_window_s: float) -> None:
        self._ctx, self._identity = ctx, identity
        self._spool_dir = Path(spool_dir)
        self._spool_max = spool_max_bytes
        self._curve, self._window = curve, replay_window_s
        self.links: list[Uplink] = []
        self._names: list[NameLedger] = []
        self._version = 0
        self._decoder = protocol.Decoder(job=None)

    def sync(self, route: ShardRouting) -> None:
        """Connect to the endpoints the routing names now (a changed one: its spool is kept
        and what it holds unconfirmed goes to the new endpoint)."""
        if route.version == self._version:
            return
        self._version = route.version
        self._names = route.names
        links: list[Uplink] = []
        for i, endpoint in enumerate(route.endpoints):
            old = self.links[i] if i < len(self.links) else None
            if old is not None and old.endpoint == endpoint:
                links.append(old)
                continue
            if old is not None:
                old.close()
            spool = SpoolLog(self._spool_dir / f"shard-{i}", max_bytes=self._spool_max)
            links.append(Uplink(self._ctx, endpoint, self._identity, spool, curve=self._curve,
                                replay_window_s=self._window))
        for old in self.links[len(links):]:
            if old.backlog:
                log.warning("shard %s is no longer named; its unsent steps stay in %s", old.endpoint, old.spool.dir)
            old.close()
        self.links = links
        for link, ledger in zip(self.links, self._names):
            link.rewrite = ledger.attach

    def send(self, shard: int, frame: bytes, keys: list[Key]) -> None:
        self.links[shard].send(frame, keys)

    def poll(self, burst: int = 1024) -> None:
        """Link changes (a shard back: it is owed every name table) and the shards' acks."""
        for link, ledger in zip(self.links, self._names):
            for up in link.poll_link():
                if up:
                    ledger.owe_all()
            for _ in range(burst):
                frame = link.recv()
                if frame is None:
                    break
                msg = self._decoder.decode(frame)
                # A shard sends acks only.
                if msg is not None and msg.type == protocol.STATUS and msg.body["what"] == "ack":
                    high = (msg.body.get("detail") or {}).get("high")
                    if isinstance(high, dict):
                        link.on_ack(high)

    def pump(self) -> int:
        n = 0
        for link, ledger in zip(self.links, self._names):
            link.confirm()
            n += link.pump()
            if ledger.owed and not link.backlog:
                ledger.replay_done()
        return n

    @property
    def backlog(self) -> bool:
        return any(link.connected and link.backlog for link in self.links)

    def stats(self) -> dict:
        return {"shards": len(self.links), "shard_spool_bytes": sum(lk.spool.bytes_on_disk for lk in self.links),
                "shard_spool_dropped": sum(lk.spool.dropped for lk in self.links)}

    def close(self) -> None:
        for link in self.links:
            link.close()
        self.links = []
