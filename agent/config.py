"""config.json for the in-rank probe: msProbe's fields plus rankscope's "cluster" and "rdr".

The file format is msProbe's (seeds/001) so an existing msProbe config.json works
unchanged. Validation is strict and happens at construction: a misspelt key or a
wrong type silently ignored would mean a whole training run without the dump the
user asked for, so every problem raises :class:`ConfigError` naming the field and
the offending value. msProbe keys this probe does not act on (e.g. ``async_dump``,
``acc_check``) are accepted and ignored, so msProbe configs stay valid.

Precedence follows msProbe: constructor arguments > config.json > msProbe defaults
(task "statistics", dump_path "./dump_path", level "L1", summary_mode "statistics").
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TASKS = ("statistics", "tensor")
LEVELS = ("L0", "L1", "mix", "debug")
SUMMARY_MODES = ("statistics", "md5")
DATA_MODES = ("all", "input", "output", "forward", "backward")
ON_DIVERGENCE = ("pause", "export", "terminate", "continue")
ON_TERMINATE = ("raise", "exit")
GROUP_MODES = ("dp", "replicas")
RDR_MODES = (1, 2)

#: msProbe's own bounds for step/rank numbers.
STEP_RANK_MAX = 1_000_000

# Top-level keys msProbe understands but this probe does not act on: accepted so an
# msProbe config.json loads unchanged, ignored otherwise.
_MSPROBE_IGNORED_TOP = frozenset({
    "extra_info", "async_dump", "precision", "dump_enable", "risk_level",
    "custom_op_namespaces", "load", "acc_check", "overflow_check", "free_benchmark",
    "run_ut", "grad_probe", "structure", "exception_dump", "diff_check", "nan_check",
})
_TOP_KEYS = frozenset({"task", "dump_path", "rank", "step", "level", "statistics", "tensor",
                       "rdr", "cluster"}) | _MSPROBE_IGNORED_TOP
# Task-section keys msProbe understands beyond the four we use.
_TASK_IGNORED = frozenset({"slice", "request_id", "diff_nums", "device", "precision",
                           "tensor_list", "file_format", "online_run_ut", "nfs_path",
                           "host", "port", "error_data_path", "bench_path"})
_TASK_KEYS = frozenset({"scope", "list", "data_mode", "summary_mode"}) | _TASK_IGNORED
_RDR_KEYS = frozenset({"enable", "mode", "path"})


class ConfigError(ValueError):
    """A config field is unknown, ill-typed or out of range; names the field and value."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"config field {field!r} = {value!r}: {reason}")


@dataclass
class ClusterConfig:
    """rankscope's "cluster" section: where the node agent is and how ranks are compared."""

    agent: str | None = None
    job: str | None = None
    sentinels: bool = True
    groups: str | list[list[int]] = "dp"
    on_divergence: str = "pause"
    on_terminate: str = "raise"
    deadline_s: float = 30.0
    flight_recorder_steps: int = 8
    dp_index: int | None = None
    #: Coordinator-side limits; validated here too so one config.json serves both.
    pause_timeout_s: float = 30.0
    export_timeout_s: float = 120.0
    max_pending_steps: int = 64
    #: Passed through untouched: the coordinator owns their schema and validates them.
    detectors: dict = field(default_factory=dict)
    watchpoints: list = field(default_factory=list)


@dataclass
class DebuggerConfig:
    task: str = "statistics"
    dump_path: str = "./dump_path"
    rank: list[int] = field(default_factory=list)  # empty = every rank
    step: list[int] = field(default_factory=list)  # empty = every step
    level: str = "L1"
    scope: list[str] = field(default_factory=list)
    list: list[str] = field(default_factory=list)
    data_mode: list[str] = field(default_factory=lambda: ["all"])
    summary_mode: str = "statistics"
    rdr: dict | None = None
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def to_dict(self) -> dict:
        """Plain JSON-able dict (for RDR bundles and logs)."""
        return asdict(self)

    def step_selected(self, step: int) -> bool:
        return not self.step or step in self.step

    def rank_selected(self, rank: int | None) -> bool:
        # An unknown rank (proc{pid}) is dumped: msProbe does the same for single-process runs.
        return not self.rank or rank is None or rank in self.rank


# ---------------------------------------------------------------- field checks
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_step_or_rank(value: Any, fname: str) -> list[int]:
    """msProbe's step/rank syntax: a list of ints and "a-b" / "a" strings -> sorted unique ints."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ConfigError(fname, value, "expected a list of integers or 'a-b' range strings")
    out: set[int] = set()
    for item in value:
        if _is_int(item):
            lo = hi = item
        elif isinstance(item, str):
            parts = item.strip().split("-")
            try:
                if len(parts) == 1:
                    lo = hi = int(parts[0])
                elif len(parts) == 2:
                    lo, hi = int(parts[0]), int(parts[1])
                else:
                    raise ValueError
            except ValueError:
                raise ConfigError(fname, item, "range strings look like '3' or '4-6'") from None
            if lo > hi:
                raise ConfigError(fname, item, f"range start {lo} is greater than its end {hi}")
        else:
            raise ConfigError(fname, item, "elements must be integers or 'a-b' range strings")
        if not (0 <= lo and hi <= STEP_RANK_MAX):
            raise ConfigError(fname, item, f"values must lie in [0, {STEP_RANK_MAX}]")
        out.update(range(lo, hi + 1))
    return sorted(out)


def _choice(value: Any, fname: str, choices: tuple) -> Any:
    if value not in choices or isinstance(value, bool):
        raise ConfigError(fname, value, f"expected one of {list(choices)}")
    return value


def _str_list(value: Any, fname: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ConfigError(fname, value, "expected a list of strings")
    return list(value)


def _check_keys(section: Any, fname: str, allowed: frozenset) -> dict:
    if not isinstance(section, dict):
        raise ConfigError(fname, section, "expected a JSON object")
    for key in section:
        if key not in allowed:
            where = f"{fname}.{key}" if fname else key
            raise ConfigError(where, section[key], f"unknown field (known: {sorted(allowed)})")
    return section


def _task_section(raw: dict, task: str) -> tuple[list[str], list[str], list[str], str]:
    # Validate both sections if present (a typo in the unused one is still a typo),
    # but take the values from the section of the effective task, as msProbe does.
    parsed = {}
    for name in TASKS:
        sec = raw.get(name)
        if sec is None:
            sec = {}
        _check_keys(sec, name, _TASK_KEYS)
        scope = _str_list(sec.get("scope"), f"{name}.scope")
        if scope and len(scope) != 2:
            raise ConfigError(f"{name}.scope", scope, "scope names a [start, end] pair: exactly 2 entries")
        lst = _str_list(sec.get("list"), f"{name}.list")
        data_mode = _str_list(sec.get("data_mode"), f"{name}.data_mode") or ["all"]
        for mode in data_mode:
            _choice(mode, f"{name}.data_mode", DATA_MODES)
        if "all" in data_mode and len(data_mode) != 1:
            raise ConfigError(f"{name}.data_mode", data_mode, "'all' cannot be combined with other modes")
        summary = sec.get("summary_mode", "statistics")
        if summary is None:
            summary = "statistics"
        _choice(summary, f"{name}.summary_mode", SUMMARY_MODES)
        parsed[name] = (scope, lst, data_mode, summary)
    return parsed[task]


def _check_rdr(section: Any) -> dict | None:
    """Shape check only; env fallback and defaults live in agent.rdr.settings (resolve_rdr)."""
    if section is None:
        return None
    _check_keys(section, "rdr", _RDR_KEYS)
    out = dict(section)
    if "enable" in out and not isinstance(out["enable"], bool):
        raise ConfigError("rdr.enable", out["enable"], "expected true or false")
    if "mode" in out:
        _choice(out["mode"], "rdr.mode", RDR_MODES)
    if "path" in out:
        path = out["path"]
        if not isinstance(path, str) or not os.path.isabs(path):
            raise ConfigError("rdr.path", path, "expected an absolute path string")
    return out


def parse_cluster(section: Any) -> ClusterConfig:
    """Validate the "cluster" section (None or {} -> defaults)."""
    if section is None:
        return ClusterConfig()
    known = frozenset(ClusterConfig.__dataclass_fields__)
    _check_keys(section, "cluster", known)
    cfg = ClusterConfig()
    for key, value in section.items():
        fname = f"cluster.{key}"
        if key in ("agent", "job"):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(fname, value, "expected a non-empty string or null")
        elif key == "sentinels":
            if not isinstance(value, bool):
                raise ConfigError(fname, value, "expected true or false")
        elif key == "groups":
            value = _check_groups(value)
        elif key == "on_divergence":
            _choice(value, fname, ON_DIVERGENCE)
        elif key == "on_terminate":
            _choice(value, fname, ON_TERMINATE)
        elif key in ("deadline_s", "pause_timeout_s", "export_timeout_s"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ConfigError(fname, value, "expected a positive number of seconds")
            value = float(value)
        elif key in ("flight_recorder_steps", "max_pending_steps"):
            if not _is_int(value) or value < 1:
                raise ConfigError(fname, value, "expected an integer >= 1")
        elif key == "dp_index":
            if value is not None and (not _is_int(value) or value < 0):
                raise ConfigError(fname, value, "expected an integer >= 0 or null")
        elif key == "detectors":
            if not isinstance(value, dict):
                raise ConfigError(fname, value, "expected a JSON object")
        elif key == "watchpoints":
            if not isinstance(value, list):
                raise ConfigError(fname, value, "expected a list")
        setattr(cfg, key, value)
    return cfg


def _check_groups(value: Any) -> str | list[list[int]]:
    if isinstance(value, str):
        return _choice(value, "cluster.groups", GROUP_MODES)
    if not isinstance(value, list) or not value:
        raise ConfigError("cluster.groups", value, f"expected one of {list(GROUP_MODES)} or a list of rank lists")
    seen: set[int] = set()
    for group in value:
        if not isinstance(group, list) or not group or not all(_is_int(r) and r >= 0 for r in group):
            raise ConfigError("cluster.groups", group, "each group must be a non-empty list of ranks >= 0")
        dup = seen.intersection(group)
        if dup or len(set(group)) != len(group):
            raise ConfigError("cluster.groups", group, f"rank(s) {sorted(dup) or group} listed twice")
        seen.update(group)
    return [list(g) for g in value]


def _read_file(config_path: str | os.PathLike) -> dict:
    path = Path(config_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("config_path", str(config_path), f"cannot read: {exc.strerror or exc}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("config_path", str(config_path),
                          f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    if not isinstance(raw, dict):
        raise ConfigError("config_path", str(config_path), "top level must be a JSON object")
    return raw


def _first(*values: Any) -> Any:
    """First value that is not None (0 or "" are values, and get validated)."""
    return next(v for v in values if v is not None)


def load_config(config_path: str | os.PathLike | None = None, *, task: str | None = None,
                dump_path: str | None = None, level: str | None = None,
                step: list | None = None) -> DebuggerConfig:
    """Load and validate config.json; the keyword arguments win over the file (msProbe's rule)."""
    raw = _read_file(config_path) if config_path is not None else {}
    return config_from_dict(raw, task=task, dump_path=dump_path, level=level, step=step)


def config_from_dict(raw: dict, *, task: str | None = None, dump_path: str | None = None,
                     level: str | None = None, step: list | None = None) -> DebuggerConfig:
    """Same as :func:`load_config` for an already-parsed dict."""
    _check_keys(raw, "", _TOP_KEYS)
    # Constructor arguments are checked under their own names so the error says which one.
    eff_task = _choice(_first(task, raw.get("task"), "statistics"), "task", TASKS)
    eff_level = _choice(_first(level, raw.get("level"), "L1"), "level", LEVELS)
    eff_dump = _first(dump_path, raw.get("dump_path"), "./dump_path")
    if isinstance(eff_dump, os.PathLike):
        eff_dump = os.fspath(eff_dump)
    if not isinstance(eff_dump, str) or not eff_dump:
        raise ConfigError("dump_path", eff_dump, "expected a non-empty path string")
    steps = _parse_step_or_rank(step if step is not None else raw.get("step"), "step")
    ranks = _parse_step_or_rank(raw.get("rank"), "rank")
    scope, lst, data_mode, summary = _task_section(raw, eff_task)
    return DebuggerConfig(
        task=eff_task, dump_path=eff_dump, rank=ranks, step=steps, level=eff_level,
        scope=scope, list=lst, data_mode=data_mode, summary_mode=summary,
        rdr=_check_rdr(raw.get("rdr")), cluster=parse_cluster(raw.get("cluster")),
    )
