"""config.json for the in-rank probe: msProbe's fields plus rankscope's "cluster" and "rdr".

The file format is msProbe's (seeds/001) so an existing msProbe config.json works
unchanged. Validation is strict and happens at construction: a misspelt key or a
wrong type silently ignored would mean a whole training run without the dump the
user asked for, so every problem raises :class:`ConfigError` naming the field and
the offending value. Shapes, types, choices and unknown keys are checked against a
JSON Schema (:mod:`.schema`); msProbe's step/rank range strings here. msProbe keys this probe does not act on (e.g. ``async_dump``,
``acc_check``) are accepted and ignored, so msProbe configs stay valid.

Precedence follows msProbe: constructor arguments > config.json > msProbe defaults
(task "statistics", dump_path "./dump_path", level "L1", summary_mode "statistics").
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from rankscope.config.checks import choice, is_int
from rankscope.config.cluster import ClusterSettings, parse_cluster
from rankscope.config.errors import ConfigError
from rankscope.config.file import read_config_file
from rankscope.config.schema import KERNEL_LEVEL, LEVELS, TASKS, check_msprobe_fields

#: msProbe's own bounds for step/rank numbers.
STEP_RANK_MAX = 1_000_000


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
    cluster: ClusterSettings = field(default_factory=ClusterSettings)

    def to_dict(self) -> dict:
        """Plain JSON-able dict (for RDR bundles and logs)."""
        out = {k: v for k, v in asdict(self).items() if k != "cluster"}
        out["cluster"] = self.cluster.to_dict()
        return out

    def step_selected(self, step: int) -> bool:
        return not self.step or step in self.step

    def rank_selected(self, rank: int | None) -> bool:
        # An unknown rank (proc{pid}) is dumped: msProbe does the same for single-process runs.
        return not self.rank or rank is None or rank in self.rank


def ranks_not_in_job(ranks: list[int], world: int | None) -> str | None:
    """What to say when the ``rank`` list names ids a ``world``-rank job does not have
    (they select nothing), or None."""
    absent = [r for r in ranks if world and r >= world]
    if not absent:
        return None
    kept = [r for r in ranks if r < world]
    return (f"config rank {ranks}: {absent} {'is' if len(absent) == 1 else 'are'} not a rank of this {world}-rank "
            f"job (ids 0-{world - 1}); " + (f"only ranks {kept} are dumped" if kept else "no rank is dumped"))


# ---------------------------------------------------------------- field checks
def _parse_step_or_rank(value: Any, fname: str) -> list[int]:
    """msProbe's step/rank syntax: a list of ints and "a-b" / "a" strings -> sorted unique ints."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ConfigError(fname, value, "expected a list of integers or 'a-b' range strings")
    out: set[int] = set()
    for item in value:
        if is_int(item):
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


def _task_section(raw: dict, task: str) -> tuple[list[str], list[str], list[str], str]:
    """The effective task's settings, as msProbe takes them (both sections were checked
    against the schema already: a typo in the unused one is still a typo)."""
    sec = raw.get(task) or {}
    return (list(sec.get("scope") or []), list(sec.get("list") or []),
            list(sec.get("data_mode") or ["all"]), sec.get("summary_mode") or "statistics")


def _check_rdr(section: Any) -> dict | None:
    """Shape check now; the env fallback applies when the recorder is installed."""
    if section is None:
        return None
    from rankscope.config.rdr import resolve_rdr
    resolve_rdr(section, env={})
    return dict(section)


def _first(*values: Any) -> Any:
    """First value that is not None (0 or "" are values, and get validated)."""
    return next(v for v in values if v is not None)


def load_config(config_path: str | os.PathLike | None = None, *, task: str | None = None,
                dump_path: str | None = None, level: str | None = None,
                step: list | None = None) -> DebuggerConfig:
    """Load and validate config.json; the keyword arguments win over the file (msProbe's rule)."""
    raw = read_config_file(config_path) if config_path is not None else {}
    return config_from_dict(raw, task=task, dump_path=dump_path, level=level, step=step)


def config_from_dict(raw: dict, *, task: str | None = None, dump_path: str | None = None,
                     level: str | None = None, step: list | None = None) -> DebuggerConfig:
    """Same as :func:`load_config` for an already-parsed dict."""
    if not isinstance(raw, dict):
        raise ConfigError("config", raw, "expected a JSON object")
    given = {"task": task, "level": level, "dump_path": dump_path, "step": step}
    check_msprobe_fields(raw, skip=[k for k, v in given.items() if v is not None])
    # Constructor arguments are checked under their own names so the error says which one.
    eff_task = choice("task", _first(task, raw.get("task"), "statistics"), TASKS)
    eff_level = choice("level", _first(level, raw.get("level"), "L1"), LEVELS)
    eff_dump = _first(dump_path, raw.get("dump_path"), "./dump_path")
    if isinstance(eff_dump, os.PathLike):
        eff_dump = os.fspath(eff_dump)
    if not isinstance(eff_dump, str) or not eff_dump:
        raise ConfigError("dump_path", eff_dump, "expected a non-empty path string")
    steps = _parse_step_or_rank(step if step is not None else raw.get("step"), "step")
    ranks = _parse_step_or_rank(raw.get("rank"), "rank")
    scope, lst, data_mode, summary = _task_section(raw, eff_task)
    if eff_level == KERNEL_LEVEL and scope:
        raise ConfigError(f"{eff_task}.scope", scope, f"scope selects Cells or APIs, which level "
                          f"{KERNEL_LEVEL} does not record (it reads the kernel dump of compiled code)")
    return DebuggerConfig(
        task=eff_task, dump_path=eff_dump, rank=ranks, step=steps, level=eff_level,
        scope=scope, list=lst, data_mode=data_mode, summary_mode=summary,
        rdr=_check_rdr(raw.get("rdr")), cluster=parse_cluster(raw.get("cluster")),
    )
