"""The job's parallel layout, put together from what every rank saw (wire.layout_facts).

Two relations come out of it, per rank:

- its *replicas*: the ranks that must hold the same values as it (parameters, reduced
  gradients, optimizer state): the ranks holding the same shard of the model;
- its *role*: the ranks whose statistics compare with its own (activations, local
  gradients, loss): same shard, same stage, other data. Usually the same ranks; under
  optimizer sharding each replica keeps a different piece of the weights, so nothing of
  them must match while their statistics still compare.

Where each rank's answer comes from, first that applies: ``cluster.layout`` or
``cluster.groups`` (the user's word); the groups its gradient reducers reduce over; the
parameter layouts of MindSpore's semi/auto parallel; mindformers' ``parallel_config``; a
data-parallel context; a group whose name says data parallel. A rank whose job made
communication groups that none of these explain gets no replicas and no role: nothing of
it is compared, and the layout says so. A job with no group but the world is one replica
set, as plain data parallelism is. Pure logic: no Ray, sockets or MindSpore.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rankscope.config.layout import LayoutSpec
from rankscope.text.spans import rank_span

WORLD_GROUPS = frozenset({"hccl_world_group", "nccl_world_group", "mccl_world_group"})
_DP_NAME = re.compile(r"(^|[^a-z])(dp|data)([^a-z]|$)", re.IGNORECASE)
_SEMI = ("semi_auto_parallel", "auto_parallel")
_SHOWN_SETS = 8

Ranks = tuple[int, ...]


@dataclass(frozen=True)
class JobLayout:
    replicas: dict[int, Ranks]
    roles: dict[int, Ranks]
    line: str
    source: str
    unknown: tuple[str, ...] = ()
    #: Every rank in one set, for replicas and roles alike: plain data parallelism.
    whole: bool = True
    opt_state_replicated: bool = True
    version: int = 0
    #: Each rank's parameters (names and shapes) as a short key: equal on the tensor-parallel
    #: shards of one stage, different between stages; absent where the rank did not say.
    stage_keys: dict[int, str] = field(default_factory=dict)
    #: Ranks in a role of their own (their layout not learned, or no data-parallel
    #: replica): no statistic of theirs is compared with another rank's.
    uncompared: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "source": self.source, "unknown": list(self.unknown), "whole": self.whole,
                "uncompared": list(self.uncompared),
                "replica_sets": [list(s) for s in sorted({s for s in self.replicas.values() if len(s) > 1})[:256]],
                "role_sets": [list(s) for s in sorted({s for s in self.roles.values() if len(s) > 1})[:256]]}


@dataclass
class _Answer:
    replicas: Ranks | None
    roles: Ranks | None
    source: str
    note: str = ""
    opt_sharded: bool = False
    #: (tensor-parallel shards, pipeline stages) where the source says them.
    split: tuple[int, int] | None = None


@dataclass
class _Job:
    facts: dict[int, dict[str, Any]] = field(default_factory=dict)
    world: int | None = None
    ranks: set[int] = field(default_factory=set)


def derive(facts: dict[int, dict[str, Any]], ranks: Iterable[int], world: int | None = None,
           groups: Any = "dp", spec: LayoutSpec | None = None) -> JobLayout:
    """The layout of one job from its ranks' facts and the cluster settings."""
    ranks = sorted(set(ranks) | set(facts))
    if world is None:
        world = max([f.get("world") or 0 for f in facts.values()] + [max(ranks, default=-1) + 1]) or None
    if spec is not None:
        sets, split = spec.sets(), (spec.tensor_parallel, spec.pipeline_stages)
        return _finish(ranks, {r: _Answer(sets.get(r, (r,)), sets.get(r, (r,)), "cluster.layout", split=split)
                               for r in ranks}, facts, "cluster.layout")
    if isinstance(groups, tuple):
        listed = {r: tuple(sorted(g)) for g in groups for r in g}
        return _finish(ranks, {r: _Answer(listed.get(r, (r,)), listed.get(r, (r,)), "cluster.groups") for r in ranks},
                       facts, "cluster.groups")
    everyone = tuple(range(world)) if world else tuple(ranks)
    if groups == "replicas" or not facts:
        return _whole(everyone, "every rank of the job (cluster.groups \"replicas\")" if groups == "replicas"
                      else "every rank of the job (no rank has said more)")
    named = _all_groups(facts, everyone)
    answers = {r: _answer(r, facts.get(r), named, everyone) for r in ranks}
    hybrid = any(a.replicas is not None and len(a.replicas) < len(everyone) for a in answers.values())
    for r, a in answers.items():
        # A rank that said nothing of a layout (no facts, or facts of plain data
        # parallelism: no group but the world) is every rank's replica, unless another
        # rank's answer shows the job is split: then nothing can be assumed of it.
        if a.replicas is None and not a.note and not hybrid:
            answers[r] = _Answer(everyone, everyone, "default")
        elif a.replicas is None:
            said = "sent no layout" if facts.get(r) is None else "said nothing of which ranks are its replicas"
            answers[r] = _Answer((r,), (r,), "unknown", a.note or said)
    return _finish(ranks, answers, facts, "learned")


def _whole(everyone: Ranks, why: str) -> JobLayout:
    n = len(everyone)
    line = f"{n} data-parallel replica{'s' if n != 1 else ''} (pure data parallel: {why})"
    return JobLayout({r: everyone for r in everyone}, {r: everyone for r in everyone}, line, "default")


def _all_groups(facts: dict[int, dict], everyone: Ranks) -> dict[str, Ranks]:
    named: dict[str, Ranks] = {g: everyone for g in WORLD_GROUPS}
    for f in facts.values():
        if f.get("world_group"):
            named[f["world_group"]] = everyone
        for name, members in (f.get("groups") or {}).items():
            named.setdefault(name, tuple(sorted(members)))
    return named


def _answer(r: int, f: dict | None, named: dict[str, Ranks], everyone: Ranks) -> _Answer:
    if f is None:
        return _Answer(None, None, "unknown")
    if f.get("mindspore_rank") is not None and f["mindspore_rank"] != r:
        # The node agent gave this process another id (ids clashed, as DP inference
        # workers alone in their worlds do): groups it made speak of ids the job does not use.
        made = bool(f.get("groups") or f.get("reducers")) or any(
            g not in WORLD_GROUPS and g != f.get("world_group") for _, g in f.get("collectives") or [])
        return _Answer(None, None, "unknown", "renumbered by the node agent (its id clashed), so the groups it "
                       "made do not apply" if made else "")
    ctx = f.get("context") or {}
    opt_sharded = bool(ctx.get("parallel_optimizer"))
    reducers = f.get("reducers") or []
    if reducers:
        sets = [named.get(g) for g in reducers]
        if all(s is not None for s in sets):
            common = _meet(r, sets)  # type: ignore[arg-type]
            return _Answer((r,) if opt_sharded else common, common, "gradient reducer groups", opt_sharded=opt_sharded)
    if ctx.get("parallel_mode") in _SEMI:
        return _semi_auto(r, f, ctx, everyone)
    cfg = f.get("parallel_config")
    if cfg and cfg.get("data_parallel") and cfg.get("model_parallel"):
        return _parallel_config(r, cfg, opt_sharded)
    own = [(name, s) for name, s in named.items() if r in s and s != everyone]
    if ctx.get("parallel_mode") == "data_parallel" and not own:
        return _Answer(everyone, everyone, "data-parallel context")
    dp_named = [s for name, s in own if _DP_NAME.search(name)]
    if len(dp_named) == 1:
        return _Answer(dp_named[0], dp_named[0], "group names")
    if own or any(g not in WORLD_GROUPS and g != f.get("world_group") for _, g in f.get("collectives") or []):
        return _Answer((r,), (r,), "unknown",
                       "made communication groups, but no nn.DistributedGradReducer, parallel context or group "
                       "name says which ranks are its replicas (set cluster.layout)")
    return _Answer(None, None, "unknown")


def _meet(r: int, sets: list[Ranks]) -> Ranks:
    common = set(sets[0])
    for s in sets[1:]:
        common &= set(s)
    return tuple(sorted(common | {r}))


def _semi_auto(r: int, f: dict, ctx: dict, everyone: Ranks) -> _Answer:
    layouts = f.get("param_layouts") or []
    mode = ctx.get("parallel_mode")
    if not layouts:
        return _Answer((r,), (r,), "unknown", f"runs {mode}, and its parameters' layouts were not readable")
    device_num = ctx.get("device_num") or len(everyone)
    stages = max(1, ctx.get("pipeline_stages") or 1)
    per_stage = max(1, device_num // stages)
    base, local = (r // per_stage) * per_stage, r % per_stage
    roles, replicas = set(range(base, base + per_stage)), set(range(base, base + per_stage))
    sharded = False
    for dev, tmap, opt_sharded, _count in layouts:
        same = {base + x for x in range(per_stage) if _same_slice(x, local, dev, tmap)}
        roles &= same
        replicas &= {r} if opt_sharded else same
        sharded |= opt_sharded
    return _Answer(tuple(sorted(replicas | {r})), tuple(sorted(roles | {r})), f"{mode} parameter layouts",
                   opt_sharded=sharded, split=(per_stage // max(1, len(roles | {r})), stages))


def _coordinate(index: int, dev: list[int]) -> list[int]:
    """MindSpore's device coordinate of a rank within its stage: the last axis varies fastest."""
    out = [0] * len(dev)
    for i in range(len(dev) - 1, -1, -1):
        out[i] = index % dev[i]
        index //= dev[i]
    return out


def _same_slice(a: int, b: int, dev: list[int], tmap: list[int]) -> bool:
    """Whether stage-local ranks a and b hold the same slice: equal on every device axis
    the tensor map splits by (map value k names axis len(dev)-1-k)."""
    ca, cb = _coordinate(a, dev), _coordinate(b, dev)
    return all(ca[len(dev) - 1 - k] == cb[len(dev) - 1 - k] for k in tmap if k >= 0)


def _parallel_config(r: int, cfg: dict, opt_sharded: bool) -> _Answer:
    dp, mp = cfg["data_parallel"], cfg["model_parallel"]
    per_stage = dp * mp
    base, local = (r // per_stage) * per_stage, r % per_stage
    role = tuple(base + d * mp + local % mp for d in range(dp))
    sharded = opt_sharded or bool(cfg.get("optimizer_shard"))
    return _Answer((r,) if sharded else role, role, "mindformers parallel_config", opt_sharded=sharded,
                   split=(mp, max(1, cfg.get("pipeline_stage") or 1)))


def _finish(ranks: list[int], answers: dict[int, _Answer], facts: dict[int, dict], source: str) -> JobLayout:
    replicas = _mutual({r: a.replicas or (r,) for r, a in answers.items()})
    roles = _mutual({r: a.roles or (r,) for r, a in answers.items()})
    by_note: dict[str, list[int]] = {}
    for r, a in answers.items():
        if a.note:
            by_note.setdefault(a.note, []).append(r)
    notes = tuple(f"{rank_span(rs)} {note}" for note, rs in by_note.items())
    opt_sharded = any(a.opt_sharded for a in answers.values())
    one = {replicas[r] for r in ranks} | {roles[r] for r in ranks}
    whole = len(one) == 1 and set(ranks) <= set(next(iter(one)))
    sources = sorted({a.source for a in answers.values() if a.source not in ("unknown", "default")})
    splits = {a.split for a in answers.values()}
    split = splits.pop() if len(splits) == 1 else None
    line = describe(replicas, roles, facts, whole, " + ".join(sources) or source, notes, opt_sharded, split)
    keys = {r: f["params"] for r, f in facts.items() if f.get("params")}
    alone = () if whole else tuple(sorted(r for r in answers if len(roles[r]) == 1))
    return JobLayout(replicas, roles, line, source, notes, whole, not opt_sharded, stage_keys=keys, uncompared=alone)


def _mutual(sets: dict[int, Ranks]) -> dict[int, Ranks]:
    """Keep x in r's set only if r is in x's too (ranks that disagree about each other are
    not compared), then give ranks whose sets still differ a set of their own."""
    out = {r: tuple(x for x in s if x == r or x not in sets or r in sets[x]) for r, s in sets.items()}
    return {r: s if all(out.get(x, s) == s for x in s) else (r,) for r, s in out.items()}


def describe(replicas: dict[int, Ranks], roles: dict[int, Ranks], facts: dict[int, dict], whole: bool,
             source: str, notes: tuple[str, ...] = (), opt_sharded: bool = False,
             split: tuple[int, int] | None = None) -> str:
    """What the terminal says, e.g. ``2 data-parallel replicas x 2 tensor-parallel shards;
    replicas {0,2} {1,3}``."""
    if not whole and notes and all(len(s) == 1 for s in roles.values()):
        return "not learned: " + "; ".join(notes[:3]) + "; no two ranks are compared"
    if whole:
        n = len(next(iter(replicas.values()), ()))
        text = f"{n} data-parallel replica{'s' if n != 1 else ''} (pure data parallel, from {source})"
    else:
        sets = sorted({s for s in roles.values()})
        sizes = sorted({len(s) for s in sets})
        degree = f"{sizes[0]} data-parallel replica{'s' if sizes[0] != 1 else ''}" if len(sizes) == 1 \
            else "data-parallel replicas of " + "/".join(map(str, sizes))
        text = f"{degree} x {_split_kind(sets, facts, split)}; "
        shown = sorted({s for s in replicas.values() if len(s) > 1}) or [s for s in sets if len(s) > 1]
        what = "replicas" if any(len(s) > 1 for s in replicas.values()) else "compared together"
        listed = " ".join("{" + ",".join(map(str, s)) + "}" for s in shown[:_SHOWN_SETS])
        more = f" (+{len(shown) - _SHOWN_SETS} more)" if len(shown) > _SHOWN_SETS else ""
        text += f"{what} {listed}{more}" if shown else "no two ranks are compared"
        text += f" (from {source})"
    if opt_sharded:
        text += "; weights and optimizer state are sharded over the data-parallel ranks (optimizer parallel): " \
                "they are not compared"
    if notes:
        text += "; not learned: " + "; ".join(notes[:3]) + (f" (+{len(notes) - 3} more)" if len(notes) > 3 else "")
    return text


def _split_kind(sets: list[Ranks], facts: dict[int, dict], split: tuple[int, int] | None = None) -> str:
    """How the model is split over the role sets: tensor-parallel shards hold the same
    parameters' pieces (same names), pipeline stages different parameters."""
    n = len(sets)
    if split is not None:
        tp, stages = split
    else:
        sigs = [{facts.get(r, {}).get("params") for r in s} for s in sets]
        if any(None in sig or len(sig) != 1 for sig in sigs):
            return f"{n} model shard{'s' if n != 1 else ''} (tensor or pipeline: the ranks did not say which)"
        stages = len({next(iter(sig)) for sig in sigs})
        tp = n // stages if stages and n % stages == 0 else None
    if stages == 1:
        return f"{n} tensor-parallel shards"
    if tp == 1:
        return f"{stages} pipeline stages"
    if tp:
        return f"{tp} tensor-parallel shards x {stages} pipeline stages"
    return f"{n} model shards over {stages} pipeline stages"


class LayoutBook:
    """Each job's facts as ranks send them, and the layout they make, derived again
    (version + 1) whenever a rank's facts change."""

    def __init__(self, groups: Any = "dp", spec: LayoutSpec | None = None) -> None:
        self.groups, self.spec = groups, spec
        self._jobs: dict[str, _Job] = {}
        self._layouts: dict[str, JobLayout] = {}
        self._version = 0

    def learn(self, job: str, rank: int, facts: dict[str, Any]) -> bool:
        """A rank's facts; True when they changed anything."""
        j = self._jobs.setdefault(job, _Job())
        j.ranks.add(rank)
        if j.facts.get(rank) == facts:
            return False
        j.facts[rank] = facts
        self._layouts.pop(job, None)
        return True

    def has_facts(self, job: str, rank: int) -> bool:
        j = self._jobs.get(job)
        return j is not None and rank in j.facts

    def note_rank(self, job: str, rank: int, world: int | None) -> None:
        j = self._jobs.setdefault(job, _Job())
        if rank not in j.ranks or (world and world != j.world):
            j.ranks.add(rank)
            j.world = max(j.world or 0, world or 0) or None
            self._layouts.pop(job, None)

    def layout(self, job: str, ranks: Iterable[int] = ()) -> JobLayout:
        """``ranks``: the job's members as the aligner has them (also those not yet heard from)."""
        j = self._jobs.setdefault(job, _Job())
        new = set(ranks) - j.ranks
        if new:
            j.ranks |= new
            self._layouts.pop(job, None)
        cached = self._layouts.get(job)
        if cached is None:
            self._version += 1
            got = derive(j.facts, j.ranks, j.world, self.groups, self.spec)
            cached = self._layouts[job] = JobLayout(**{**got.__dict__, "version": self._version})
        return cached

    def current(self, job: str) -> int:
        """The version of the job's layout as last derived; -1 when it must be derived again."""
        cached = self._layouts.get(job)
        return -1 if cached is None else cached.version

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)
        self._layouts.pop(job, None)

    def facts(self, job: str) -> dict[int, dict[str, Any]]:
        j = self._jobs.get(job)
        return dict(j.facts) if j is not None else {}
