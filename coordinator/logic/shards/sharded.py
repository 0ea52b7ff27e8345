"""K ingest shards, their verdict merge and the one core that files incidents, in one
process: how the pieces fit, for tests and benchmarks. The Ray coordinator places the
same three parts in separate actors (coordinator/server/shards.py)."""
from __future__ import annotations

import time
from typing import Any, Callable

from rankscope.config.cluster import ClusterSettings, parse_cluster
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.views.coverage import ShardedCoverage
from rankscope.coordinator.logic.shards.merge import VerdictMerge
from rankscope.coordinator.logic.shards.shard import ShardCore, ShardFindings
from rankscope.coordinator.logic.shards.summaries import ShardSummaries, merge_proofs
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import StepBatch
from rankscope.wire.shards import ShardMap


class ShardedCore:
    def __init__(self, settings: ClusterSettings | dict | None = None, clock: Callable[[], float] = time.monotonic,
                 count: int = 2, *, export_dir: Any = None) -> None:
        if settings is None or isinstance(settings, dict):
            settings = parse_cluster(settings)
        self.map = ShardMap(count)
        self.shards = [ShardCore(settings, clock, shard=i) for i in range(count)]
        self.merge = VerdictMerge(count)
        self.core = CoordinatorCore(settings, clock, export_dir=export_dir)
        self.core.coverage = ShardedCoverage(count)
        self.summaries = ShardSummaries(count, self.core.coverage, self.core.series)

    def _all(self) -> list[CoordinatorCore]:
        return [self.core, *self.shards]

    def on_register(self, job: str, rank: int, info: dict[str, Any]) -> None:
        for c in self._all():
            c.on_register(job, rank, info)

    def on_layout(self, *args: Any, **kw: Any) -> None:
        for c in self._all():
            c.on_layout(*args, **kw)

    def on_heartbeat(self, *args: Any, **kw: Any) -> None:
        for c in self._all():
            c.on_heartbeat(*args, **kw)

    def on_rank_lost(self, *args: Any, **kw: Any) -> None:
        for c in self._all():
            c.on_rank_lost(*args, **kw)

    def on_rank_finished(self, *args: Any, **kw: Any) -> None:
        for c in self._all():
            c.on_rank_finished(*args, **kw)

    def on_step(self, b: StepBatch) -> None:
        for shard, part in zip(self.shards, self.map.split(b)):
            shard.on_step(part)

    def tick(self, now: float | None = None) -> list[Verdict]:
        for s in self.shards:
            self._add(s.judge(now))
        return self._file(self.merge.release(), now)

    def drain(self) -> list[Verdict]:
        for s in self.shards:
            self._add(s.judge(force=True))
        return self._file(self.merge.release(force=True), None)

    def _add(self, f: ShardFindings) -> None:
        self.merge.add(f)
        self.summaries.add(f)

    def coverage_report(self, job: str) -> dict[str, Any]:
        return self.core.coverage_report(job)

    def proof(self, verdict: dict[str, Any]) -> dict[str, Any]:
        return merge_proofs([s.series.recent.proof(verdict) for s in self.shards], self.map.owner(verdict.get("kind")))

    def _file(self, verdicts: list[Verdict], now: float | None) -> list[Verdict]:
        for job, steps in self.merge.take_progress().items():
            self.core.on_progress(job, steps)
        return self.core.accept(verdicts, now)
