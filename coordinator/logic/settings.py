"""The coordinator's settings, parsed from config.json's ``"cluster"`` section.

Only the coordinator reads ``detectors``, ``watchpoints`` and ``groups`` (the probe
passes them through), so this is where they are validated. Every error names the
field and the value, because the section is hand-written by users.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from coordinator.logic.watchpoint_rules import WatchpointRule, parse_watchpoints


class SettingsError(ValueError):
    """A bad ``cluster`` field; ``field`` is its dotted path, ``value`` what was given."""

    def __init__(self, field_: str, value: Any, why: str) -> None:
        super().__init__(f"{field_}={value!r}: {why}")
        self.field = field_
        self.value = value


class OnDivergence(str, enum.Enum):
    """What the cluster does once a verdict opens an incident.

    PAUSE: pause every rank, export, write, then hold paused for the operator.
    EXPORT: pause, export, write, resume on its own. TERMINATE: pause, export,
    write, terminate. CONTINUE: export without pausing, write, keep training.
    """

    PAUSE = "pause"
    EXPORT = "export"
    TERMINATE = "terminate"
    CONTINUE = "continue"


#: ``groups`` spellings: "dp" = every rank of a job is one data-parallel group;
#: "replicas" = likewise, but the ranks get identical input (inference DP), so every
#: record kind, not only parameters/reduced grads, must match bit for bit.
GROUP_MODES = ("dp", "replicas")


@dataclass(frozen=True)
class NanOriginSettings:
    enabled: bool = True
    #: Record kinds searched for NaN/Inf. With dynamic loss scaling (mixed precision) an
    #: Inf gradient is routine and the step is skipped: leave out "grad_local",
    #: "grad_reduced" and "backward" there and forward/loss/param NaNs are still found.
    kinds: tuple[str, ...] = ("forward", "backward", "param", "grad_local", "grad_reduced", "loss",
                              "opt_state", "saved")


@dataclass(frozen=True)
class ReplicaSettings:
    enabled: bool = True
    #: Record kinds that must be bit-identical in "dp" mode (lower-case Kind names). Drop
    #: "grad_reduced" for a collective that does not give every rank the same bits.
    kinds: tuple[str, ...] = ("param", "grad_reduced", "opt_state")


@dataclass(frozen=True)
class OutlierSettings:
    """Peer outlier thresholds. Defaults are tuned for zero false alarms (tests/test_soak.py).

    A value is an outlier against its group when its log distance to the group median
    exceeds ``z`` robust sigmas (1.4826 x MAD) AND the ratio to the median exceeds
    ``ratio``: the MAD test alone fires on tiny differences when ranks agree closely,
    the ratio floor alone ignores how noisy the group is. The history test applies the
    same two gates to each rank's change against its own running mean, compared with
    the changes of its peers, so a shift every rank makes (LR warm-up, a hard batch
    for everyone) is not a finding.
    """

    enabled: bool = True
    z: float = 8.0
    ratio: float = 4.0
    min_ranks: int = 3
    #: The ratio floor also rises to tail_factor x the usual spread of the record's
    #: column and kind (learned over the run), so noisy, heavy-tailed columns do not
    #: false-alarm; before a column has 5 steps the floor is ratio**2, high side only.
    tail_factor: float = 12.0
    history: bool = True
    history_z: float = 8.0
    history_ratio: float = 4.0
    history_alpha: float = 0.1
    min_history: int = 20


@dataclass(frozen=True)
class ProgressSettings:
    enabled: bool = True
    #: A live rank whose newest step is this many steps behind its group's newest is
    #: lagging; None turns the check off (deadlines still apply).
    lag_steps: int | None = 8


@dataclass(frozen=True)
class DetectorSettings:
    nan_origin: NanOriginSettings = field(default_factory=NanOriginSettings)
    replica: ReplicaSettings = field(default_factory=ReplicaSettings)
    outlier: OutlierSettings = field(default_factory=OutlierSettings)
    progress: ProgressSettings = field(default_factory=ProgressSettings)
    #: After a detector flags a rank, the same detector stays quiet about that rank for
    #: this many steps: a drifted replica stays drifted and must not open an incident
    #: per step.
    repeat_after_steps: int = 1000


@dataclass(frozen=True)
class CoordinatorSettings:
    groups: str | tuple[tuple[int, ...], ...] = "dp"
    on_divergence: OnDivergence = OnDivergence.PAUSE
    deadline_s: float = 30.0
    flight_recorder_steps: int = 8
    detectors: DetectorSettings = field(default_factory=DetectorSettings)
    watchpoints: tuple[WatchpointRule, ...] = ()
    job: str | None = None
    #: Steps held unjudged per group before the oldest is judged early; bounds memory
    #: when a rank falls far behind.
    max_pending_steps: int = 64
    pause_timeout_s: float = 30.0
    export_timeout_s: float = 120.0

    @property
    def replicas_mode(self) -> bool:
        return self.groups == "replicas"


# Fields the probe's ClusterConfig owns; accepted here and not used by the coordinator.
_PROBE_FIELDS = frozenset({"agent", "sentinels", "on_terminate", "dp_index"})
_DETECTOR_SECTIONS = {
    "nan_origin": NanOriginSettings, "replica": ReplicaSettings,
    "outlier": OutlierSettings, "progress": ProgressSettings,
}
#: Longer spellings users reach for (DESIGN.md's names); same sections.
_SECTION_ALIASES = {"peer_outlier": "outlier", "replica_consistency": "replica", "nan": "nan_origin"}
#: outlier.threshold is the robust-z threshold.
_KEY_ALIASES = {"outlier": {"threshold": "z"}}


def parse_settings(cluster_section: Mapping[str, Any] | None) -> CoordinatorSettings:
    """Validate the ``cluster`` section; raise :class:`SettingsError` naming the field."""
    sec = dict(cluster_section or {})
    known = _PROBE_FIELDS | {
        "job", "groups", "on_divergence", "deadline_s", "flight_recorder_steps", "detectors",
        "watchpoints", "max_pending_steps", "pause_timeout_s", "export_timeout_s",
    }
    for key in sec:
        if key not in known:
            raise SettingsError(f"cluster.{key}", sec[key], f"unknown field (known: {', '.join(sorted(known))})")
    kw: dict[str, Any] = {}
    if sec.get("job") is not None:
        kw["job"] = _typed("cluster.job", sec["job"], str)
    if "groups" in sec:
        kw["groups"] = _parse_groups(sec["groups"])
    if "on_divergence" in sec:
        val = sec["on_divergence"]
        try:
            kw["on_divergence"] = OnDivergence(val)
        except ValueError:
            raise SettingsError("cluster.on_divergence", val,
                                "must be one of " + "|".join(p.value for p in OnDivergence)) from None
    for name in ("deadline_s", "pause_timeout_s", "export_timeout_s"):
        if name in sec:
            kw[name] = _positive_float(f"cluster.{name}", sec[name])
    for name in ("flight_recorder_steps", "max_pending_steps"):
        if name in sec:
            kw[name] = _positive_int(f"cluster.{name}", sec[name])
    if sec.get("detectors") is not None:
        kw["detectors"] = _parse_detectors(sec["detectors"])
    if sec.get("watchpoints") is not None:
        kw["watchpoints"] = parse_watchpoints(sec["watchpoints"], "cluster.watchpoints", SettingsError)
    return CoordinatorSettings(**kw)


def _parse_groups(val: Any) -> str | tuple[tuple[int, ...], ...]:
    if isinstance(val, str):
        if val not in GROUP_MODES:
            raise SettingsError("cluster.groups", val, "must be 'dp', 'replicas' or a list of rank lists")
        return val
    if not isinstance(val, (list, tuple)) or not val:
        raise SettingsError("cluster.groups", val, "must be 'dp', 'replicas' or a non-empty list of rank lists")
    seen: set[int] = set()
    groups = []
    for i, grp in enumerate(val):
        fld = f"cluster.groups[{i}]"
        if not isinstance(grp, (list, tuple)) or not grp:
            raise SettingsError(fld, grp, "must be a non-empty list of rank ids")
        for rank in grp:
            if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
                raise SettingsError(fld, rank, "rank ids must be non-negative integers")
            if rank in seen:
                raise SettingsError(fld, rank, "rank appears in more than one group")
            seen.add(rank)
        groups.append(tuple(grp))
    return tuple(groups)


def _parse_detectors(val: Any) -> DetectorSettings:
    if not isinstance(val, Mapping):
        raise SettingsError("cluster.detectors", val, "must be a map of detector name -> settings")
    kw: dict[str, Any] = {}
    for name, sub in val.items():
        fld = f"cluster.detectors.{name}"
        if name == "repeat_after_steps":
            kw[name] = _positive_int(fld, sub)
            continue
        name = _SECTION_ALIASES.get(name, name)
        cls = _DETECTOR_SECTIONS.get(name)
        if cls is None:
            raise SettingsError(fld, sub, f"unknown detector (known: {', '.join(_DETECTOR_SECTIONS)}, repeat_after_steps)")
        if isinstance(sub, bool):  # "replica": false is shorthand for {"enabled": false}
            kw[name] = cls(enabled=sub)
            continue
        if not isinstance(sub, Mapping):
            raise SettingsError(fld, sub, "must be true/false or a map of settings")
        aliases = _KEY_ALIASES.get(name, {})
        kw[name] = _build_section(fld, cls, {aliases.get(k, k): v for k, v in sub.items()})
    return DetectorSettings(**kw)


def _build_section(fld: str, cls: type, sub: Mapping[str, Any]) -> Any:
    defaults = cls()
    args: dict[str, Any] = {}
    for key, val in sub.items():
        if not hasattr(defaults, key):
            known = ", ".join(f.name for f in cls.__dataclass_fields__.values())  # type: ignore[attr-defined]
            raise SettingsError(f"{fld}.{key}", val, f"unknown setting (known: {known})")
        default = getattr(defaults, key)
        kf = f"{fld}.{key}"
        if isinstance(default, bool):
            args[key] = _typed(kf, val, bool)
        elif key == "kinds":
            args[key] = _kind_names(kf, val)
        elif key == "lag_steps":
            args[key] = None if val is None else _positive_int(kf, val)
        elif isinstance(default, int):
            args[key] = _positive_int(kf, val)
        elif key == "history_alpha":
            alpha = _positive_float(kf, val)
            if alpha >= 1:
                raise SettingsError(kf, val, "must be in (0, 1)")
            args[key] = alpha
        elif key in ("ratio", "history_ratio"):
            ratio = _positive_float(kf, val)
            if ratio <= 1:
                raise SettingsError(kf, val, "must be > 1 (a ratio to the median)")
            args[key] = ratio
        else:
            args[key] = _positive_float(kf, val)
    return cls(**args)


def _kind_names(fld: str, val: Any) -> tuple[str, ...]:
    from agent.records import Kind

    known = [k.name.lower() for k in Kind]
    if not isinstance(val, (list, tuple)) or not all(isinstance(k, str) for k in val):
        raise SettingsError(fld, val, "must be a list of kind names (" + ", ".join(known) + ")")
    for k in val:
        if k.lower() not in known:
            raise SettingsError(fld, k, "unknown kind (known: " + ", ".join(known) + ")")
    return tuple(k.lower() for k in val)


def _typed(fld: str, val: Any, typ: type) -> Any:
    if not isinstance(val, typ) or (typ is not bool and isinstance(val, bool)):
        raise SettingsError(fld, val, f"must be a {typ.__name__}")
    return val


def _positive_int(fld: str, val: Any) -> int:
    if not isinstance(val, int) or isinstance(val, bool) or val < 1:
        raise SettingsError(fld, val, "must be a positive integer")
    return val


def _positive_float(fld: str, val: Any) -> float:
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val) or val <= 0:
        raise SettingsError(fld, val, "must be a positive number")
    return float(val)
