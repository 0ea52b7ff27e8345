"""What the coordinator core reports: coverage, lag and ``rankscope status``'s document,
read from the core's tables (no decisions here)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rankscope.coordinator.logic.align.aligner import RankRecord, RankState
from rankscope.coordinator.logic.detectors.loss_scale import LossScaleDetector
from rankscope.coordinator.logic.detectors.loss_scale import status_of as loss_scale_status
from rankscope.coordinator.logic.detectors.replica import ReplicaDetector, healed_summary
from rankscope.coordinator.logic.detectors.same_data import NAME as SAME_DATA
from rankscope.coordinator.logic.detectors.same_data import summary as same_data_summary
from rankscope.coordinator.logic.incidents.stops import stop_of
from rankscope.wire.sync import OUT

if TYPE_CHECKING:
    from rankscope.coordinator.logic.core import CoordinatorCore


def coverage_report(self: "CoordinatorCore", job: str) -> dict[str, Any]:
    """Which steps of which ranks were seen and judged (see :mod:`.coverage`), and what
    the ranks' re-runs of anomalous steps said."""
    ends, mine = {}, []
    for (j, rank), rec in self.aligner.ranks.items():
        if j == job:
            ends[rank] = _last_run(rec) if rec.state is RankState.LOST else None
            mine.append(rec)
    report = self.coverage.report(job, ends)
    stop = stop_of(mine)
    if stop is not None:
        report["stopped"] = stop
    reruns = self.book.reruns.strikes(job)
    if reruns:
        report["reruns"] = reruns
    healed = healed_splits(self, job)
    if healed["count"]:
        report["replica_splits_healed"] = healed
    same = same_data(self, job)
    if same is not None:
        report["same_data"] = same
    scale = loss_scale(self, job)
    if scale is not None:
        report["loss_scale"] = scale
    cost = watch_cost(mine)
    if cost is not None:
        report["watch_cost"] = cost
    return report


def loss_scale(self: "CoordinatorCore", job: str) -> dict[str, Any] | None:
    """The job's loss scale and its overflow steps (:mod:`.detectors.loss_scale`), or None
    when the job runs without one. Groups of one job share the scale; their counts add."""
    found = [s for g in self.aligner.groups.values() if g.job == job
             for s in [loss_scale_status(g.state.get(LossScaleDetector.name, {}))] if s is not None]
    if not found:
        return None
    first = found[0]
    return {"scale": first["scale"], "overflow_steps": max(s["overflow_steps"] for s in found),
            "recent_overflows": first["recent_overflows"], "streak": max(s["streak"] for s in found),
            "scale_changes": first["scale_changes"]}


def healed_splits(self: "CoordinatorCore", job: str) -> dict[str, Any]:
    """Last-bit splits of optimizer state that agreed again a step later, so were no
    finding (:mod:`.detectors.replica`): how many, and the newest ones. Counted where the
    steps are judged (with ingest shards: in each shard)."""
    return healed_summary([g.state.get(ReplicaDetector.name, {}) for g in self.aligner.groups.values()
                           if g.job == job])


def same_data(self: "CoordinatorCore", job: str) -> dict[str, Any] | None:
    """Data-parallel ranks that read the same data (:mod:`.detectors.same_data`), or None."""
    return same_data_summary([g.state.get(SAME_DATA, {}) for g in self.aligner.groups.values() if g.job == job])


def max_lag(self: "CoordinatorCore") -> int:
    """The largest gap, in steps, between a job's newest step and a live rank's: the
    ``lag`` of :meth:`status` without building a row per rank."""
    # Column-wise per group: a verdict actor runs this every second over every rank.
    by_job: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for grp in self.aligner.groups.values():
        if grp.members:
            steps = np.fromiter((m.last_step for m in grp.members), np.int64, len(grp.members))
            by_job.setdefault(grp.job, []).append((steps, grp.live_mask()))
    lag = 0
    for parts in by_job.values():
        newest = max(int(steps.max()) for steps, _ in parts)
        lag = max([lag] + [newest - int(steps[live].min()) for steps, live in parts if live.any()])
    return lag

def status(self: "CoordinatorCore") -> dict[str, Any]:
    now = self.clock()
    jobs: dict[str, Any] = {}
    for (job, rank), rec in sorted(self.aligner.ranks.items()):
        j = jobs.setdefault(job, {"ranks": {}, "newest_step": -1})
        j["newest_step"] = max(j["newest_step"], rec.last_step)
        j["ranks"][str(rank)] = {
            "state": rec.state.value, "step": rec.last_step, "group": rec.group.label,
            "heartbeat_step": rec.heartbeat_step, "host": rec.info.get("host"), "pid": rec.info.get("pid"),
            "seen_s_ago": None if rec.last_seen is None else round(now - rec.last_seen, 3),
            "watch": rec.watch,
        }
    for job, j in jobs.items():
        for r in j["ranks"].values():
            r["lag"] = j["newest_step"] - r["step"]
        j["cut"] = self.book.cut_report(job)
        j["layout"] = self.layout(job)
        j["verdicts_past_incident_cap"] = self.book.capped.get(job, 0)
        j["reruns"] = self.book.reruns.strikes(job)
        j["replica_splits_healed"] = healed_splits(self, job)
        j["loss_scale"] = loss_scale(self, job)
        j["same_data"] = same_data(self, job)
    return {
        "jobs": jobs, "pending_steps": self.aligner.pending_steps(), "counters": dict(self.aligner.counters),
        "steps_judged": self.aligner.counters["steps_judged"], "records": self.aligner.counters["records"],
        "verdicts": [v.to_dict() for v in list(self.verdicts)[-20:]],
        "incidents": [{"incident_id": i.incident_id, "state": i.state.value, "job": i.job,
                       "summary": i.verdict.summary()} for i in self.book.by_id.values()],
    }


def _last_run(rec: RankRecord) -> int:
    """The last step a lost rank ran through, when that is later than its records say (a
    step's records leave after it ends, so a rank killed then never sent its last one:
    that step was not seen): the step before the one it had begun when it died, or the
    step whose last collective it had left (a compiled step is begun until the next one
    starts, so a rank killed between them has begun only the step it finished)."""
    began = (rec.death or {}).get("began")
    out = max(rec.last_step, began - 1) if isinstance(began, int) else rec.last_step
    if rec.sync is not None and rec.sync.phase == OUT:
        out = max(out, rec.sync.step)
    return out


def watch_cost(recs: list) -> dict[str, Any] | None:
    """What each rank's watch cost, as it last said (probe.vitals.vital), and the bound it sets:
    ``fingerprint_every_steps`` is the largest K, the most steps a silent change of a
    weight can go unnamed; None when no rank said."""
    per = {str(rec.rank): dict(rec.watch["cost"]) for rec in recs
           if isinstance(rec.watch, dict) and isinstance(rec.watch.get("cost"), dict)}
    if not per:
        return None
    every = max((int(c.get("every") or 1) for c in per.values()), default=1)  # None: not planned yet
    tiers = sorted({str(c.get("tier")) for c in per.values()})
    return {"tiers": tiers, "fingerprint_every_steps": every, "ranks": per}
