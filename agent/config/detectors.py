"""The ``cluster.detectors`` section: which detectors run and their thresholds.

The coordinator acts on these; every other process validates them too, so a typo in a
threshold is found where the config is first read, not minutes later on a Ray node.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from rankscope.config.checks import positive_float, positive_int, typed
from rankscope.config.errors import ConfigError
from rankscope.wire.records import Kind


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
class ParamMovedSettings:
    #: A rank whose weights changed between one step's end and the next one's start, outside
    #: the optimizer, is named (no majority needed); a change every rank makes at the same
    #: step is deliberate. Off for a script that edits weights between steps on some ranks
    #: only (a per-shard max-norm clip).
    enabled: bool = True


@dataclass(frozen=True)
class SameDataSettings:
    #: Data-parallel ranks whose local gradients and loss are bit-identical read the same
    #: batches: a warning in the status, coverage.json and the launch output, never an
    #: incident. Off for a job that feeds every rank the same data on purpose.
    enabled: bool = True


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
class LossScaleSettings:
    """Float16 overflow steps under a loss scale. ``streak``: overflow steps in a row,
    after the scale once ran a clean step, that make a finding of their own; ``floor``:
    an overflow at or below this scale is one at once (the scale cannot fall further)."""

    enabled: bool = True
    streak: int = 8
    floor: float = 1.0


@dataclass(frozen=True)
class DetectorSettings:
    nan_origin: NanOriginSettings = field(default_factory=NanOriginSettings)
    replica: ReplicaSettings = field(default_factory=ReplicaSettings)
    param_moved: ParamMovedSettings = field(default_factory=ParamMovedSettings)
    outlier: OutlierSettings = field(default_factory=OutlierSettings)
    progress: ProgressSettings = field(default_factory=ProgressSettings)
    loss_scale: LossScaleSettings = field(default_factory=LossScaleSettings)
    same_data: SameDataSettings = field(default_factory=SameDataSettings)
    #: After a detector flags a rank, the same detector stays quiet about that rank for
    #: this many steps: a drifted replica stays drifted and must not open an incident
    #: per step.
    repeat_after_steps: int = 1000


_DETECTOR_SECTIONS = {
    "nan_origin": NanOriginSettings, "replica": ReplicaSettings, "param_moved": ParamMovedSettings,
    "outlier": OutlierSettings, "progress": ProgressSettings, "loss_scale": LossScaleSettings,
    "same_data": SameDataSettings,
}
#: Longer spellings users reach for (DESIGN.md's names); same sections.
_SECTION_ALIASES = {"peer_outlier": "outlier", "replica_consistency": "replica", "nan": "nan_origin"}
#: outlier.threshold is the robust-z threshold.
_KEY_ALIASES = {"outlier": {"threshold": "z"}}


def parse_detectors(val: Any) -> DetectorSettings:
    if not isinstance(val, Mapping):
        raise ConfigError("cluster.detectors", val, "must be a map of detector name -> settings")
    kw: dict[str, Any] = {}
    for name, sub in val.items():
        fld = f"cluster.detectors.{name}"
        if name == "repeat_after_steps":
            kw[name] = positive_int(fld, sub)
            continue
        name = _SECTION_ALIASES.get(name, name)
        cls = _DETECTOR_SECTIONS.get(name)
        if cls is None:
            raise ConfigError(fld, sub, f"unknown detector (known: {', '.join(_DETECTOR_SECTIONS)}, repeat_after_steps)")
        if isinstance(sub, bool):  # "replica": false is shorthand for {"enabled": false}
            kw[name] = cls(enabled=sub)
            continue
        if not isinstance(sub, Mapping):
            raise ConfigError(fld, sub, "must be true/false or a map of settings")
        aliases = _KEY_ALIASES.get(name, {})
        kw[name] = _build_section(fld, cls, {aliases.get(k, k): v for k, v in sub.items()})
    return DetectorSettings(**kw)


def _build_section(fld: str, cls: type, sub: Mapping[str, Any]) -> Any:
    defaults = cls()
    args: dict[str, Any] = {}
    for key, val in sub.items():
        if not hasattr(defaults, key):
            known = ", ".join(f.name for f in cls.__dataclass_fields__.values())  # type: ignore[attr-defined]
            raise ConfigError(f"{fld}.{key}", val, f"unknown setting (known: {known})")
        default = getattr(defaults, key)
        kf = f"{fld}.{key}"
        if isinstance(default, bool):
            args[key] = typed(kf, val, bool)
        elif key == "kinds":
            args[key] = _kind_names(kf, val)
        elif key == "lag_steps":
            args[key] = None if val is None else positive_int(kf, val)
        elif isinstance(default, int):
            args[key] = positive_int(kf, val)
        elif key == "history_alpha":
            alpha = positive_float(kf, val)
            if alpha >= 1:
                raise ConfigError(kf, val, "must be in (0, 1)")
            args[key] = alpha
        elif key in ("ratio", "history_ratio"):
            ratio = positive_float(kf, val)
            if ratio <= 1:
                raise ConfigError(kf, val, "must be > 1 (a ratio to the median)")
            args[key] = ratio
        else:
            args[key] = positive_float(kf, val)
    return cls(**args)


def _kind_names(fld: str, val: Any) -> tuple[str, ...]:
    known = [k.name.lower() for k in Kind]
    if not isinstance(val, (list, tuple)) or not all(isinstance(k, str) for k in val):
        raise ConfigError(fld, val, "must be a list of kind names (" + ", ".join(known) + ")")
    for k in val:
        if k.lower() not in known:
            raise ConfigError(fld, k, "unknown kind (known: " + ", ".join(known) + ")")
    return tuple(k.lower() for k in val)
