"""Ray metrics of the coordinator: records ingested, steps judged, incidents, lag.

Recorded once per front-end loop iteration with aggregated counts, never per
message: a ``ray.util.metrics`` call costs microseconds and the ingest loop
handles thousands of frames per iteration. Ray is imported lazily so the
front end can run (and be unit-tested) without a Ray worker; outside a Ray
worker the metrics are silently kept only as plain counters.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class CoordinatorMetrics:
    """Plain counters, mirrored into Ray metrics when running inside Ray."""

    records_ingested: int = 0
    steps_judged: int = 0
    incidents: int = 0
    lag_steps: float = 0.0
    frames_rejected: int = 0
    _ray: dict[str, Any] = field(default_factory=dict, repr=False)

    def enable_ray(self) -> bool:
        """Create the Ray metric objects; False (and plain counters only) outside Ray."""
        try:
            import ray
            from ray.util import metrics as rm
            if not ray.is_initialized():
                return False
            self._ray = {
                "records": rm.Counter("rankscope_records_ingested",
                                      description="tensor records ingested by the coordinator"),
                "steps": rm.Counter("rankscope_steps_judged",
                                    description="(group, step) pairs judged by the detectors"),
                "incidents": rm.Counter("rankscope_incidents",
                                        description="incidents opened (first diverging rank named)"),
                "rejected": rm.Counter("rankscope_frames_rejected",
                                       description="wire frames refused by the decoder"),
                "lag": rm.Gauge("rankscope_lag_steps",
                                description="steps between the fastest and slowest live rank"),
            }
            return True
        except Exception as exc:  # metrics are an aid; never fail the coordinator on them
            log.warning("Ray metrics unavailable: %s", exc)
            self._ray = {}
            return False

    def add(self, *, records: int = 0, steps: int = 0, incidents: int = 0,
            rejected: int = 0, lag: float | None = None) -> None:
        self.records_ingested += records
        self.steps_judged += steps
        self.incidents += incidents
        self.frames_rejected += rejected
        if lag is not None:
            self.lag_steps = float(lag)
        if not self._ray:
            return
        try:
            for key, val in (("records", records), ("steps", steps), ("incidents", incidents),
                             ("rejected", rejected)):
                if val:
                    self._ray[key].inc(val)
            if lag is not None:
                self._ray["lag"].set(float(lag))
        except Exception as exc:
            log.warning("Ray metrics update failed, disabling: %s", exc)
            self._ray = {}

    def snapshot(self) -> dict[str, float]:
        return {"records_ingested": self.records_ingested, "steps_judged": self.steps_judged,
                "incidents": self.incidents, "lag_steps": self.lag_steps,
                "frames_rejected": self.frames_rejected, "ray_metrics": bool(self._ray)}
