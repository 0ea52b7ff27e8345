"""The live coordinator's core, fed a dump tree step by step instead of ranks over a socket.

Every rank of the tree reports every step of the tree's span: the rows of its dump.json,
or no rows where it has none or it could not be read (an empty report, so the step is
judged at once with the ranks that have it, and nothing waits for a deadline). The
incident runs under the ``continue`` policy: there is no job to pause, each rank's
"bundle" is its own dump folder of the incident's step, referenced where it lies, and
the same :class:`ActionPerformer` as a live coordinator writes incident.json, history.json
and report.html.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rankscope.config.cluster import OnDivergence, parse_cluster
from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.incidents.incident import IncidentEvent
from rankscope.coordinator.offline.dump_rows import RankStep
from rankscope.coordinator.offline.replicas import ReplicaLearner
from rankscope.coordinator.offline.steps import StepReader
from rankscope.coordinator.offline.tree import DumpTree
from rankscope.coordinator.server.actions import ActionPerformer
from rankscope.wire.records import NameTable, StepBatch

JOB = "analyze"
#: Progress lines on a long analysis, at most this often.
SAY_EVERY_S = 5.0


@dataclass
class Analysis:
    tree: DumpTree
    steps_read: list[int] = field(default_factory=list)
    #: rank -> [(step, why)] for every dump of the tree's span that gave no rows.
    not_read: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    incidents: list[dict[str, Any]] = field(default_factory=list)
    replicated: int = 0
    header: dict[str, set[str]] = field(default_factory=lambda: {"framework": set(), "task": set(), "level": set()})
    seconds: float = 0.0
    #: The step being read when Ctrl-C stopped the analysis (what was judged before it stands).
    interrupted_at: int | None = None


class Analyzer:
    def __init__(self, tree: DumpTree, export_dir: Path, cluster: dict[str, Any] | None = None,
                 jobs: int | None = None, say: Callable[[str], None] = print) -> None:
        section = dict(cluster or {})
        section["on_divergence"] = OnDivergence.CONTINUE.value  # nothing to pause: the job ran elsewhere
        self.settings = parse_cluster(section)
        self.tree, self.export_dir, self.say = tree, Path(export_dir), say
        self._now = 0.0
        self.core = CoordinatorCore(self.settings, clock=lambda: self._now, export_dir=self.export_dir)
        self.actions = ActionPerformer(self.core, self.export_dir, self._control)
        self.reader = StepReader(jobs)
        groups = self.settings.groups
        self.learner = ReplicaLearner([list(g) for g in groups] if isinstance(groups, (list, tuple)) else None)
        self.names: dict[int, NameTable] = {}
        self._interned: dict[str, str] = {}
        self.result = Analysis(tree)

    def run(self) -> Analysis:
        t0 = time.monotonic()
        ranks, steps = self.tree.ranks, self.tree.steps
        for r in ranks:
            self.core.on_register(JOB, r, {"world_size": len(ranks), "host": "dump", "pid": 0})
        held: list[tuple[int, dict[int, RankStep | str]]] = []
        replicated: frozenset[str] = frozenset()
        last_said = time.monotonic()
        step = None
        try:
            for i, step in enumerate(steps):
                rows = self.reader.read(self.tree.where[step])
                self._note(step, rows)
                if self.learner.learning:
                    self.learner.observe({r: v for r, v in rows.items() if isinstance(v, RankStep)})
                    held.append((step, rows))
                    if self.learner.learning and i + 1 < len(steps):
                        continue
                    replicated = self.learner.replicated()
                    self.result.replicated = len(replicated)
                    for s, r in held:
                        self._feed(s, r, replicated)
                    held.clear()
                else:
                    self._feed(step, rows, replicated)
                if time.monotonic() - last_said > SAY_EVERY_S:
                    last_said = time.monotonic()
                    self.say(f"analysed step {step} ({i + 1} of {len(steps)} steps, {len(ranks)} ranks)")
        except KeyboardInterrupt:
            self.result.interrupted_at = step
        try:
            self.core.drain()
            self.actions.run()
        finally:
            self.reader.close()
            self.actions.close()
        self.result.incidents = self.core.documents()
        self.result.seconds = time.monotonic() - t0
        return self.result

    def _note(self, step: int, rows: dict[int, RankStep | str]) -> None:
        for r in self.tree.ranks:
            got = rows.get(r)
            if got is None:
                self.result.not_read.setdefault(r, []).append((step, "no dump for this step"))
            elif isinstance(got, str):
                self.result.not_read.setdefault(r, []).append((step, got))
            else:
                for key in ("framework", "task", "level"):
                    if getattr(got, key):
                        self.result.header[key].add(getattr(got, key))

    def _feed(self, step: int, rows: dict[int, RankStep | str], replicated: frozenset[str]) -> None:
        for r in self.tree.ranks:
            got = rows.get(r)
            if isinstance(got, RankStep):
                batch = self._batch(r, step, got, replicated)
            else:
                batch = StepBatch.empty(JOB, r, step)
            self.core.on_step(batch)
        self._now += 0.001
        self.core.tick()
        self.actions.run()
        self.result.steps_read.append(step)

    def _batch(self, rank: int, step: int, rs: RankStep, replicated: frozenset[str]) -> StepBatch:
        table = self.names.setdefault(rank, NameTable())
        # One string object per name across ranks: a thousand ranks' tables share them.
        ids = [table.id_for(self._interned.setdefault(n, n)) for n in rs.names]
        n = len(ids)
        return StepBatch(JOB, rank, step, np.asarray(ids, np.uint32), self.learner.kinds(rs, replicated),
                         np.arange(n, dtype=np.uint32), rs.stats, rs.nan, rs.inf, rs.numel, rs.crc,
                         new_names=table.take_new())

    def _control(self, command: str, job: str | None = None, incident: str | None = None,
                 args: dict | None = None) -> int:
        """What a live coordinator sends to the ranks; here only an export means something:
        each rank's bundle is its dump folder of the incident's step."""
        if command != "export" or incident is None:
            return 0
        inc = next((i for i in self.core.incidents() if i["incident_id"] == incident), {})
        step = (inc.get("verdict") or {}).get("step")
        folders = {r: self._folder(r, step if isinstance(step, int) else None) for r in self.tree.ranks}
        self.core.on_bundles(incident, {r: str(f) for r, f in folders.items() if f is not None})
        self.core.incident_event(incident, IncidentEvent.BUNDLES_RECEIVED)
        return len(self.tree.ranks)

    def _folder(self, rank: int, step: int | None) -> Path | None:
        """The rank's dump folder of ``step``, else of the nearest step before it that it has."""
        best = None
        for s in self.tree.steps:
            if step is not None and s > step:
                break
            best = self.tree.where[s].get(rank, best)
        return best
