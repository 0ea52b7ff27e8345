"""Ingest shards on Ray: K actors that each take a share of the record kinds.

Each shard actor binds its own ZeroMQ ROUTER, to which node agents send the STEP frames of
its kinds (the shard map and endpoints come with the registration reply), and runs a
:class:`~rankscope.coordinator.logic.shards.shard.ShardCore` on its front end's loop thread.
Everything else a rank says (registration, heartbeats, losses) reaches the verdict actor,
which hands it on to every shard in order (:class:`ShardLink`). Each tick a shard judges
what is complete and pushes its findings to the verdict actor, which merges them.

Shards are dealt over the Ray cluster's nodes (:func:`placement`): on a cluster of several
nodes they land on different nodes (as far as there are nodes), so their cores and memory
add up.

A shard whose process dies is started again by Ray (``max_restarts``) on the same node and
port, so node agents' sockets reconnect by themselves. It then holds the records that come
in until the verdict actor has told it the job again (registrations, ends: :func:`resync_events`)
and it has re-learnt the ranks' tensor names from the file it keeps them in (ranks send
each name once). What it had not judged when it died is lost: those steps are "not seen"
in the coverage (every shard must judge a step for it to count), never "judged".
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import ray

from rankscope.coordinator.logic.align.in_order import InOrder
from rankscope.coordinator.server.frontend import Frontend, Handlers, Peer
from rankscope.coordinator.server.gc_pace import GcPacer
from rankscope.coordinator.server.names_file import NamesFile
from rankscope.wire.protocol import Message
from rankscope.wire.step_pack import record_count

log = logging.getLogger(__name__)

#: Times Ray starts a dead shard again before the job goes on without it.
SHARD_RESTARTS = 3
#: STEP batches a restarted shard holds while it waits to be told the job again.
MAX_HELD_BATCHES = 100_000


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


def _cpu_s() -> float:
    """CPU time of this process so far: what a shard's work costs on a machine whose cores
    it shares (wall-clock rates there measure the sharing)."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class ShardService(Handlers):
    """One shard: its front end, its core, and the push of findings to the verdict actor."""

    def __init__(self, index: int, cluster: dict, bind: str, job: str | None, verdict: Any,
                 curve: Any = None, tick_s: float = 0.05, *, names: Path | None = None,
                 restarted: bool = False, pace_gc: bool = False) -> None:
        """``names``: the file the ranks' tensor names are kept in for a restart;
        ``restarted``: this is that restart (records wait for the verdict actor's resync);
        ``pace_gc``: the process is this shard's own (:mod:`.gc_pace`)."""
        from rankscope.config.cluster import parse_cluster
        from rankscope.coordinator.logic.shards.shard import ShardCore
        self.index = index
        self._node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        self.core = ShardCore(parse_cluster(cluster), shard=index)
        self.frontend = Frontend(self, bind, job=job, tick_s=tick_s, curve=curve, clock_probes=False,
                                 whole_packs=True)
        self._verdict = verdict  # the verdict actor's handle
        self._judged: dict[str, int] = {}
        self._feeds = InOrder()  # the verdict actor's feeds, in its order (a threaded actor's calls are not)
        self._epoch, self._pushed = time.time_ns(), 0  # this process's findings, numbered for the same reason
        self._names_path = names
        self._names_out = NamesFile(names) if names is not None else None
        self._held: list | None = [] if restarted else None
        self.gc = GcPacer() if pace_gc else None
        self.restarts = 1 if restarted else 0
        self.records = 0
        self.first_wall: float | None = None
        self.last_wall: float | None = None

    def start(self) -> str:
        return self.frontend.start()

    def stop(self) -> None:
        self.frontend.stop()
        if self._names_out is not None:
            self._names_out.close()

    # --- Handlers (loop thread) --------------------------------------------------------
    def on_steps(self, batches: list) -> None:
        if self._held is not None:  # restarted, not yet told who the ranks are
            if len(self._held) < MAX_HELD_BATCHES:
                self._held.append(batches)
            return
        if self._names_out is not None:
            self._names_out.write(batches)
        self.core.on_steps(batches)
        n = record_count(batches)
        self.records += n
        wall = time.time()
        self.first_wall = self.first_wall or wall
        self.last_wall = wall

    def on_message(self, msg: Message, peer: Peer) -> None:
        pass  # a shard takes STEP frames; what else ranks say reaches it through the verdict actor

    def on_tick(self, now: float) -> None:
        f = self.core.judge(now)
        if f.steps or f.other or f.covered or f.judged != self._judged:
            self._judged = dict(f.judged)
            self._push(f.to_dict())
        if f.covered and self.gc is not None:
            self.gc.judged()
        if f.covered:  # after the findings left: the next step's slot is made off its path
            self.core.aligner.prepare_slots()

    def _push(self, findings: dict) -> None:
        self._verdict.shard_findings.remote(self._numbered(findings))  # not awaited: numbered, merged in order

    def _numbered(self, findings: dict) -> dict:
        findings.update(epoch=self._epoch, seq=self._pushed)
        self._pushed += 1
        return findings

    # --- from the verdict actor (any thread) -------------------------------------------
    def feed(self, seq: int, events: list, reset: bool = False) -> None:
        self.frontend.call_sync(self._feed, seq, events, reset)

    def _feed(self, seq: int, events: list, reset: bool = False) -> None:
        # Calls of a threaded actor may run out of order: apply them in the order sent.
        # ``reset``: the whole job as the verdict actor knows it (after a restart); what
        # was sent before it is in it.
        if reset:
            self._feeds.reset(seq)
        for feed in self._feeds.put(seq, events):
            for name, args, kw in feed:
                if name == "steps":
                    self.on_steps(args[0])
                else:
                    getattr(self.core, name)(*args, **kw)
        if reset and self._held is not None:
            self._resume()

    def _resume(self) -> None:
        self.core.resumed = True
        if self._names_path is not None:
            for job, rank, names in NamesFile.read(self._names_path):
                self.core.learn_names(job, rank, names)
        held, self._held = self._held or [], None
        for batches in held:
            self.on_steps(batches)
        log.warning("ingest shard %d restarted: told the job again, %d held batch(es) taken", self.index, len(held))

    def drain(self) -> dict:
        """Judge everything pending now; the findings are returned, not pushed."""
        return self.frontend.call_sync(lambda: self._numbered(self.core.judge(force=True).to_dict()))

    def status(self, brief: bool = False) -> dict:
        """``brief``: without the ranks its oldest step waits for (a walk over every member,
        for a poller that only counts; it runs on the ingest thread)."""
        return self.frontend.call_sync(self._status, brief)

    def proof(self, verdict: dict) -> dict:
        return self.frontend.call_sync(self.core.series.recent.proof, verdict)

    def state_dir(self) -> Path | None:
        return self._names_path.parent if self._names_path is not None else None

    def _status(self, brief: bool = False) -> dict:
        span = (self.last_wall or 0.0) - (self.first_wall or 0.0)
        return {"shard": self.index, "endpoint": self.frontend.endpoint, "pid": os.getpid(),
                "node": self._node,
                "kinds": None, "records": self.records, "first_step_wall": self.first_wall,
                "last_step_wall": self.last_wall, "records_per_s": round(self.records / span) if span > 0 else None,
                "pending_steps": self.core.aligner.pending_steps(), "counters": dict(self.core.aligner.counters),
                "rss_bytes": _rss_bytes(), "peak_rss_bytes": _peak_rss_bytes(), "cpu_s": _cpu_s(),
                "frames_in": self.frontend.frames_in, "rejected": dict(self.frontend.decoder.rejected),
                "duplicates": self.frontend.replay.duplicates,
                "judged": {g.label: g.judged_through for g in self.core.aligner.groups.values()},
                "restarted": bool(self.restarts), "resynced": self._held is None,
                **({} if brief else {"waiting_for": self._waiting_for()})}

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
        ctx = ray.get_runtime_context()
        # Ray keeps the actor id across restarts: what a restart needs is kept under it.
        state = Path(tempfile.gettempdir()) / f"rankscope-shard-{ctx.get_actor_id()}"
        state.mkdir(parents=True, exist_ok=True)
        restarted = bool(ctx.was_current_actor_reconstructed)
        if restarted and (state / "endpoint").is_file():
            bind = (state / "endpoint").read_text().strip()  # the same port: agents reconnect to it
        self._svc = ShardService(index, cluster, bind, job, verdict, keys, names=state / "names.jsonl",
                                 restarted=restarted, pace_gc=True)
        self._endpoint = self._svc.start()
        (state / "endpoint").write_text(self._endpoint)
        if restarted:
            verdict.shard_restarted.remote(index)

    def endpoint(self) -> str:
        return self._endpoint

    def feed(self, seq: int, events: list, reset: bool = False) -> bool:
        self._svc.feed(seq, events, reset)
        return True

    def drain(self) -> dict:
        return self._svc.drain()

    def status(self, brief: bool = False) -> dict:
        return self._svc.status(brief)

    def proof(self, verdict: dict) -> dict:
        return self._svc.proof(verdict)

    def shutdown(self) -> bool:
        self._svc.stop()
        shutil.rmtree(self._svc.state_dir() or "", ignore_errors=True)
        return True


def start_shards(count: int, cluster: dict, job: str | None, verdict: Any, bind: str,
                 curve: dict | None = None) -> list:
    """``count`` shard actors, spread over the Ray cluster's nodes, each bound on the verdict
    actor's interface with a port of its own (agents reach the shards where they reach it;
    a wildcard bind is each shard's own node address)."""
    host = bind[len("tcp://"):].rsplit(":", 1)[0] if bind.startswith("tcp://") else "127.0.0.1"
    return [ray.remote(_ShardActor).options(num_cpus=0, max_concurrency=4, scheduling_strategy=where,
                                            max_restarts=SHARD_RESTARTS, max_task_retries=0)
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
        #: Shards restarted since the last flush, and what tells one the job again.
        self._resync: set[int] = set()
        self.snapshot: Callable[[], list] = list

    def restarted(self, index: int) -> None:
        """Shard ``index`` came back (a new process): the next flush tells it the job again."""
        self._resync.add(index)

    def to_wire(self) -> dict:
        return {**self.map.to_wire(), "endpoints": list(self.endpoints)}

    def event(self, name: str, *args: Any, **kw: Any) -> None:
        for q in self._queue:
            q.append((name, args, kw))

    def fan_out(self, core: Any) -> "_FanOut":
        """``core`` as the verdict actor's ingest: what a rank says goes to it now and to
        every shard with the next flush."""
        return _FanOut(core, self)

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
        if any(self._queue) or self._resync:
            seq, self._seq = self._seq, self._seq + 1
            snap = self.snapshot() if self._resync else None
            self._inflight += [h.feed.remote(seq, snap, True) if i in self._resync else h.feed.remote(seq, q)
                               for i, (h, q) in enumerate(zip(self.handles, self._queue))]
            self._queue = [[] for _ in self.handles]
            self._resync = set()
        if not self._inflight:
            return
        done, self._inflight = ray.wait(self._inflight, num_returns=len(self._inflight), timeout=wait_s or 0)
        for ref in done:
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - one shard's failure must not stop the others
                # A shard that died is started again and told the job anew (restarted()).
                log.warning("an ingest shard did not take its events: %s", str(exc).splitlines()[0])
        if wait_s is not None and self._inflight:
            raise TimeoutError(f"{len(self._inflight)} ingest shard call(s) still pending after {wait_s} s")

    def _each(self, method: str, *args: Any, timeout_s: float, failed: Any) -> list:
        """``method`` of every shard, in shard order; a shard that is down gives ``failed(error)``."""
        refs = [getattr(h, method).remote(*args) for h in self.handles]
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        out = []
        for i, ref in enumerate(refs):
            try:
                out.append(ray.get(ref, timeout=0))
            except Exception as exc:  # noqa: BLE001 - a shard down: the others still count
                log.warning("ingest shard %d: %s failed: %s", i, method, str(exc).splitlines()[0])
                out.append(failed(i, str(exc).splitlines()[0]))
        return out

    def drain(self, timeout_s: float = 30.0) -> list[dict]:
        try:
            self.flush(wait_s=timeout_s)
        except TimeoutError as exc:
            log.warning("draining ingest shards: %s", exc)
        return [d for d in self._each("drain", timeout_s=timeout_s, failed=lambda i, e: None) if d is not None]

    def proof(self, verdict: dict, timeout_s: float = 10.0) -> list[dict]:
        """Each shard's proof of ``verdict`` (:meth:`RecentSteps.proof`), in shard order."""
        return self._each("proof", verdict, timeout_s=timeout_s, failed=lambda i, e: {})

    def status(self, brief: bool = False, timeout_s: float = 10.0) -> list[dict]:
        return self._each("status", brief, timeout_s=timeout_s, failed=lambda i, e: {"shard": i, "error": e})

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


class _FanOut:
    def __init__(self, core: Any, link: ShardLink) -> None:
        self._core, self._link = core, link

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            self._link.event(name, *args, **kw)
            return getattr(self._core, name)(*args, **kw)
        return call
