"""MindInsight's watchpoint conditions (seeds/002) as validated rule objects.

MindInsight evaluated whole tensors in one process; rankscope sees each tensor's
statistics (Max/Min/Mean/Norm, NaN/Inf counts, element count, CRC-32) on every rank.
So each condition is offered with the thresholds those statistics answer exactly:
``rms`` (= Norm / sqrt(numel)) stands in for MindInsight's "average of the absolute
value", which the probe does not measure; "percentage in range" needs a histogram and
is refused with a clear error rather than approximated. The all-zero share (TZ/WI) is
known only at 100 %, i.e. when the tensor is entirely zero. Weight change (WCL/WCS) is
measured as the relative change of the weight's Norm between consecutive steps, a lower
bound on MindInsight's mean |W_t - W_{t-1}| ratio; WNC (unchanged) is exact with CRC-32.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Callable

from rankscope.config.errors import ConfigError
from rankscope.wire.records import Kind


class Condition(str, enum.Enum):
    TO = "TO"  # tensor overflow (NaN/Inf)
    TZ = "TZ"  # tensor all zero share >=
    TR = "TR"  # tensor value range (MAX-MIN > / <)
    TL = "TL"  # tensor above threshold
    TS = "TS"  # tensor below threshold
    AR = "AR"  # activation value range
    WCL = "WCL"  # weight change above threshold
    WCS = "WCS"  # weight change below threshold
    WI = "WI"  # initial weight value
    WNC = "WNC"  # unchanged weight
    WO = "WO"  # weight overflow
    WL = "WL"  # weight above threshold
    WS = "WS"  # weight below threshold
    GE = "GE"  # gradient explosion (overflow)
    GL = "GL"  # gradient above threshold
    GV = "GV"  # gradient vanishing (below threshold)


#: MindInsight's long condition names, accepted beside the abbreviations.
CONDITION_ALIASES = {
    "tensor_overflow": "TO", "tensor_all_zero": "TZ", "tensor_range": "TR", "tensor_too_large": "TL",
    "tensor_too_small": "TS", "activation_range": "AR", "weight_change_too_large": "WCL",
    "weight_change_too_small": "WCS", "weight_initialization": "WI", "weight_not_changed": "WNC",
    "weight_overflow": "WO", "weight_too_large": "WL", "weight_too_small": "WS",
    "gradient_explosion": "GE", "gradient_too_large": "GL", "gradient_vanishing": "GV",
}

_ALL = frozenset(int(k) for k in Kind)
_WEIGHT = frozenset({int(Kind.PARAM)})
_GRAD = frozenset({int(Kind.GRAD_LOCAL), int(Kind.GRAD_REDUCED)})
_ACT = frozenset({int(Kind.FORWARD)})

_ABOVE = ("max_gt", "min_gt", "mean_gt", "rms_gt")
_BELOW = ("max_lt", "min_lt", "mean_lt", "rms_lt")
# condition -> (default kinds, allowed params, whether at least one param is required)
_SPEC: dict[Condition, tuple[frozenset[int], tuple[str, ...], bool]] = {
    Condition.TO: (_ALL, (), False),
    Condition.TZ: (_ALL, ("zero_pct_ge",), True),
    Condition.TR: (_ALL, ("range_gt", "range_lt"), True),
    Condition.TL: (_ALL, _ABOVE, True),
    Condition.TS: (_ALL, _BELOW, True),
    Condition.AR: (_ACT, ("range_gt", "range_lt"), True),
    Condition.WCL: (_WEIGHT, ("change_ratio_gt", "offset"), True),
    Condition.WCS: (_WEIGHT, ("change_ratio_lt", "offset"), True),
    Condition.WI: (_WEIGHT, ("zero_pct_ge", "max_gt", "min_lt"), True),
    Condition.WNC: (_WEIGHT, ("rtol",), False),
    Condition.WO: (_WEIGHT, (), False),
    Condition.WL: (_WEIGHT, _ABOVE, True),
    Condition.WS: (_WEIGHT, _BELOW, True),
    Condition.GE: (_GRAD, (), False),
    Condition.GL: (_GRAD, _ABOVE, True),
    Condition.GV: (_GRAD, _BELOW, True),
}
_REFUSED = {
    "in_range_pct_gt": "percentage in range needs a histogram the probe does not take",
    "in_range_pct_lt": "percentage in range needs a histogram the probe does not take",
    "abs_mean_gt": "the probe does not measure mean(|x|); use rms_gt (Norm/sqrt(numel))",
    "abs_mean_lt": "the probe does not measure mean(|x|); use rms_lt (Norm/sqrt(numel))",
}


@dataclass(frozen=True)
class WatchpointRule:
    id: str
    condition: Condition
    params: tuple[tuple[str, float], ...]
    kinds: frozenset[int]
    names: tuple[str, ...] = ()  # fnmatch patterns; empty = every tensor

    def param(self, key: str, default: float | None = None) -> float | None:
        return dict(self.params).get(key, default)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "condition": self.condition.value, **dict(self.params),
                "kinds": sorted(Kind(k).name.lower() for k in self.kinds), "names": list(self.names)}


def parse_watchpoints(rules: Any, fld: str = "cluster.watchpoints") -> tuple[WatchpointRule, ...]:
    """Parse a list of ``{"condition": "TL", "max_gt": 1e3, "names": [...], "kinds": [...]}``;
    raise ConfigError naming the rule and field."""
    err = ConfigError
    if not isinstance(rules, (list, tuple)):
        raise err(fld, rules, "must be a list of watchpoint rules")
    out = []
    for i, raw in enumerate(rules):
        rf = f"{fld}[{i}]"
        if not isinstance(raw, dict):
            raise err(rf, raw, "must be a map with a 'condition'")
        cond_raw = raw.get("condition")
        if isinstance(cond_raw, str):
            cond_raw = CONDITION_ALIASES.get(cond_raw.lower(), cond_raw.upper())
        if cond_raw in ("OO", "OPERATOR_OVERFLOW"):
            raise err(f"{rf}.condition", cond_raw, "operator overflow is Ascend-only; use TO")
        try:
            cond = Condition(cond_raw)
        except ValueError:
            raise err(f"{rf}.condition", raw.get("condition"), "must be one of " + ", ".join(c.value for c in Condition)
                      + " (or " + ", ".join(CONDITION_ALIASES) + ")") from None
        kinds, allowed, needs_param = _SPEC[cond]
        params: list[tuple[str, float]] = []
        names: tuple[str, ...] = ()
        rule_id = f"wp{i}-{cond.value}"
        for key, val in raw.items():
            kf = f"{rf}.{key}"
            if key == "condition":
                continue
            if key == "id":
                if not isinstance(val, str) or not val:
                    raise err(kf, val, "must be a non-empty string")
                rule_id = val
            elif key == "names":
                if not isinstance(val, (list, tuple)) or not all(isinstance(n, str) for n in val):
                    raise err(kf, val, "must be a list of name patterns (fnmatch)")
                names = tuple(val)
            elif key == "kinds":
                kinds = _parse_kinds(kf, val, err)
            elif key in _REFUSED:
                raise err(kf, val, _REFUSED[key])
            elif key in allowed:
                if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
                    raise err(kf, val, "must be a finite number")
                if key == "zero_pct_ge" and not 0 <= val <= 100:
                    raise err(kf, val, "must be a percentage in [0, 100]")
                if key in ("rtol", "offset") and val < 0:
                    raise err(kf, val, "must be >= 0")
                params.append((key, float(val)))
            else:
                known = ", ".join(allowed) or "none"
                raise err(kf, val, f"not a parameter of {cond.value} (its parameters: {known}; also id, names, kinds)")
        thresholds = [k for k, _ in params if k not in ("offset", "rtol")]
        if needs_param and not thresholds:
            raise err(rf, raw, f"{cond.value} needs one of: {', '.join(k for k in allowed if k not in ('offset',))}")
        out.append(WatchpointRule(rule_id, cond, tuple(params), kinds, names))
    return tuple(out)


def _parse_kinds(fld: str, val: Any, err: Callable[[str, Any, str], Exception]) -> frozenset[int]:
    if not isinstance(val, (list, tuple)) or not val:
        raise err(fld, val, "must be a non-empty list of kind names")
    kinds = set()
    for k in val:
        try:
            kinds.add(int(Kind[str(k).upper()]))
        except KeyError:
            raise err(fld, k, "unknown kind (known: " + ", ".join(x.name.lower() for x in Kind) + ")") from None
    return frozenset(kinds)


def condition_params() -> dict[str, list[str]]:
    """Each condition and the thresholds it takes (what a form offers), in MindInsight's order."""
    return {c.value: list(_SPEC[c][1]) for c in Condition}


#: Thresholds on statistics the default watch does not record for weights, optimizer
#: state and gradients (weights and state carry a fingerprint, gradients their norm).
_NEEDS_FULL_STATS = ("max_", "min_", "mean_", "range_", "zero_pct_", "change_ratio_")
_TENSORS_WITHOUT_STATS = frozenset({int(Kind.PARAM), int(Kind.OPT_STATE), int(Kind.GRAD_LOCAL),
                                    int(Kind.GRAD_REDUCED)})


def blind_in(rule: WatchpointRule, watch: str) -> str | None:
    """What ``rule`` cannot see in a job watched by tier ``watch``, in one sentence, or None
    (the full tier records every statistic). The detector finds no value there to compare
    (never a false hit), so it would stay silent where a user expects it to fire."""
    if watch == "full":
        return None
    stats = sorted({k.rsplit("_", 1)[0] for k, _ in rule.params if k.startswith(_NEEDS_FULL_STATS)})
    if not stats or not rule.kinds & _TENSORS_WITHOUT_STATS:
        return None
    return (f"{rule.id}: the default watch records no {'/'.join(stats)} of weights, optimizer state or "
            "gradients (it keeps a fingerprint of each weight and each gradient's norm): this rule sees them only "
            "under --watch full; on gradients, the rms_* thresholds work in either watch")


def blind_watchpoints(cluster: dict) -> list[str]:
    """What each of a job's watchpoints cannot see in its watch (``cluster`` as the job's
    config holds it): said once at the start, so a rule never stays silent unexplained."""
    watch = cluster.get("watch", "default")
    return [b for r in parse_watchpoints(cluster.get("watchpoints") or []) if (b := blind_in(r, watch))]
