"""Ingest shards on Ray: K actors that each take a share of the record kinds.

Each shard actor binds its own ZeroMQ ROUTER, to which node agents send the STEP frames of
its kinds (the shard map and endpoints come with the registration reply), and runs a
:class:`~rankscope.coordinator.logic.shard.ShardCore` on its front end's loop thread.
Everything else a rank says (registration, heartbeats, losses) reaches the verdict actor,
which hands it on to every shard in order (:class:`ShardLink`). Each tick a shard judges
what is complete and pushes its findings to the verdict actor, which merges them.

Shards are dealt over the Ray cluster's nodes (:func:`placement`): on a cluster of several
nodes they land on different nodes (as far as there are nodes), so their cores and memory
add up.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray

from rankscope.coordinator.server.frontend import Frontend, Handlers, Peer
from rankscope.wire.protocol import Message

log = logging.getLogger(__name__)


def _rss_bytes() -> int:
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def _peak_rss_bytes() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class ShardService(Handlers):
    """One shard: its front end, its core, and the push of findings to the verdict actor."""

    def __init__(self, index: int, cluster: dict, bind: str, job: str | None, verdict: Any,
                 curve: Any = None, tick_s: float = 0.05) -> None:
        from rankscope.config.cluster import parse_cluster
        from rankscope.coordinator.logic.shard import ShardCore
        self.index = index
        self.core = ShardCore(parse_cluster(cluster), shard=index)
        self.frontend = Frontend(self, bind, job=job, tick_s=tick_s, curve=curve, clock_probes=False)
        self._verdict = verdict  # the verdict actor's handle
        self._judged: dict[str, int] = {}
        self._next_feed = 0
        self._early: dict[int, list] = {}  # feeds that overtook an earlier one (threaded actor)
        self.records = 0
        self.first_wall: float | None = None
        self.last_wall: float | None = None

    def start(self) -> str:
        return self.frontend.start()

    def stop(self) -> None:
        self.frontend.stop()

    # --- Handlers (loop thread) --------------------------------------------------------
    def on_steps(self, batches: list) -> None:
        self.core.on_steps(batches)
        n = sum(len(b) for b in batches)
        self.records += n
        wall = time.time()
        self.first_wall = self.first_wall or wall
        self.last_wall = wall

    def on_message(self, msg: Message, peer: Peer) -> None:
        pass  # a shard takes STEP frames; what else ranks say reaches it through the verdict actor

    def on_tick(self, now: float) -> None:
        f = self.core.judge(now)
        if f.steps or f.other or f.judged != self._judged:
            self._judged = dict(f.judged)
            self._push(f.to_dict())

    def _push(self, findings: dict) -> None:
        self._verdict.shard_findings.remote(findings)  # not awaited: the verdict actor merges in order

    # --- from the verdict actor (any thread) -------------------------------------------
    def feed(self, seq: int, events: list) -> None:
        self.frontend.call_sync(self._feed, seq, events)

    def _feed(self, seq: int, events: list) -> None:
        # Calls of a threaded actor may run out of order: apply them in the order sent.
        self._early[seq] = events
        while self._next_feed in self._early:
            for name, args, kw in self._early.pop(self._next_feed):
                if name == "steps":
                    self.on_steps(args[0])
                else:
                    getattr(self.core, name)(*args, **kw)
            self._next_feed += 1

    def drain(self) -> dict:
        """Judge everything pending now; the findings are returned, not pushed."""
        return self.frontend.call_sync(lambda: self.core.judge(force=True).to_dict())

    def status(self) -> dict:
        return self.frontend.call_sync(self._status)

    def _status(self) -> dict:
        span = (self.last_wall or 0.0) - (self.first_wall or 0.0)
        return {"shard": self.index, "endpoint": self.frontend.endpoint, "pid": os.getpid(),
                "node": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
                "kinds": None, "records": self.records, "first_step_wall": self.first_wall,
                "last_step_wall": self.last_wall, "records_per_s": round(self.records / span) if span > 0 else None,
                "pending_steps": self.core.aligner.pending_steps(), "counters": dict(self.core.aligner.counters),
                "rss_bytes": _rss_bytes(), "peak_rss_bytes": _peak_rss_bytes(),
                "judged": {g.label: g.judged_through for g in self.core.aligner.groups.values()},
                "waiting_for": self._waiting_for()}

    def _waiting_for(self, limit: int = 16) -> dict[str, list[int]]:
        """Per group, live ranks its oldest pending step still waits for (why it is not judged)."""
        out = {}
        for g in self.core.aligner.groups.values():
            if g.slots:
                slot = g.slots[min(g.slots)]
                live = g.live_mask()
                n = min(live.shape[0], slot.reported.shape[0])
                out[g.label] = [int(r) for r in g.ranks()[:n][live[:n] & ~slot.reported[:n]][:limit]]
        return out


class _ShardActor:
    def __init__(self, index: int, cluster: dict, bind: str, job: str | None, verdict: Any,
                 curve: dict | None = None) -> None:
        keys = None
        if curve:
            from rankscope.wire.transport import CurveKeys
            keys = CurveKeys(**curve)
        if bind.startswith("tcp://*:") or bind.startswith("tcp://0.0.0.0:"):
            # Agents must be told an address they can reach: this node's.
            bind = f"tcp://{ray.util.get_node_ip_address()}:0"
        self._svc = ShardService(index, cluster, bind, job, verdict, keys)
        self._endpoint = self._svc.start()

    def endpoint(self) -> str:
        return self._endpoint

    def feed(self, seq: int, events: list) -> bool:
        self._svc.feed(seq, events)
        return True

    def drain(self) -> dict:
        return self._svc.drain()

    def status(self) -> dict:
        return self._svc.status()

    def shutdown(self) -> bool:
        self._svc.stop()
        return True


def start_shards(count: int, cluster: dict, job: str | None, verdict: Any, bind: str,
                 curve: dict | None = None) -> list:
    """``count`` shard actors, spread over the Ray cluster's nodes, each bound on the verdict
    actor's interface with a port of its own (agents reach the shards where they reach it;
    a wildcard bind is each shard's own node address)."""
    host = bind[len("tcp://"):].rsplit(":", 1)[0] if bind.startswith("tcp://") else "127.0.0.1"
    return [ray.remote(_ShardActor).options(num_cpus=0, max_concurrency=4, scheduling_strategy=where)
            .remote(i, cluster, f"tcp://{host}:0", job, verdict, curve)
            for i, where in enumerate(placement(count))]


def placement(count: int) -> list[Any]:
    """Where each shard goes: the Ray nodes dealt round-robin, the verdict actor's own node
    last (Ray's SPREAD does not spread actors that ask for no CPU). Hard affinity: with a
    soft one Ray kept both shards of a two-node cluster on one node; a node lost later
    fails its shard, and the restarted coordinator places them again."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    here = ray.get_runtime_context().get_node_id()
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    nodes = [n for n in nodes if n != here] + [n for n in nodes if n == here]
    if len(nodes) < 2:
        return ["DEFAULT"] * count
    return [NodeAffinitySchedulingStrategy(node_id=nodes[i % len(nodes)], soft=False) for i in range(count)]


class ShardLink:
    """The verdict actor's side: what every shard must hear, in order, once per tick."""

    def __init__(self, handles: list, endpoints: list[str]) -> None:
        from rankscope.wire.shards import ShardMap
        self.handles = handles
        self.endpoints = endpoints
        self.map = ShardMap(len(handles))
        self._queue: list[list] = [[] for _ in handles]
        self._inflight: list = []
        self._seq = 0

    def to_wire(self) -> dict:
        return {**self.map.to_wire(), "endpoints": list(self.endpoints)}

    def event(self, name: str, *args: Any, **kw: Any) -> None:
        for q in self._queue:
            q.append((name, args, kw))

    def steps(self, batches: list) -> None:
        """STEP frames that came to the verdict actor (an agent that does not route):
        split here and handed on."""
        parts = [self.map.split(b) for b in batches]
        for i, q in enumerate(self._queue):
            q.append(("steps", ([p[i] for p in parts],), {}))

    def flush(self, wait_s: float | None = None) -> None:
        """Hand the queued events on (one call per shard); with ``wait_s``, return once
        every shard has applied them (a registration must be known to the shards before
        the rank is told where to send its steps)."""
        if any(self._queue):
            seq, self._seq = self._seq, self._seq + 1
            self._inflight += [h.feed.remote(seq, q) for h, q in zip(self.handles, self._queue)]
            self._queue = [[] for _ in self.handles]
        if wait_s is not None and self._inflight:
            ray.get(self._inflight, timeout=wait_s)  # raises (refs kept) when a shard is late
            self._inflight = []
        elif self._inflight:
            done, self._inflight = ray.wait(self._inflight, num_returns=len(self._inflight), timeout=0)
            ray.get(done)  # a shard that failed an event says so here, in the verdict actor's log

    def drain(self, timeout_s: float = 30.0) -> list[dict]:
        self.flush(wait_s=timeout_s)
        return ray.get([h.drain.remote() for h in self.handles], timeout=timeout_s)

    def status(self, timeout_s: float = 10.0) -> list[dict]:
        try:
            return ray.get([h.status.remote() for h in self.handles], timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - a shard gone: say so, do not fail status
            return [{"error": str(exc).splitlines()[0]}]

    def stop(self) -> None:
        for h in self.handles:
            try:
                ray.get(h.shutdown.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - already gone
                pass
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001
                pass
