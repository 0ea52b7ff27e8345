"""An ingest shard: aligns and judges its kinds of every step, and files nothing itself.

A shard is a :class:`CoordinatorCore` fed every control message of the job (registration,
heartbeats, lost and finished ranks) but only its kinds' records (rankscope.wire.shards).
Judging is the same code as one coordinator's; what differs is that the findings are not
filtered for repeats nor turned into incidents here: they go to the verdict merge
(:mod:`.merge`), which names the one global first divergence, and from there to the one
core that owns incidents (``CoordinatorCore.accept``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rankscope.config.cluster import ClusterSettings
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import StepBatch
from rankscope.wire.step_pack import StepPack


@dataclass
class ShardFindings:
    """What one shard judged in one tick. ``steps``: (judged step, verdict) pairs, held by
    the merge until every shard judged that step (a missing rank's verdict names a later
    step than the one judged); ``other``: crashes, hangs and lag, judged
    by every shard alike and passed on at once; ``judged``: group label -> the newest
    step this shard has judged."""

    shard: int
    steps: list[tuple[int, Verdict]] = field(default_factory=list)
    other: list[Verdict] = field(default_factory=list)
    judged: dict[str, int] = field(default_factory=dict)
    #: job -> {rank: newest step reported since the last findings} (shard 0 only).
    progress: dict[str, dict[int, int]] = field(default_factory=dict)
    #: Steps judged since the last findings: (job, step, ranks whose records were in it),
    #: the verdict side's coverage (:class:`~.coverage.ShardedCoverage`).
    covered: list[tuple[str, int, list[int]]] = field(default_factory=list)
    #: Their report curve rows: (group, ranks, row of :meth:`~.series.SeriesRecorder.append`),
    #: merged over the shards by :mod:`.summaries`.
    rows: list[tuple[str, list[int], tuple]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "steps": [(s, v.to_dict()) for s, v in self.steps],
                "other": [v.to_dict() for v in self.other], "judged": dict(self.judged),
                "progress": {j: list(p.items()) for j, p in self.progress.items()},
                "covered": list(self.covered), "rows": list(self.rows)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ShardFindings":
        return cls(int(d["shard"]), [(int(s), Verdict.from_dict(v)) for s, v in d["steps"]],
                   [Verdict.from_dict(v) for v in d["other"]], {str(k): int(v) for k, v in d["judged"].items()},
                   {str(j): {int(r): int(s) for r, s in p} for j, p in (d.get("progress") or {}).items()},
                   list(d.get("covered") or []), list(d.get("rows") or []))


class ShardCore(CoordinatorCore):
    def __init__(self, settings: ClusterSettings | dict | None = None,
                 clock: Callable[[], float] = time.monotonic, *, shard: int = 0,
                 wall_clock: Callable[[], float] = time.time) -> None:
        super().__init__(settings, clock, export_dir=None, wall_clock=wall_clock)
        self.shard = shard
        self._progress: dict[str, dict[int, int]] = {}
        self._covered: list[tuple[str, int, list[int]]] = []
        self._rows: list[tuple[str, list[int], tuple]] = []
        #: Restarted: the ranks' records of the steps in flight went to the process that
        #: died, so a rank missing from them is no finding, until a step comes in whole.
        self.resumed = False

    def on_steps(self, batches: list[StepBatch | StepPack]) -> None:
        super().on_steps(batches)
        if self.shard == 0:
            for b in batches:
                if type(b) is StepPack:
                    self._progress.setdefault(b.job, {}).update(zip(b.ranks, b.steps))
                else:
                    self._progress.setdefault(b.job, {})[b.rank] = b.step

    def on_step(self, batch: StepBatch) -> None:
        self.on_steps([batch])

    def judge(self, now: float | None = None, force: bool = False) -> ShardFindings:
        now = self.clock() if now is None else now
        out = ShardFindings(self.shard)
        for grp, view in self.aligner.ready(now, force=force):
            # A verdict held a step (detectors.replica) is merged with the step it names.
            out.steps += [(min(view.step, v.step), v) for v in
                          self._judge_step(grp, view, report_missing=not force or view.by_deadline)]
        out.other = self._liveness(now, force)
        out.judged = {g.label: g.judged_through for g in self.aligner.groups.values()}
        out.progress, self._progress = self._progress, {}
        out.covered, self._covered = self._covered, []
        out.rows, self._rows = self._rows, []
        return out

    def _judge_step(self, grp: Any, view: Any, report_missing: bool) -> list[Verdict]:
        if self.resumed and view.missing:
            report_missing = False
        elif self.resumed:
            self.resumed = False
        found = super()._judge_step(grp, view, report_missing)
        # What one core keeps for coverage and the report's curves, sent on for the merge.
        self._covered.append((view.job, view.step, view.ranks[view.reported].tolist()))
        self._rows.append((view.group, *self.series.last(view.group)))
        return found

    def learn_names(self, job: str, rank: int, names: dict[int, str]) -> None:
        """A rank's tensor names, sent once at its first steps, given again to a restarted
        shard (its ranks do not send them twice)."""
        from rankscope.coordinator.logic.align.columns import KeyTable
        table = self.aligner.keys.setdefault(job, KeyTable())
        rec = self.aligner.rank(job, rank)
        rec.names.learn(table, {int(k): str(v) for k, v in names.items()})
        rec.layout = None

    def tick(self, now: float | None = None) -> list[Verdict]:  # type: ignore[override]
        raise TypeError("an ingest shard is judged with judge(), its findings go to the verdict merge")

    def drain(self) -> list[Verdict]:  # type: ignore[override]
        raise TypeError("an ingest shard is drained with judge(force=True)")

    def job_terminated(self, job: str) -> None:
        """The operator terminated ``job``: its ranks' exits from now on are not crashes."""
        self.terminated_jobs.add(job)


def resync_events(core: CoordinatorCore) -> list[tuple[str, tuple, dict]]:
    """What a restarted shard must be told to know the job as ``core`` (the verdict
    side's) does: every rank's registration and how it ended, and the terminated jobs,
    as the events :class:`~rankscope.coordinator.server.shards.ShardLink` hands on."""
    from rankscope.coordinator.logic.align.aligner import RankState
    out: list[tuple[str, tuple, dict]] = []
    for (job, rank), rec in core.aligner.ranks.items():
        if rec.info:
            out.append(("on_register", (job, rank, dict(rec.info)), {}))
        if rec.state is RankState.FINISHED:
            out.append(("on_rank_finished", (job, rank, rec.last_step), {}))
        elif rec.state is RankState.LOST and rec.death:
            d = rec.death
            out.append(("on_rank_lost", (job, rank, rec.last_step, d.get("exit_status"), d.get("reason", "")),
                        {"died_at": d.get("died_at"), "signal": d.get("signal"), "exception": d.get("exception")}))
    jobs = {job for job, _ in core.aligner.ranks}
    out += [("on_layout", (job, rank, facts), {}) for job in sorted(jobs)
            for rank, facts in sorted(core.aligner.layouts.facts(job).items())]
    out += [("job_terminated", (job,), {}) for job in sorted(core.terminated_jobs)]
    return out
