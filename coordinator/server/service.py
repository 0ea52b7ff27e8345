"""The coordinator service: logic core + ZeroMQ front end + incident actions.

Plain Python (no Ray): :mod:`rankscope.coordinator.server.actor` is the thin Ray actor around it,
the way ``ray.util.queue.Queue`` wraps ``_QueueActor``. Every method that touches
the core or the socket runs on the front end's loop thread (via
``Frontend.call_sync``), so the core needs no locks and stays pure.
"""
from __future__ import annotations

import collections
import json
import logging
import time
from pathlib import Path
from typing import Any

from rankscope.coordinator.logic.views.captures import CaptureBook
from rankscope.coordinator.logic.job.identities import JobIdentities
from rankscope.coordinator.server.actions import ActionPerformer
from rankscope.coordinator.server.frontend import Frontend, Handlers, Peer
from rankscope.coordinator.server.gc_pace import GcPacer
from rankscope.coordinator.server.metrics import CoordinatorMetrics
from rankscope.coordinator.server.service_console import ConsoleQueries
from rankscope.coordinator.server.service_status import StatusReports
from rankscope.wire import capture_values, job_config, layout_facts, protocol, rerun_facts
from rankscope.wire.layout import rank_from_wire
from rankscope.wire.position import position_from_wire
from rankscope.wire.protocol import Message
from rankscope.wire.sync import SyncPoint

log = logging.getLogger(__name__)



class CoordinatorService(StatusReports, ConsoleQueries, Handlers):
    def __init__(self, export_dir: str | Path, cluster: dict | None = None, *,
                 bind: str = "tcp://127.0.0.1:0", job: str | None = None, curve: Any = None,
                 tick_s: float = 0.05, ray_metrics: bool = False, config: dict | None = None,
                 link: Any = None, pace_gc: bool = False) -> None:
        """``link``: a :class:`~rankscope.coordinator.server.shards.ShardLink` when records are
        judged by ingest shards; this service then merges their findings and files them.
        ``pace_gc``: the process is this service's own (an actor): pace its full garbage
        collections (:mod:`.gc_pace`)."""
        from rankscope.config.cluster import parse_cluster
        from rankscope.coordinator.logic.core import CoordinatorCore

        cluster = dict(cluster or {})
        self.job = job or cluster.get("job")
        self.export_dir = Path(export_dir)
        self.export_dir.mkdir(parents=True, exist_ok=True)
        self.settings = parse_cluster(cluster)
        # The core persists and reloads incident state under export_dir (restarts keep it).
        self.core = CoordinatorCore(self.settings, export_dir=self.export_dir)
        self.identities = JobIdentities()
        # What ranks must do as the cluster says, sent with every job-wide id: only what
        # the coordinator was told, so a rank's own config still counts where it was not.
        self.rank_settings = {k: cluster[k] for k in ("on_terminate",) if k in cluster}
        self.metrics = CoordinatorMetrics()
        if ray_metrics:
            self.metrics.enable_ray()
        self.frontend = Frontend(self, bind, curve=curve, job=self.job, tick_s=tick_s)
        # The job's whole config (msProbe fields, rdr, this cluster section): every node
        # agent is greeted with it, and launch --agent hands it to that node's ranks.
        self.job_config = {**(config or {}), "cluster": cluster}
        self.frontend.greeting = job_config.body(self.job_config)
        self.actions = ActionPerformer(self.core, self.export_dir, self._send_control)
        self.collector = None  # rankscope.coordinator.server.dump_collect.DumpCollector, created on first collect
        self.captures = CaptureBook()  # tensor values the console asked the ranks for
        self.last_judged_step = -1
        self.gc = GcPacer() if pace_gc else None
        self.judged_walls: collections.deque[tuple[int, float]] = collections.deque(maxlen=512)
        self._next_lag = 0.0
        self._known_incidents = {d["incident_id"] for d in self.core.incidents()}  # restored ones
        self.link = link
        self.ingest: Any = self.core
        if link is not None:
            from rankscope.coordinator.logic.views.coverage import ShardedCoverage
            from rankscope.coordinator.logic.shards.merge import VerdictMerge
            from rankscope.coordinator.logic.shards.summaries import ShardSummaries
            from rankscope.coordinator.server.findings_in import FindingsInbox
            self.merge, self.inbox = VerdictMerge(len(link.handles)), FindingsInbox()
            # Coverage and the report's curves come from the shards, which see the records.
            self.core.coverage = ShardedCoverage(len(link.handles))
            self.summaries = ShardSummaries(len(link.handles), self.core.coverage, self.core.series)
            self.actions.proof = self._shard_proof
            from rankscope.coordinator.logic.shards.shard import resync_events
            link.snapshot = lambda: resync_events(self.core)  # called on the loop thread (flush)
            self.ingest = link.fan_out(self.core)
            self._replies: list[tuple] = []
            self._told_terminated: set[str] = set()

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> str:
        return self.frontend.start()

    def stop(self) -> None:
        self.frontend.stop()
        self.actions.close()

    @property
    def endpoint(self) -> str | None:
        return self.frontend.endpoint

    # --- Handlers (loop thread) --------------------------------------------------------
    def on_steps(self, batches: list) -> None:
        if self.link is not None:
            self.link.steps(batches)
        else:
            self.core.on_steps(batches)
        self.metrics.add(records=sum(len(b) for b in batches))  # per rank-step, not per tensor

    def on_message(self, msg: Message, peer: Peer) -> None:
        b, job, t = msg.body, msg.job, msg.type
        if t == protocol.HEARTBEAT:
            sync = SyncPoint.from_wire(b.get("sync"))
            self.ingest.on_heartbeat(job, rank_from_wire(b["rank"]), b["step"], b["state"],
                                   sync.shifted(peer.clock.offset) if sync is not None else None,
                                   dropped=b.get("dropped"), started=b.get("started"))
        elif t == protocol.REGISTER:
            # The node agent forwards each registration with the id it proposes; the
            # job-wide id is decided here and sent back, the agent answers its rank with it.
            proposed = rank_from_wire(b.get("assigned_rank"))
            if proposed is None:
                log.warning("REGISTER from %s without a rank id: ignored", msg.src)
                return
            rank = self.identities.assign(job, b["host"], b["pid"], proposed)
            if rank != proposed:
                log.warning("job %s: pid %s on %s was proposed id %d, which another host's process "
                            "holds: assigned %d", job, b["pid"], b["host"], proposed, rank)
            peer.ranks.add((job, rank))
            self.ingest.on_register(job, rank, {**b, "assigned_rank": rank, "remapped": rank != b.get("claimed_rank")})
            detail = {"host": b["host"], "pid": b["pid"], "rank": rank, "settings": self.rank_settings}
            if self.link is not None:
                # Told where to send its steps only once every shard knows the rank.
                self._replies.append((peer.identity, job, {**detail, "shards": self.link.to_wire()}))
            else:
                self.frontend.send_status(peer.identity, "assigned", job=job, detail=detail)
        elif t == protocol.RANK_LOST:
            self.identities.lose(job, b["rank"])
            sync = SyncPoint.from_wire(b.get("sync"))
            died_at = b.get("died_at")
            self.ingest.on_rank_lost(job, rank_from_wire(b["rank"]), b["last_step"], b["exit_status"], b["reason"],
                                   died_at=None if died_at is None else float(died_at) + peer.clock.offset,
                                   signal=b.get("signal"), exception=b.get("exception"),
                                   sync=sync.shifted(peer.clock.offset) if sync is not None else None,
                                   position=position_from_wire(b.get("position")))
        elif t == protocol.RANK_MAP:
            self.core.on_rank_map(job, list(b["entries"]))
        elif t == protocol.BUNDLE_CHUNK:
            if not self.actions.accept_chunk(b) and self.collector is not None:
                self.collector.accept(b)
        elif t == protocol.STATUS:
            self._on_status(job, b)

    def _on_status(self, job: str, b: dict) -> None:
        detail = b.get("detail") or {}
        rank, what = detail.get("rank"), b["what"]
        step = detail.get("step") if isinstance(detail.get("step"), int) else -1
        if isinstance(rank, int) and what in ("paused", "running", "resumed", "stepping", "terminated"):
            started = detail.get("started")
            self.ingest.on_heartbeat(job, rank, step, "running" if what == "resumed" else what,
                                   started=started if isinstance(started, int) and not isinstance(started, bool) else None)
        elif isinstance(rank, int) and what == "watch":
            self.ingest.on_watch(job, rank, detail)
        elif isinstance(rank, int) and what == "dump":
            self.core.on_dump(job, rank, detail)
        elif what == rerun_facts.WHAT:
            self.core.on_rerun(job, detail)
        elif what == layout_facts.WHAT:
            rank, facts = layout_facts.check_detail(detail)  # checked by the decoder already: it cannot raise
            self.ingest.on_layout(job, rank, facts)
        elif isinstance(rank, int) and what == "finished":
            self.ingest.on_rank_finished(job, rank, step if step >= 0 else None)
        if what.startswith("collect") and self.collector is not None:
            self.collector.on_status(detail)
        elif what == capture_values.WHAT:
            self.captures.on_answer(detail)

    def on_tick(self, now: float) -> None:
        if self.link is not None:
            self._judged(self._sharded_tick(now))
        else:
            self._judged(self.core.tick(now))
        if now >= self._next_lag:  # lag needs every rank: once a second is plenty
            self._next_lag = now + 1.0
            self.metrics.add(lag=float(self.core.max_lag()))

    def _judged(self, verdicts: list) -> None:
        """After tick/drain: perform the core's actions, update metrics."""
        self.actions.run()
        counters = self.core.aligner.counters
        newest = max((g.judged_through for g in self.core.aligner.groups.values()), default=-1)
        if self.link is not None:
            newest = max([newest] + [self.merge.judged_through(g) for g in {g for j in self.merge.judged for g in j}])
        if newest > self.last_judged_step:
            # When each step was judged (detection latency = this - the step's last frame sent).
            self.judged_walls.append((newest, time.time()))
            self.last_judged_step = newest
            if self.gc is not None:
                self.gc.judged()
        rejected = sum(self.frontend.decoder.rejected.values())
        opened = 0
        if verdicts:
            ids = {d["incident_id"] for d in self.core.incidents()}
            opened, self._known_incidents = len(ids - self._known_incidents), ids
        judged = counters.get("steps_judged", 0) if self.link is None else self.summaries.steps_judged
        self.metrics.add(steps=judged - self.metrics.steps_judged, incidents=opened,
                         rejected=rejected - self.metrics.frames_rejected)

    # --- ingest shards (loop thread) -------------------------------------------------------
    def _sharded_tick(self, now: float) -> list:
        for job in self.core.terminated_jobs - self._told_terminated:
            self.link.event("job_terminated", job)
            self._told_terminated.add(job)
        replies = self._replies
        try:
            self.link.flush(wait_s=30.0 if replies else None)
        except Exception as exc:  # noqa: BLE001 - a slow or failed shard: the replies wait for the next tick
            log.warning("ingest shards did not take registrations yet (%s); %d replies wait", exc, len(replies))
            return self.core.tick(now)
        self._replies = []
        for ident, job, detail in replies:
            self.frontend.send_status(ident, "assigned", job=job, detail=detail)
        self._add_findings(self.inbox.take())
        for job, steps in self.merge.take_progress().items():
            self.core.on_progress(job, steps)
        return self.core.tick(now) + self.core.accept(self.merge.release(), now)

    def shard_findings(self, findings: dict) -> None:
        """A shard's findings of one tick (any thread; merged on the loop thread, in its order)."""
        self.inbox.put(findings)

    def shard_restarted(self, index: int) -> None:
        """Ray started shard ``index`` again (any thread): tell it the job with the next flush."""
        log.warning("ingest shard %d was restarted; its unjudged steps are lost (not seen)", index)
        self.frontend.call(self.link.restarted, index)

    def _add_findings(self, found: list[dict]) -> None:
        from rankscope.coordinator.logic.shards.shard import ShardFindings
        for f in map(ShardFindings.from_dict, found):
            self.merge.add(f)
            self.summaries.add(f)

    def _drain_shards(self) -> list:
        for d in self.link.drain():  # numbered after the pushes: they may still be on their way
            self.inbox.put(d)
        self._add_findings(self.inbox.settle(5.0))
        return self.core.accept(self.merge.release(force=True)) + self.core.drain()

    def _shard_proof(self, verdict: dict) -> dict:
        """An incident's proof from the shards that hold the steps around it (loop thread,
        when the incident is written)."""
        from rankscope.coordinator.logic.shards.summaries import merge_proofs
        try:
            proofs = self.link.proof(verdict)
        except Exception as exc:  # noqa: BLE001 - a report without its proof beats no report
            log.warning("ingest shards gave no proof for the incident (%s)", str(exc).splitlines()[0])
            return {}
        return merge_proofs(proofs, self.link.map.owner(verdict.get("kind")))

    def rank_states(self, job: str) -> dict[int, tuple[str, int]]:
        ranks = ((self.core.status().get("jobs") or {}).get(job) or {}).get("ranks") or {}
        return {int(r): (v["state"], v["step"]) for r, v in ranks.items()}

    def _send_control(self, command: str, *, job: str, incident: str | None = None,
                      args: dict | None = None, target: int | None = None) -> int:
        return self.frontend.send_control(command, job=job, args=args, incident=incident,
                                          target=target, peers=self._peers(job))

    def _peers(self, job: str) -> list[bytes]:
        # Agents that carried this job's ranks; before any did, every connected agent.
        return (self.frontend.peers_for(job) if job else []) or list(self.frontend.peers)

    # --- operations (any thread) -------------------------------------------------------
    def control(self, command: str, args: dict | None = None) -> dict:
        return self.frontend.call_sync(self._control, command, dict(args or {}))

    def _control(self, command: str, args: dict) -> dict:
        if command not in protocol.CONTROL_COMMANDS:
            raise ValueError(f"command: {command!r} is not one of {', '.join(sorted(protocol.CONTROL_COMMANDS))}")
        job = args.pop("job", None) or self.job or self.core.only_job()
        if command == "collect":
            return self._start_collect(job, args)
        if command == "capture":
            return self._start_capture(job, args)
        n = args.get("n")
        before = {d["incident_id"] for d in self.core.incidents()}
        actions = self.core.operator(command, job, n)  # validates; routes resume/terminate via the incident
        self.actions.run()
        out: dict[str, Any] = {"command": command, "job": job, "actions": [a.kind.value for a in actions],
                               "sent_to_agents": len(self._peers(job))}
        new = [d for d in self.core.incidents() if d["incident_id"] not in before]
        if new:
            out["incident"] = new[0]["incident_id"]
            out["dir"] = new[0].get("dir")
        return out

    def _start_capture(self, job: str, args: dict) -> dict:
        req = capture_values.check_request(args)
        known = set(self.rank_states(job))
        unknown = [r for r in req["ranks"] if r not in known]
        if unknown:
            raise ValueError(f"capture: job {job!r} has no rank {', '.join(map(str, unknown))}")
        entry = self.captures.open(req["tensor"], req["ranks"], time.time())
        sent = self._send_control("capture", job=job, args={"id": entry["id"], "tensor": req["tensor"],
                                                            "ranks": req["ranks"]})
        return {"command": "capture", "job": job, "capture": entry["id"], "tensor": req["tensor"],
                "ranks": req["ranks"], "sent_to_agents": sent}

    def _start_collect(self, job: str, args: dict) -> dict:
        from rankscope.coordinator.server.dump_collect import (
            DumpCollector,
            parse_steps,
            transfer_id,
        )
        steps, ranks = parse_steps(args.get("steps")), args.get("ranks") or None
        if ranks is not None and not all(isinstance(r, int) and r >= 0 for r in ranks):
            raise ValueError(f"collect: args.ranks must be non-negative rank ids, got {ranks!r}")
        tid = transfer_id(steps, ranks)
        if self.collector is None or self.collector.transfer != tid:
            self.collector = DumpCollector(self.export_dir / "dumps", set(self.rank_states(job)),
                                           steps=steps, ranks=ranks)
        body = {"transfer": tid, "steps": steps, "ranks": ranks, "resume": self.collector.resume_offsets()}
        sent = self._send_control("collect", job=job, args=body)
        return {"command": "collect", "job": job, "transfer": tid, "sent_to_agents": sent,
                "dest": str(self.collector.dest_root)}

    def drain(self, timeout_s: float = 30.0) -> list[dict]:
        """Judge every pending step now, then wait (up to ``timeout_s``) until no incident
        is still pausing or exporting; return the incidents."""
        self.frontend.call_sync(lambda: self._judged(self.core.drain() if self.link is None else self._drain_shards()),
                                timeout=max(30.0, timeout_s))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.frontend.call_sync(self._in_flight):
            time.sleep(0.05)
        self.frontend.call_sync(self._write_now)
        self.actions.flush(timeout_s)
        self._write_coverage()
        return self.incidents()

    def _write_coverage(self) -> None:
        """coverage.json: what every verdict of this run (or its absence) stands on."""
        from rankscope.coordinator.logic.views.coverage import describe
        from rankscope.files.atomic import atomic_write_bytes
        reports = self.frontend.call_sync(self._coverage)
        doc = {"jobs": {j: {**r, "summary": describe(r)} for j, r in reports.items()}}
        try:
            atomic_write_bytes(self.export_dir / "coverage.json", json.dumps(doc, indent=1).encode())
        except OSError as exc:
            log.warning("could not write coverage.json: %s", exc)

    def _write_now(self) -> None:
        """Out of time (the job is over): time out what still waits for pauses or bundles,
        so every incident gets its incident.json with what did arrive."""
        for d in self.core.incidents():
            for state, event in (("pausing", "pause_timeout"), ("exporting", "export_timeout")):
                current = next(i["state"] for i in self.core.incidents() if i["incident_id"] == d["incident_id"])
                if current == state:
                    self.core.incident_event(d["incident_id"], event)
                    self.actions.run()

    def _in_flight(self) -> bool:
        return any(d["state"] in ("detected", "pausing", "exporting") for d in self.core.incidents())

