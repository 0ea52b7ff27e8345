"""config.json's ``cluster`` section: where the node agent is and how ranks are compared.

One schema for every process: the probe reads ``agent``, ``job``, ``sentinels``, ``rerun``, ``on_transient``,
``watch``, ``budget``, ``on_terminate``, ``dp_index``, ``flight_recorder_steps`` and the ``dump_*`` retention; the coordinator reads the
groups, deadlines, detectors and watchpoints; ``rankscope launch`` checks all of it
before anything starts. Every error names the field and the value, because the section
is hand-written.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

from rankscope.config.checks import (
    choice,
    is_int,
    known_keys,
    positive_float,
    positive_int,
)
from rankscope.config.detectors import DetectorSettings, parse_detectors
from rankscope.config.errors import ConfigError
from rankscope.config.layout import LayoutSpec, parse_layout
from rankscope.config.watchpoints import WatchpointRule, parse_watchpoints
from rankscope.wire.rerun_facts import ON_TRANSIENT
from rankscope.wire.shards import check_shard_count
from rankscope.text.watch_line import DEFAULT_BUDGET, DEFAULT_TIER, TIERS


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


#: ``groups`` spellings: "dp" = the job's parallel layout decides who is compared with
#: whom (learned from the job; plain data parallelism: every rank one group); "replicas"
#: = every rank one group, and the ranks get identical input (inference DP), so every
#: record kind, not only parameters/reduced grads, must match bit for bit. A list of rank
#: lists names the replica groups by hand (the ranks holding the same shard).
GROUP_MODES = ("dp", "replicas")
#: What a rank does when the coordinator terminates the job: raise RankscopeTerminated
#: in the training thread, or leave at once with exit status 86.
ON_TERMINATE = ("raise", "exit")

Groups = str | tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ClusterSettings:
    agent: str | None = None
    job: str | None = None
    sentinels: bool = True
    groups: Groups = "dp"
    #: The data x tensor x pipeline degrees by hand (overrides what is learned).
    layout: LayoutSpec | None = None
    on_divergence: OnDivergence = OnDivergence.PAUSE
    on_terminate: str = "raise"
    deadline_s: float = 30.0
    flight_recorder_steps: int = 8
    dp_index: int | None = None
    #: Steps held unjudged per group before the oldest is judged early; bounds memory
    #: when a rank falls far behind.
    max_pending_steps: int = 64
    #: The same bound in memory: pending slots of one coordinator core (one ingest shard)
    #: beyond this many MiB have their oldest judged early. 73 B per rank x tensor x step,
    #: so at 16k ranks x 128 tensors a step is 153 MiB and 64 steps would be 9.6 GiB.
    max_pending_mb: float = 1024.0
    pause_timeout_s: float = 30.0
    export_timeout_s: float = 120.0
    #: A collective that live ranks have waited in this long, while a peer never entered
    #: it, is a hang (the peer is named). Collectives that time out sooner (MindSpore's CPU
    #: collectives: 30 s) end in deaths, which are judged without waiting for this.
    hang_timeout_s: float = 120.0
    #: Deaths arriving within this long of the first are judged together (earliest first).
    failure_settle_s: float = 0.5
    #: Deaths this long after the first failure of a group are its followers (the
    #: launcher's teardown), not new findings.
    teardown_window_s: float = 10.0
    detectors: DetectorSettings = field(default_factory=DetectorSettings)
    watchpoints: tuple[WatchpointRule, ...] = ()
    #: Compiled code (GRAPH mode, @ms.jit) is watched through MindSpore's kernel dump:
    #: "default" (the gradient AllReduce and MatMul), "all", "off", or a list of op types.
    graph_kernels: str | tuple[str, ...] = "default"
    #: Zero-code serving: the root model's forward calls a..b of each request batch to
    #: record (``start(model, token_range=...)``'s meaning); None records every call.
    token_range: tuple[int, int] | None = None
    #: Ingest shards of the coordinator (Ray actors judging a share of the record kinds
    #: each, one verdict actor merging them); 1 = one coordinator actor.
    shards: int = 1
    #: What of a rank's local dump stays on disk (dump.retention): its newest steps within
    #: a byte and file budget; None lifts a bound. A msProbe ``step`` list keeps its steps.
    dump_keep_steps: int | None = 100
    dump_max_mb: float | None = 1024.0
    dump_max_files: int | None = 20_000
    #: A rank whose loss or gradients are anomalous before the reduction re-runs that
    #: forward and backward once (probe.rerun.rerun) and says whether the fault reproduced.
    rerun: bool = True
    #: A fault the re-run did not reproduce (rerun_facts.ON_TRANSIENT): "continue" (the
    #: step goes on as made; the incident follows on_divergence), "skip" (the step goes on
    #: with the re-run's result; the incident exports and the job runs on) or "pause".
    on_transient: str = "continue"
    #: The watch's tier (text.watch_line.TIERS): "default" stays within ``budget`` of the
    #: rank's median step (fingerprints rotate when they do not fit); "full" records
    #: every parameter, optimizer state and gradient in full every step.
    watch: str = DEFAULT_TIER
    budget: float = DEFAULT_BUDGET
    #: The section as written (validated): what a process hands on to another.
    section: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def replicas_mode(self) -> bool:
        return self.groups == "replicas"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.section)


KNOWN_FIELDS = frozenset(f for f in ClusterSettings.__dataclass_fields__ if f != "section")


def parse_cluster(section: Mapping[str, Any] | None) -> ClusterSettings:
    """Validate the ``cluster`` section (None or {} -> defaults)."""
    sec = dict(known_keys("cluster", {} if section is None else section, KNOWN_FIELDS))
    kw: dict[str, Any] = {}
    for key, val in sec.items():
        fld = f"cluster.{key}"
        if key in ("agent", "job"):
            if val is not None and (not isinstance(val, str) or not val):
                raise ConfigError(fld, val, "expected a non-empty string or null")
            kw[key] = val
        elif key in ("sentinels", "rerun"):
            if not isinstance(val, bool):
                raise ConfigError(fld, val, "expected true or false")
            kw[key] = val
        elif key == "groups":
            kw[key] = _parse_groups(val)
        elif key == "layout":
            kw[key] = parse_layout(val)
        elif key == "on_divergence":
            kw[key] = OnDivergence(choice(fld, val, [p.value for p in OnDivergence]))
        elif key == "on_terminate":
            kw[key] = choice(fld, val, ON_TERMINATE)
        elif key == "on_transient":
            kw[key] = choice(fld, val, ON_TRANSIENT)
        elif key == "watch":
            kw[key] = choice(fld, val, TIERS)
        elif key == "budget":
            share = positive_float(fld, val)
            if share > 1:
                raise ConfigError(fld, val, "expected the watch's share of a step, greater than 0 and at most 1")
            kw[key] = share
        elif key in ("deadline_s", "pause_timeout_s", "export_timeout_s", "hang_timeout_s", "failure_settle_s",
                     "teardown_window_s", "max_pending_mb"):
            kw[key] = positive_float(fld, val)
        elif key in ("flight_recorder_steps", "max_pending_steps"):
            kw[key] = positive_int(fld, val)
        elif key in ("dump_keep_steps", "dump_max_files"):
            kw[key] = None if val is None else positive_int(fld, val)
        elif key == "dump_max_mb":
            kw[key] = None if val is None else positive_float(fld, val)
        elif key == "dp_index":
            if val is not None and (not is_int(val) or val < 0):
                raise ConfigError(fld, val, "expected an integer >= 0 or null")
            kw[key] = val
        elif key == "graph_kernels":
            kw[key] = _parse_graph_kernels(val)
        elif key == "token_range":
            kw[key] = _parse_token_range(val)
        elif key == "shards":
            try:
                kw[key] = check_shard_count(val, fld)
            except ValueError as exc:
                raise ConfigError(fld, val, str(exc).split(": ", 1)[1]) from None
        elif key == "detectors":
            if val is not None:
                kw[key] = parse_detectors(val)
        elif key == "watchpoints":
            if val is not None:
                kw[key] = parse_watchpoints(val, fld)
    return ClusterSettings(section=sec, **kw)


def _parse_token_range(val: Any) -> tuple[int, int] | None:
    if val is None:
        return None
    if not isinstance(val, (list, tuple)) or len(val) != 2 or not all(is_int(v) for v in val) \
            or not 0 <= val[0] <= val[1]:
        raise ConfigError("cluster.token_range", val, "expected [start, end] with 0 <= start <= end, or null")
    return int(val[0]), int(val[1])


def _parse_graph_kernels(val: Any) -> str | tuple[str, ...]:
    if isinstance(val, str):
        return choice("cluster.graph_kernels", val, ("default", "all", "off"))
    if not isinstance(val, (list, tuple)) or not val or \
            not all(isinstance(k, str) and k and "/" not in k for k in val):
        raise ConfigError("cluster.graph_kernels", val,
                          "expected 'default', 'all', 'off' or a non-empty list of op types like ['AllReduce']")
    return tuple(val)


def _parse_groups(val: Any) -> Groups:
    if isinstance(val, str):
        return choice("cluster.groups", val, GROUP_MODES)
    if not isinstance(val, (list, tuple)) or not val:
        raise ConfigError("cluster.groups", val, "expected 'dp', 'replicas' or a non-empty list of rank lists")
    seen: set[int] = set()
    groups = []
    for i, grp in enumerate(val):
        fld = f"cluster.groups[{i}]"
        if not isinstance(grp, (list, tuple)) or not grp:
            raise ConfigError(fld, grp, "expected a non-empty list of rank ids")
        for rank in grp:
            if not is_int(rank) or rank < 0:
                raise ConfigError(fld, rank, "rank ids must be integers >= 0")
            if rank in seen:
                raise ConfigError(fld, rank, "rank appears in more than one group")
            seen.add(rank)
        groups.append(tuple(grp))
    return tuple(groups)
