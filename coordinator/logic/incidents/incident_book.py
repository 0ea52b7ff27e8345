"""The coordinator's incidents: opening them from verdicts, driving the state machine
from what the ranks report, and queueing the actions the service must perform.

Pure logic over the aligner's rank table; the only I/O is the incident store
(state.json / incident.json under the export dir).
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from rankscope.config.cluster import ClusterSettings, OnDivergence
from rankscope.coordinator.logic.align.aligner import RankRecord, RankState, StepAligner
from rankscope.coordinator.logic.incidents.cut import CutKeeper, held_before, started
from rankscope.coordinator.logic.incidents.incident import (
    Action,
    ActionKind,
    Incident,
    IncidentEvent,
    IncidentState,
)
from rankscope.coordinator.logic.incidents.incident_store import IncidentStore, incident_document, write_incident
from rankscope.coordinator.logic.job.reruns import RerunBook
from rankscope.coordinator.logic.verdict import JOB_WIDE, Verdict
from rankscope.wire import rerun_facts
from rankscope.wire.layout import incident_dir

log = logging.getLogger(__name__)

MAX_RELATED = 100
#: Incidents one job opens at most: each exports every rank's bundle, and a run of
#: 100,000 steps under ``continue`` with a recurring finding must not fill the disk with
#: them. Later verdicts are still kept (status, coverage) and counted, not exported.
MAX_INCIDENTS_PER_JOB = 100
MAX_QUEUED_ACTIONS = 1000
#: Findings about a value a rank computed: the ones a re-run of its step could explain.
_VALUE_FINDINGS = frozenset({"nan_origin", "outlier", "watchpoint"})
_OPERATOR = {"pause": ActionKind.PAUSE, "resume": ActionKind.RESUME, "terminate": ActionKind.TERMINATE,
             "step": ActionKind.STEP}


class IncidentBook:
    def __init__(self, settings: ClusterSettings, aligner: StepAligner, export_dir: Path | None,
                 clock: Callable[[], float], wall_clock: Callable[[], float],
                 rank_maps: dict[str, list[dict[str, Any]]]) -> None:
        self.settings, self.aligner, self.export_dir = settings, aligner, export_dir
        self.clock, self.wall_clock, self.rank_maps = clock, wall_clock, rank_maps
        self.store = IncidentStore(export_dir)
        self.actions: list[Action] = []
        self.by_id: dict[str, Incident] = {}
        self._since: dict[str, float] = {}
        #: Jobs rankscope terminated: their ranks ending is the expected outcome, not a
        #: finding, and no further incident is opened for them.
        self.terminated_jobs: set[str] = set()
        # Jobs an operator paused (rankscope pause) and has not resumed: an export there
        # must leave the job held, not resume it as the export policy does.
        self.held_by_operator: set[str] = set()
        self.cuts = CutKeeper()
        #: A named culprit that came while an undecided incident of its job was open: it
        #: opens its own incident (with the job's policy) once that one is over.
        self.deferred: dict[str, Verdict] = {}
        #: Verdicts per job that came after MAX_INCIDENTS_PER_JOB and opened nothing.
        self.capped: dict[str, int] = {}
        self.reruns = RerunBook()
        for inc in self.store.load_all():  # a restarted coordinator keeps its incidents
            self.by_id[inc.incident_id] = inc
            if inc.state is IncidentState.TERMINATED:
                self.terminated_jobs.add(inc.job)
            if not inc.final:
                self._since[inc.incident_id] = clock()

    def active(self, job: str) -> Incident | None:
        return next((i for i in self.by_id.values() if i.job == job and not i.final), None)

    def open_or_attach(self, v: Verdict, policy: OnDivergence | None = None) -> Incident | None:
        """Open an incident for the verdict's job, or file the verdict under the open one."""
        if v.job in self.terminated_jobs:
            return None
        inc = self.active(v.job)
        if inc is not None and v.decided and not inc.verdict.decided and v.job not in self.deferred:
            self.deferred[v.job] = v
            return inc
        if inc is not None:
            if len(inc.related) < MAX_RELATED:
                inc.related.append(v.to_dict())
                self.store.save(inc)
            return inc
        if v.detector != "manual" and sum(i.job == v.job for i in self.by_id.values()) >= MAX_INCIDENTS_PER_JOB:
            if not self.capped.get(v.job):
                log.warning("job %s: %d incidents opened; later verdicts are kept but export nothing",
                            v.job, MAX_INCIDENTS_PER_JOB)
            self.capped[v.job] = self.capped.get(v.job, 0) + 1
            return None
        wall = self.wall_clock()
        # An operator's export names no rank; an undecided verdict names none either.
        who = "-jobwide" if JOB_WIDE in v.evidence else "-undecided" if not v.decided else \
            f"-r{v.rank}" if v.rank >= 0 else ""
        base = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(wall))}-{v.detector}{who}-s{v.step}"
        iid, n = base, 1
        while iid in self.by_id:
            n += 1
            iid = f"{base}-{n}"
        if not v.decided:
            # Nobody to stop: a pause or a termination would hit the right rank's replicas
            # as surely as the wrong one. Export what there is and let the job run.
            policy = OnDivergence.CONTINUE
        policy = self._with_rerun(v, policy)
        inc = self.by_id[iid] = Incident(iid, v.job, policy or self.settings.on_divergence, v, wall)
        self.fire(inc, IncidentEvent.START)
        if v.urgent:
            # Where every thread of every rank is, now, before the launcher takes them
            # down: the named rank (and its ties) first.
            others = [r.rank for r in self._job_ranks(v.job) if r.rank not in (v.rank, *v.ties)]
            self._queue([Action(ActionKind.STACKS, v.job, iid, {"ranks": [v.rank, *v.ties, *others]})])
        if v.urgent and inc.state is IncidentState.PAUSING:
            # Dead or stuck ranks cannot pause, and the others are about to be taken down:
            # the pause is sent, but the export does not wait for it.
            self.fire(inc, IncidentEvent.PAUSE_TIMEOUT)
        return inc

    def _with_rerun(self, v: Verdict, policy: OnDivergence | None) -> OnDivergence | None:
        """The named rank's re-run of that step, if it made one, goes into the evidence;
        a transient fault takes ``cluster.on_transient``'s policy."""
        rr = self.reruns.lookup(v.job, v.rank, v.step) if v.decided and v.rank >= 0 else None
        if rr is None and v.decided and v.detector in _VALUE_FINDINGS:
            rec = self.aligner.ranks.get((v.job, v.rank))
            watch = (rec.watch or {}) if rec else {}
            # A compiled whole step says so in its watch line; GRAPH ranks always run so.
            compiled = watch.get("rerun") or watch.get("mode") == rerun_facts.GRAPH
            rr = rerun_facts.compiled(v.rank, v.step, str(watch.get("mode"))) if compiled \
                else rerun_facts.not_triggered(v.rank, v.step) if rec is not None else None
        if rr is None:
            return policy
        strikes = self.reruns.strikes(v.job).get(str(v.rank))
        v.evidence = {**v.evidence, "rerun": {**rr, "strikes": strikes} if strikes else rr}
        if rr["outcome"] != rerun_facts.TRANSIENT:
            return policy
        # skip: the step already went on with the re-run's result; nothing to stop for.
        return {"pause": OnDivergence.PAUSE, "skip": OnDivergence.CONTINUE}.get(self.settings.on_transient, policy)

    def on_rerun(self, job: str, detail: dict[str, Any]) -> None:
        """A rank's re-run outcome; one that comes after its step's incident opened joins it."""
        entry = self.reruns.add(job, detail)
        for inc in self.by_id.values():
            v = inc.verdict
            if inc.job == job and v.decided and (v.rank, v.step) == (entry["rank"], entry["step"]) \
                    and ("rerun" not in v.evidence or v.evidence["rerun"].get("assumed")):
                v.evidence = {**v.evidence, "rerun": entry}
                self.store.save(inc)
                if inc.final:
                    self.rewrite(inc.incident_id)

    def fire(self, inc: Incident, event: IncidentEvent) -> list[Action]:
        before = inc.state
        actions = inc.apply(event, self.wall_clock())
        if event is not IncidentEvent.CUT_MOVED:
            self._since[inc.incident_id] = self.clock()  # moving the cut does not restart the pause's clock
        if inc.state in (IncidentState.EXPORTING, IncidentState.WRITTEN) and not inc.ranks:
            inc.ranks = self._rank_snapshot(inc.job)  # the ranks as they were when the export began
        if any(a.kind is ActionKind.TERMINATE for a in actions):
            self.terminated_jobs.add(inc.job)
        self._queue(actions)
        if any(a.kind is ActionKind.PAUSE for a in actions) or before is IncidentState.PAUSING:
            urgent = inc.verdict.urgent  # a crash: the export did not wait for the pause at all
            cut = self.cuts.report(inc.job, self._job_ranks(inc.job), self.wall_clock(),
                                   given_up=event is IncidentEvent.PAUSE_TIMEOUT and not urgent)
            if cut is not None and urgent:
                cut["not_waited_for"] = "a rank died or hung: the bundles were exported at once"
            inc.cut = cut or inc.cut
        self.store.save(inc)
        return actions

    def _queue(self, actions: list[Action]) -> None:
        for a in actions:
            if a.kind in (ActionKind.PAUSE, ActionKind.STEP):
                # One step for the whole job: every rank holds before it (a consistent cut).
                ranks, why = self._job_ranks(a.job), "divergence" if a.incident_id else "pause"
                if a.kind is ActionKind.STEP:
                    a.detail["at"] = self.cuts.choose(a.job, ranks, f"step {a.detail['n']}", self.clock(),
                                                      ahead=a.detail["n"])
                else:
                    a.detail["at"] = self.cuts.choose(a.job, ranks, why, self.clock())
            elif a.kind in (ActionKind.RESUME, ActionKind.TERMINATE):
                self.cuts.clear(a.job)
            if a.kind in (ActionKind.RESUME, ActionKind.STEP):
                # Take the resume as done: until their heartbeats say so, stale "paused"
                # states would make the next incident's pause look complete at once.
                for r in self._job_ranks(a.job):
                    if r.state is RankState.PAUSED:
                        r.state = RankState.RUNNING
        self.actions += actions
        if len(self.actions) > MAX_QUEUED_ACTIONS:  # nobody is taking them: keep the newest
            log.warning("dropping %d untaken incident actions", len(self.actions) - MAX_QUEUED_ACTIONS)
            del self.actions[:-MAX_QUEUED_ACTIONS]

    def _job_ranks(self, job: str) -> list[RankRecord]:
        return [r for (j, _), r in sorted(self.aligner.ranks.items()) if j == job]

    def _rank_snapshot(self, job: str) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for r in self._job_ranks(job):
            snap: dict[str, Any] = {"state": r.state.value, "step": r.last_step, "heartbeat_step": r.heartbeat_step,
                                    "started": started(r), "paused_before": held_before(r)}
            if r.death is not None:
                snap.update({k: v for k, v in r.death.items() if v is not None})
            if r.sync is not None:
                snap["sync"] = r.sync.to_wire()
            if r.watch is not None:
                snap["watch"] = dict(r.watch)
            out[r.rank] = snap
        return out

    def advance(self, now: float) -> None:
        """Fire the events the rank table shows: a rank past the cut, all paused, all
        bundles in, or a timeout; open a deferred verdict's incident once its job has none."""
        for job in [j for j in self.deferred if self.active(j) is None]:
            self.open_or_attach(self.deferred.pop(job))
        self._review_cuts()
        for inc in [i for i in self.by_id.values() if not i.final]:
            since = self._since.get(inc.incident_id, now)
            if inc.state is IncidentState.PAUSING:
                # Stalled and lost ranks cannot pause; the timeout covers ranks that never do.
                if self.cuts.settled(inc.job, self._job_ranks(inc.job)):
                    self.fire(inc, IncidentEvent.ALL_PAUSED)
                elif now - since >= self.settings.pause_timeout_s:
                    self.fire(inc, IncidentEvent.PAUSE_TIMEOUT)
            elif inc.state is IncidentState.EXPORTING:
                # Lost ranks too: their node agent sends the bundle on their behalf.
                want = {r.rank for r in self._job_ranks(inc.job) if r.state is not RankState.EXPECTED}
                # After a coordinator restart no rank has been seen yet: the snapshot taken
                # at the pause still says whose bundles this incident is waiting for.
                want |= set(inc.ranks)
                if want <= set(inc.bundles):
                    self.fire(inc, IncidentEvent.BUNDLES_RECEIVED)
                elif now - since >= self.settings.export_timeout_s:
                    self.fire(inc, IncidentEvent.EXPORT_TIMEOUT)

    def _review_cuts(self) -> None:
        """A rank already began the cut's step: pause every rank again, at a later one."""
        for job in list(self.cuts.cuts):
            moved = self.cuts.review(job, self._job_ranks(job))
            if moved is None:
                continue
            log.info("job %s: a rank was past the pause step; every rank now pauses before step %d", job, moved)
            inc = self.active(job)
            if inc is not None and inc.policy is not OnDivergence.CONTINUE and inc.state in (
                    IncidentState.PAUSING, IncidentState.EXPORTING, IncidentState.WRITTEN):
                self.fire(inc, IncidentEvent.CUT_MOVED)
            else:
                self._queue([Action(ActionKind.PAUSE, job, None, {})])

    def cut_report(self, job: str) -> dict[str, Any] | None:
        return self.cuts.report(job, self._job_ranks(job), self.wall_clock())

    def take_actions(self) -> list[Action]:
        out, self.actions = self.actions, []
        return out

    def on_bundle(self, incident_id: str, rank: int, path: str | os.PathLike) -> None:
        self.on_bundles(incident_id, {rank: path})

    def on_bundles(self, incident_id: str, paths: dict[int, str | os.PathLike]) -> None:
        """Several ranks' bundles at once: the incident's state is saved once, not per rank."""
        inc = self.by_id[incident_id]
        for rank, path in paths.items():
            inc.bundles[int(rank)] = str(path)
        self.store.save(inc)

    def write(self, incident_id: str) -> Path:
        if self.export_dir is None:
            raise ValueError("export_dir: not set, cannot write incident.json")
        inc = self.by_id[incident_id]
        path = write_incident(self.export_dir, inc, rank_map=self.rank_maps.get(inc.job))
        inc.incident_json = str(path)
        self.fire(inc, IncidentEvent.WRITE_DONE)
        return path

    def rewrite(self, incident_id: str) -> Path | None:
        inc = self.by_id.get(incident_id)
        if inc is None or inc.incident_json is None or self.export_dir is None:
            return None
        return write_incident(self.export_dir, inc, rank_map=self.rank_maps.get(inc.job))

    def operator(self, command: str, job: str, n: int | None = None) -> list[Action]:
        inc = self.active(job)
        if command in ("resume", "terminate") and inc is not None:
            self.held_by_operator.discard(job)
            return self.fire(inc, IncidentEvent(command))
        if command == "export":
            if inc is not None:
                raise ValueError(f"export: incident {inc.incident_id} is already open for job {job}")
            newest = max((r.last_step for r in self._job_ranks(job)), default=-1)
            v = Verdict("manual", -1, newest, None, None, None, f"{job}/*", {"rule": "operator export"}, [], job)
            before = len(self.actions)
            self.terminated_jobs.discard(job)  # an explicit request is honoured
            held = job in self.held_by_operator
            self.open_or_attach(v, OnDivergence.PAUSE if held else OnDivergence.EXPORT)
            return self.actions[before:]
        if command not in _OPERATOR:
            raise ValueError(f"command: unknown {command!r} (pause|resume|step|terminate|export)")
        if command == "step" and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"step: n must be a positive integer, got {n!r}")
        act = Action(_OPERATOR[command], job, None, {"n": n} if command == "step" else {})
        if command == "terminate":
            self.terminated_jobs.add(job)
        if command in ("pause", "step"):
            self.held_by_operator.add(job)
        else:
            self.held_by_operator.discard(job)
        self._queue([act])
        return [act]

    def documents(self) -> list[dict[str, Any]]:
        """Every incident as the user-facing document (incident.json's fields, plus ``dir``)."""
        return [incident_document(inc, rank_map=self.rank_maps.get(inc.job), export_dir=self.export_dir)
                for inc in self.by_id.values()]

    def listing(self) -> list[dict[str, Any]]:
        out = []
        for inc in self.by_id.values():
            d = inc.to_dict()
            if self.export_dir is not None:
                d["dir"] = str(incident_dir(self.export_dir, inc.incident_id))
            out.append(d)
        return out
