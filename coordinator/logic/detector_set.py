"""Which step detectors run, in trust order, from the settings."""
from __future__ import annotations

from typing import Any, Protocol

from rankscope.config.cluster import ClusterSettings
from rankscope.coordinator.logic.align.aligner import StepView
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import Kind


class StepDetector(Protocol):
    name: str

    def judge(self, view: StepView, state: dict[str, Any]) -> list[Verdict]: ...


def build_step_detectors(settings: ClusterSettings) -> list[Any]:
    # Imported here so each detector module stays importable (and testable) on its own.
    from rankscope.coordinator.logic.detectors.loss_scale import LossScaleDetector
    from rankscope.coordinator.logic.detectors.moved import ParamMovedDetector
    from rankscope.coordinator.logic.detectors.nan_origin import NanOriginDetector
    from rankscope.coordinator.logic.detectors.outlier import OutlierDetector
    from rankscope.coordinator.logic.detectors.replica import ReplicaDetector
    from rankscope.coordinator.logic.detectors.same_data import SameDataDetector
    from rankscope.coordinator.logic.detectors.watchpoints import WatchpointDetector

    d = settings.detectors
    out: list[Any] = []
    if d.loss_scale.enabled:  # first: it tells the others which non-finite values a loss scale caught
        out.append(LossScaleDetector(d.loss_scale))
    if d.nan_origin.enabled:
        kinds = _kinds(d.nan_origin.kinds)
        out.append(NanOriginDetector(None if kinds >= _kinds(tuple(k.name for k in Kind)) else kinds))
    if d.replica.enabled:
        out.append(ReplicaDetector(_kinds(d.replica.kinds)))
    if d.param_moved.enabled:
        out.append(ParamMovedDetector())
    if d.outlier.enabled:
        out.append(OutlierDetector(d.outlier))
    if d.same_data.enabled:  # a warning in the detector's state, never a verdict
        out.append(SameDataDetector())
    if settings.watchpoints:
        out.append(WatchpointDetector(settings.watchpoints))
    return out


def _kinds(names: tuple[str, ...]) -> frozenset[int]:
    return frozenset(int(Kind[k.upper()]) for k in names)
