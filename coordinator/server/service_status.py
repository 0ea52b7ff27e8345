"""What the coordinator service reports: its status (brief for pollers, full with a row per
rank), incidents and coverage, read on its loop thread."""
from __future__ import annotations

import os
from typing import Any


class StatusReports:
    """Mixed into :class:`~.service.CoordinatorService`, whose state it reads."""

    core: Any
    frontend: Any
    link: Any
    actions: Any
    metrics: Any
    collector: Any
    job: str | None
    endpoint: Any
    last_judged_step: int
    judged_walls: Any

    def status(self, brief: bool = False) -> dict:
        """``brief``: counters, progress and incidents only, without a row per rank (what a
        poller needs; a full status of 16k ranks holds the ingest thread ~0.1 s)."""
        return self.frontend.call_sync(self._brief if brief else self._status)

    def _brief(self) -> dict:
        counters = dict(self.core.aligner.counters)
        return {
            "endpoint": self.endpoint, "job": self.job, "pid": os.getpid(),
            "last_judged_step": self.last_judged_step, "pending_steps": self.core.aligner.pending_steps(),
            "judged_walls": list(self.judged_walls), "counters": counters, "incidents": self._incidents(),
            "metrics": self.metrics.snapshot(), "frames_in": self.frontend.frames_in,
            "rejected": dict(self.frontend.decoder.rejected), "duplicates": self.frontend.replay.duplicates,
            "first_step_wall": self.frontend.first_step_wall, "last_step_wall": self.frontend.last_step_wall,
            **(self._shard_status(brief=True) if self.link is not None else {}),
        }

    def _status(self, coverage: bool = True) -> dict:
        """``coverage`` False: without it (None), for a reader that keeps its own."""
        core = self.core.status()
        ranks: dict[str, dict] = {}
        for job, j in (core.get("jobs") or {}).items():
            if self.job is None or job == self.job:
                ranks.update(j["ranks"])
        return {
            "endpoint": self.endpoint, "job": self.job, "ranks": ranks, "pid": os.getpid(),
            "last_judged_step": self.last_judged_step, "pending_steps": core.get("pending_steps"),
            "judged_walls": list(self.judged_walls),
            "counters": core.get("counters"), "jobs": core.get("jobs"),
            "incidents": self._incidents(), "terminated": self.actions.terminated,
            "metrics": self.metrics.snapshot(), "lag_steps": self._lag(core),
            "peers": len(self.frontend.peers), "frames_in": self.frontend.frames_in,
            "rejected": dict(self.frontend.decoder.rejected), "duplicates": self.frontend.replay.duplicates,
            "first_step_wall": self.frontend.first_step_wall, "last_step_wall": self.frontend.last_step_wall,
            "collect": self.collector.progress() if self.collector is not None else None,
            "coverage": self._coverage() if coverage else None,
            **(self._shard_status() if self.link is not None else {}),
        }

    def _shard_status(self, brief: bool = False) -> dict:
        from rankscope.coordinator.logic.shards.summaries import merge_counters
        shards = self.link.status(brief)
        # The verdict actor takes no records itself: its counters are the shards'.
        return {"shards": shards, "records": sum(s.get("records", 0) for s in shards),
                "counters": merge_counters([s["counters"] for s in shards if s.get("counters")])}

    def _coverage(self) -> dict[str, dict]:
        jobs = {j for j, _ in self.core.aligner.ranks}
        return {j: self.core.coverage_report(j) for j in sorted(jobs) if self.job is None or j == self.job}

    def incidents(self) -> list[dict]:
        return self.frontend.call_sync(self._incidents)

    def _incidents(self) -> list[dict]:
        return [{**d, "transfer_problems": self.actions.problems(d["incident_id"]),
                 "bytes_received": self.actions.received.get(d["incident_id"], 0)} for d in self.core.documents()]

    @staticmethod
    def _lag(core_status: dict) -> float:
        lags = [r.get("lag", 0) for j in (core_status.get("jobs") or {}).values()
                for r in j["ranks"].values() if r.get("state") in ("running", "paused", "expected")]
        return float(max(lags, default=0))
