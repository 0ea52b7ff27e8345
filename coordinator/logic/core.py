"""CoordinatorCore: the coordinator's decisions, with no Ray, sockets or threads.

The service (coordinator/actor.py) feeds it decoded messages (``on_register``,
``on_step``, ``on_heartbeat``, ``on_rank_lost``, ...), calls :meth:`tick` often, and
performs the :class:`~rankscope.coordinator.logic.incidents.incident.Action` objects it hands out via
:meth:`take_actions` (pause/export/resume/terminate every rank, write incident.json via
:meth:`write_incident`). Time comes from the injected ``clock`` so tests script it.
"""
from __future__ import annotations

import collections
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from rankscope.config.cluster import ClusterSettings, parse_cluster
from rankscope.config.watchpoints import parse_watchpoints
from rankscope.coordinator.logic.views import core_status
from rankscope.coordinator.logic.align.aligner import (
    LIVE_STATES,
    Group,
    RankState,
    StepAligner,
    StepView,
)
from rankscope.coordinator.logic.views.coverage import Coverage
from rankscope.coordinator.logic.detector_set import build_step_detectors
from rankscope.coordinator.logic.detectors.progress import ProgressDetector
from rankscope.coordinator.logic.incidents.failures import Death, FailureJudge
from rankscope.coordinator.logic.job.identities import merge_rank_maps
from rankscope.coordinator.logic.incidents.incident import Action, IncidentEvent
from rankscope.coordinator.logic.incidents.incident_book import IncidentBook
from rankscope.coordinator.logic.views.series import SeriesRecorder
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.layout import rank_from_wire
from rankscope.wire.records import StepBatch
from rankscope.wire.step_pack import StepPack
from rankscope.wire.sync import SyncPoint

log = logging.getLogger(__name__)

_HEARTBEAT_STATES = {"paused": RankState.PAUSED, "running": RankState.RUNNING, "stepping": RankState.RUNNING,
                     "terminated": RankState.FINISHED}


class CoordinatorCore:
    def __init__(self, settings: ClusterSettings | dict | None = None,
                 clock: Callable[[], float] = time.monotonic, *,
                 export_dir: str | os.PathLike | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        if settings is None or isinstance(settings, dict):
            settings = parse_cluster(settings)
        self.settings = settings
        self.clock, self.wall_clock = clock, wall_clock
        self.export_dir = Path(export_dir) if export_dir is not None else None
        self.aligner = StepAligner(settings)
        self.detectors = build_step_detectors(settings)
        self.progress = ProgressDetector(settings.detectors.progress)
        self.failures = FailureJudge(settings.failure_settle_s, settings.teardown_window_s, settings.hang_timeout_s)
        self.series = SeriesRecorder()
        self.coverage = Coverage()
        self.rank_maps: dict[str, list[dict[str, Any]]] = {}
        self.verdicts: collections.deque[Verdict] = collections.deque(maxlen=1000)
        self._quiet: dict[tuple, float] = {}
        self.book = IncidentBook(settings, self.aligner, self.export_dir, clock, wall_clock, self.rank_maps)

    # --- ingestion ----------------------------------------------------------------
    def on_register(self, job: str, rank: int, info: dict[str, Any]) -> None:
        if job in self.terminated_jobs and info.get("pid") is not None:
            rec = self.aligner.ranks.get((job, rank))
            if rec is None or rec.info.get("pid") != info["pid"]:
                self.terminated_jobs.discard(job)  # new processes under the same job id: a new run
        rec = self.aligner.ranks.get((job, rank))
        generation = rec.group.generation if rec is not None else None
        rec = self.aligner.register(job, rank, dict(info))
        if generation is not None and rec.group.generation != generation:
            # A new run reuses the job id: what detectors stayed quiet about was the old run's.
            self._quiet = {k: v for k, v in self._quiet.items() if k[1] != rec.group.label}

    def on_step(self, batch: StepBatch) -> None:
        if rank_from_wire(batch.rank) is None:  # a probe that never learned its rank: nothing to align it with
            self.aligner.counters["unranked_batches"] += 1
            return
        self.aligner.ingest(batch, self.clock())

    def on_steps(self, batches: list[StepBatch | StepPack]) -> None:
        ranked: list[StepBatch | StepPack] = []
        for b in batches:
            if type(b) is StepPack and all(rank_from_wire(r) is not None for r in b.ranks):
                ranked.append(b)
                continue
            for part in (b.batches() if type(b) is StepPack else (b,)):
                if rank_from_wire(part.rank) is None:  # a probe that never learned its rank: nothing to align it with
                    self.aligner.counters["unranked_batches"] += 1
                else:
                    ranked.append(part)
        self.aligner.ingest_many(ranked, self.clock())

    def on_progress(self, job: str, steps: dict[int, int]) -> None:
        """Ranks' newest reported steps, as an ingest shard saw them (this core then
        knows who runs and where, without their records)."""
        now = self.clock()
        for rank, step in steps.items():
            self.aligner.note_step(self.aligner.rank(job, rank), step, now)

    def on_heartbeat(self, job: str, rank: int | None, step: int, state: str,
                     sync: SyncPoint | None = None, dropped: int | None = None,
                     started: int | None = None) -> None:
        """``sync``: the rank's newest sync point, already on the coordinator's clock;
        ``dropped``: how many steps the rank's client has dropped so far; ``started``:
        the step it last began."""
        if rank is None:
            return
        if dropped:
            self.coverage.dropped(job, rank, dropped)
        rec = self.aligner.rank(job, rank)
        rec.last_seen, rec.heartbeat_step = self.clock(), step
        if started is not None:
            rec.started = started
        if sync is not None and (rec.sync is None or (sync.key(), sync.phase != "in") >= (rec.sync.key(),
                                                                                           rec.sync.phase != "in")):
            if rec.sync is None:
                rec.group.synced += 1
            rec.sync = sync
        new = _HEARTBEAT_STATES.get(state)
        if new is None or rec.state in (RankState.LOST, RankState.FINISHED):
            return
        # A hung rank's heartbeat thread keeps saying "running": only a new step (or a
        # pause at a step boundary) brings a stalled rank back into the waited-for set.
        if rec.state is RankState.STALLED and new is RankState.RUNNING:
            return
        rec.state = new

    def on_rank_lost(self, job: str, rank: int | None, last_step: int, exit_status: int | None,
                     reason: str, *, died_at: float | None = None, signal: int | None = None,
                     exception: str | None = None, sync: SyncPoint | None = None,
                     position: tuple[int, int] | None = None) -> None:
        """A rank's process ended badly (or went silent). Times on the coordinator's clock.
        ``position``: the (step, token) it last began, when it counted tokens."""
        if rank is None:  # lost before it was given a rank id: it never took part in a step
            log.warning("job %s: a process without a rank id was lost (%s)", job, reason)
            return
        rec = self.aligner.rank(job, rank)
        if rec.state in (RankState.LOST, RankState.FINISHED):
            return
        if exit_status == 0 or job in self.terminated_jobs:  # a clean exit, or one we asked for
            rec.state = RankState.FINISHED
            return
        rec.state = RankState.LOST
        rec.last_step = max(rec.last_step, last_step)
        if sync is not None and (rec.sync is None or sync.key() >= rec.sync.key()):
            rec.sync = sync  # its node agent read it after the death: fresher than its last heartbeat
        died_at = self.wall_clock() if died_at is None else died_at
        began = max((s for s in (rec.started, position[0] if position else None) if s is not None), default=None)
        rec.death = {"exit_status": exit_status, "signal": signal, "reason": reason, "exception": exception,
                     "died_at": died_at, "began": began}
        if self.settings.detectors.progress.enabled:
            self.failures.death(rec.group, Death(rank, died_at, exit_status, signal, reason, exception, last_step,
                                                 sync, position), self.clock())

    def on_layout(self, job: str, rank: int, facts: dict[str, Any]) -> None:
        """What the rank saw of the job's parallel layout (validated by the wire decoder)."""
        self.aligner.learn_layout(job, rank, facts)

    def layout(self, job: str) -> dict[str, Any]:
        """The job's layout as users read it: its line, where it came from, its sets."""
        return self.aligner.layouts.layout(job).to_dict()

    def on_dump(self, job: str, rank: int, detail: dict[str, Any]) -> None:
        """What of the rank's local dump stays on disk (validated by the wire decoder)."""
        self.coverage.local_dump(job, rank, detail)

    def on_rerun(self, job: str, detail: dict[str, Any]) -> None:
        """A rank re-ran an anomalous step and says what came out (validated by the decoder)."""
        self.book.on_rerun(job, detail)

    def on_watch(self, job: str, rank: int, detail: dict[str, Any]) -> None:
        """The rank said how it is watched (validated by the wire decoder)."""
        watch = {k: detail[k] for k in ("mode", "how", "reason")}
        watch |= {k: detail[k] for k in ("rerun", "cost") if detail.get(k)}
        self.aligner.rank(job, rank).watch = watch

    def on_rank_finished(self, job: str, rank: int, last_step: int | None = None) -> None:
        rec = self.aligner.rank(job, rank)
        rec.state = RankState.FINISHED
        if last_step is not None:
            rec.last_step = max(rec.last_step, last_step)

    def on_rank_map(self, job: str, entries: list[dict[str, Any]]) -> None:
        # Every node agent sends the rows of its own processes: the job's map is them all.
        self.rank_maps[job] = merge_rank_maps(self.rank_maps.get(job, []), list(entries))

    def set_watchpoints(self, rules: list[dict[str, Any]]) -> None:
        """Replace the watchpoints at run time (same format as ``cluster.watchpoints``)."""
        parsed = parse_watchpoints(rules, "watchpoints")
        for det in self.detectors:
            if det.name == "watchpoint":
                det.set_rules(parsed)
                return
        from rankscope.coordinator.logic.detectors.watchpoints import WatchpointDetector
        self.detectors.append(WatchpointDetector(parsed))

    # --- judging ------------------------------------------------------------------
    def tick(self, now: float | None = None) -> list[Verdict]:
        """Judge every step that is complete or past its deadline; advance incidents."""
        now = self.clock() if now is None else now
        return self._judge(now, force=False)

    def drain(self) -> list[Verdict]:
        """Judge everything pending now (job end). Ranks missing from these last steps
        are not findings: a rank that died is reported by its node agent instead."""
        return self._judge(self.clock(), force=True)

    def _judge(self, now: float, force: bool) -> list[Verdict]:
        found: list[Verdict] = []
        for grp, view in self.aligner.ready(now, force=force):
            found += self._judge_step(grp, view, report_missing=not force or view.by_deadline)
        return self.accept(found + self._liveness(now, force), now)

    def _liveness(self, now: float, force: bool) -> list[Verdict]:
        """Crashes, hangs and lagging ranks of every group (a lagging rank is stalled: no
        step waits for it any more)."""
        found: list[Verdict] = []
        if self.settings.detectors.progress.enabled:
            for grp in self.aligner.groups.values():
                if grp.job not in self.terminated_jobs:
                    found += self.failures.judge(grp, now, self.wall_clock(), force=force)
                for v in self.progress.lagging(grp, None if force else now):
                    self._stall(grp.job, [v.rank, *v.ties])
                    found.append(v)
        return found

    def accept(self, found: list[Verdict], now: float | None = None) -> list[Verdict]:
        """File verdicts (this core's own, or merged from ingest shards): the repeats a
        detector stays quiet about are dropped, the rest open or join incidents."""
        out = [v for v in sorted(found, key=Verdict.sort_key) if not self._suppressed(v)]
        for v in out:
            self.verdicts.append(v)
            self.book.open_or_attach(v)
        self.book.advance(self.clock() if now is None else now)
        return out

    def _judge_step(self, grp: Group, view: StepView, report_missing: bool) -> list[Verdict]:
        # The step judged just before, set here and not when the view was made: a coordinator
        # running behind gets several steps ready at once, made before any was judged.
        view.prev = grp.prev
        found: list[Verdict] = []
        for det in self.detectors:
            try:
                found += det.judge(view, grp.state.setdefault(det.name, {}))
            except Exception:  # one broken detector must not blind the others
                log.exception("detector %s failed on %s step %d", det.name, view.group, view.step)
        if view.missing and report_missing and self.settings.detectors.progress.enabled:
            hung = self.failures.behind(grp, view.missing) if grp.job not in self.terminated_jobs else None
            found += [hung] if hung is not None else self.progress.missing(view, grp.members, self.settings.deadline_s)
            self._stall(grp.job, view.missing)
        self.series.add(view)
        self.coverage.judged(view.job, view.step, view.ranks[view.reported].tolist())
        view.prev = None  # keep one step of history, not a chain
        grp.prev = view
        return found

    def _stall(self, job: str, ranks: list[int]) -> None:
        # Not waited for until it reports again, so one hung rank costs one deadline, not one per step.
        for r in ranks:
            rec = self.aligner.ranks.get((job, r))
            if rec is not None and rec.state in LIVE_STATES:
                rec.state = RankState.STALLED

    def _suppressed(self, v: Verdict) -> bool:
        # NaN spreads to every rank after the first reduction: one origin per group.
        # Other detectors stay quiet about a flagged rank for repeat_after_steps.
        if v.detector == "nan_origin":
            key, until = (v.detector, v.group, None), math.inf
        elif not v.decided:
            # Names nobody: a rank this detector already named among them explains it (a
            # drifted replica left with one peer); a later verdict naming one of them is new.
            if any(v.step < self._quiet.get((v.detector, v.group, r), -math.inf) for r in v.candidates):
                return True
            key, until = (v.detector, v.group, tuple(v.candidates)), v.step + self.settings.detectors.repeat_after_steps
        else:
            key, until = (v.detector, v.group, v.rank), v.step + self.settings.detectors.repeat_after_steps
        if v.step < self._quiet.get(key, -math.inf):
            return True
        self._quiet[key] = until
        return False

    # --- incidents (coordinator/logic/incidents/incident_book.py) -----------------------------
    @property
    def terminated_jobs(self) -> set[str]:
        return self.book.terminated_jobs

    def take_actions(self) -> list[Action]:
        """Actions the service must perform now, oldest first (each is handed out once)."""
        return self.book.take_actions()

    def on_bundle(self, incident_id: str, rank: int, path: str | os.PathLike) -> None:
        """A rank's bundle for an incident is complete at ``path``."""
        self.book.on_bundle(incident_id, rank, path)

    def on_bundles(self, incident_id: str, paths: dict[int, str | os.PathLike]) -> None:
        """Bundles of many ranks that are complete together (a dump tree's folders)."""
        self.book.on_bundles(incident_id, paths)

    def write_incident(self, incident_id: str) -> Path:
        """Perform a WRITE_INCIDENT action: write incident.json, then move on per policy."""
        return self.book.write(incident_id)

    def rewrite_incident(self, incident_id: str) -> Path | None:
        """incident.json again, with the incident's state now; None if it was never written."""
        return self.book.rewrite(incident_id)

    def incident_event(self, incident_id: str, event: IncidentEvent | str) -> list[Action]:
        """Drive an incident from outside (e.g. the service's own write); returns its actions."""
        return self.book.fire(self.book.by_id[incident_id], IncidentEvent(event))

    def operator(self, command: str, job: str | None = None, n: int | None = None) -> list[Action]:
        """An operator's pause/resume/step/terminate/export; routed through the open incident."""
        return self.book.operator(command, job or self.only_job(), n)

    def only_job(self) -> str:
        jobs = sorted({j for j, _ in self.aligner.ranks} | ({self.settings.job} if self.settings.job else set()))
        if len(jobs) != 1:
            raise ValueError(f"job: must be given when the coordinator serves {len(jobs)} jobs ({jobs[:5]})")
        return jobs[0]

    # --- reporting ----------------------------------------------------------------
    def coverage_report(self, job: str) -> dict[str, Any]:
        """Which steps of which ranks were seen and judged (see :mod:`.coverage`)."""
        return core_status.coverage_report(self, job)

    def documents(self) -> list[dict[str, Any]]:
        """Every incident as users read it (incident.json's fields, plus ``dir``)."""
        return self.book.documents()

    def incidents(self) -> list[dict[str, Any]]:
        """Every incident (open and final) as a dict, with its ``dir`` under the export dir."""
        return self.book.listing()

    def max_lag(self) -> int:
        """The largest gap, in steps, between a job's newest step and a live rank's."""
        return core_status.max_lag(self)

    def status(self) -> dict[str, Any]:
        return core_status.status(self)
