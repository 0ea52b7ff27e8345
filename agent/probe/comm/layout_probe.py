"""What this rank can see of the job's parallel layout, said to the coordinator once.

The coordinator learns who holds the same weights as whom from every rank's facts
(:mod:`rankscope.wire.layout_facts`): the communication groups the process made
(``create_group`` is patched while a debugger is attached), the group each gradient
reducer reduces over and each collective runs in (the sentinels and the collective hooks
note them here), MindSpore's auto-parallel context with the parameter layouts of a
semi/auto-parallel network, and mindformers' ``parallel_config``. Facts are process-wide
(groups are), collected here whichever debugger is attached; nothing is read from
MindSpore until a step ends, and nothing here ever raises into training.
"""
from __future__ import annotations

import gc
import hashlib
import sys
import threading
from typing import Any, Iterable

from rankscope.wire.layout_facts import MAX_GROUPS, MAX_ITEMS, check_facts

_lock = threading.Lock()
_groups: dict[str, list[int]] = {}
_reducers: set[str] = set()
_collectives: set[tuple[str, str]] = set()
_version = [0]
_patches: list[tuple[Any, str, Any]] = []
#: mindformers' parallel-config classes, whose instances carry the job's degrees.
_CONFIG_CLASSES = ("TransformerOpParallelConfig", "ParallelConfig")


def _bump() -> None:
    _version[0] += 1


def note_group(name: Any, ranks: Any) -> None:
    try:
        members = sorted(int(r) for r in ranks)
    except (TypeError, ValueError):
        return
    with _lock:
        if isinstance(name, str) and name and _groups.get(name) != members and len(_groups) < MAX_GROUPS:
            _groups[name] = members
            _bump()


def note_reducer(group: Any) -> None:
    if isinstance(group, str) and group:
        with _lock:
            if group not in _reducers and len(_reducers) < MAX_ITEMS:
                _reducers.add(group)
                _bump()


def note_trained() -> None:
    """The parameters this rank trains changed (an optimizer was stepped the first time)."""
    with _lock:
        _bump()


def note_collective(op: str, group: Any) -> None:
    if isinstance(group, str) and group:
        with _lock:
            if (op, group) not in _collectives and len(_collectives) < MAX_ITEMS:
                _collectives.add((op, group))
                _bump()


_WORLD_NAMES = frozenset({"hccl_world_group", "nccl_world_group", "mccl_world_group"})


def user_collectives() -> set[tuple[str, str]]:
    """(op, group) of the collectives the script's own code made or called."""
    with _lock:
        return set(_collectives)


def collectives_in_own_groups() -> bool:
    """Whether the script runs collectives in groups it made (tensor or pipeline
    parallelism); a world-group AllReduce (a loss averaged for a log line) is not that."""
    with _lock:
        return any(group not in _WORLD_NAMES for _, group in _collectives)


def install() -> None:
    """Patch ``create_group`` where scripts import it from (once per process; it stays: it
    only notes a group's members, after MindSpore made the group)."""
    if _patches:
        return
    try:
        from mindspore.communication import management
    except Exception:  # noqa: BLE001 - no MindSpore communication here: nothing to learn
        return
    import mindspore.communication as comm
    orig = management.create_group

    def create_group(group, rank_ids, *args, **kwargs):  # noqa: ANN001
        out = orig(group, rank_ids, *args, **kwargs)
        note_group(group, rank_ids)  # after: a group MindSpore refused is no group
        return out

    create_group.__wrapped__ = orig  # type: ignore[attr-defined]
    for owner in (management, comm):
        if getattr(owner, "create_group", None) is orig:
            _patches.append((owner, "create_group", orig))
            setattr(owner, "create_group", create_group)


def uninstall() -> None:
    for owner, attr, orig in reversed(_patches):
        setattr(owner, attr, orig)
    _patches.clear()


class LayoutProbe:
    """Builds this rank's facts; :meth:`due` says when they are worth sending again."""

    def __init__(self) -> None:
        self._built_at = -1
        self._mf_config: dict | None = None
        self._mf_looked = False

    def due(self) -> bool:
        return self._built_at != _version[0]

    def facts(self, cells: Iterable[Any] = (), params: Iterable[str] = ()) -> dict[str, Any]:
        """The facts now (validated, bounded); ``cells``: the trained network(s), for their
        semi/auto-parallel parameter layouts; ``params``: the trained parameters' names and
        shapes (what stage of the model this rank holds)."""
        self._built_at = _version[0]
        out: dict[str, Any] = {}
        unread: list[str] = []
        for what, fn in (("world", self._world), ("groups", self._groups), ("context", self._context),
                         ("parallel_config", self._parallel_config)):
            try:
                out.update(fn())
            except Exception as exc:  # noqa: BLE001 - a fact not read is said, never raised
                unread.append(f"{what}: {type(exc).__name__}: {str(exc)[:80]}")
        if (out.get("context") or {}).get("parallel_mode") in ("semi_auto_parallel", "auto_parallel"):
            try:
                layouts = param_layouts(cells)
                if layouts:
                    out["param_layouts"] = layouts
            except Exception as exc:  # noqa: BLE001
                unread.append(f"param_layouts: {type(exc).__name__}")
        names = sorted(set(params))
        if names:
            out["params"] = hashlib.sha1("\n".join(names).encode()).hexdigest()[:16]
        if unread:
            out["unread"] = [u[:200] for u in unread[:MAX_ITEMS]]
        return check_facts(out)

    @staticmethod
    def _world() -> dict[str, Any]:
        from mindspore.communication import GlobalComm
        if not getattr(GlobalComm, "INITED", False):
            return {}
        from mindspore.communication import get_group_size, get_rank
        return {"mindspore_rank": int(get_rank()), "world": int(get_group_size()),
                "world_group": str(GlobalComm.WORLD_COMM_GROUP)}

    @staticmethod
    def _groups() -> dict[str, Any]:
        with _lock:
            out: dict[str, Any] = {}
            if _groups:
                out["groups"] = {k: list(v) for k, v in _groups.items()}
            if _reducers:
                out["reducers"] = sorted(_reducers)
            if _collectives:
                out["collectives"] = [list(p) for p in sorted(_collectives)]
        # Groups made before this process was watched (a debugger built after them) are
        # known by name only: MindSpore says who is in them.
        named = set(out.get("reducers", ())) | {g for _, g in out.get("collectives", ())}
        for name in sorted(named - set(out.get("groups", {})) - _WORLD_NAMES)[:MAX_GROUPS]:
            members = _members_of(name)
            if members:
                out.setdefault("groups", {})[name] = members
        return out

    @staticmethod
    def _context() -> dict[str, Any]:
        import mindspore as ms
        get = ms.get_auto_parallel_context
        ctx = {"parallel_mode": str(get("parallel_mode")), "device_num": int(get("device_num") or 0) or None,
               "pipeline_stages": int(get("pipeline_stages") or 1),
               "parallel_optimizer": bool(get("enable_parallel_optimizer"))}
        return {"context": {k: v for k, v in ctx.items() if v is not None}}

    def _parallel_config(self) -> dict[str, Any]:
        if "mindformers" not in sys.modules:
            return {}
        if not self._mf_looked:  # one scan of live objects: the config is made once, up front
            self._mf_looked = True
            self._mf_config = find_parallel_config(gc.get_objects())
        return {"parallel_config": self._mf_config} if self._mf_config else {}


def _members_of(group: str) -> list[int] | None:
    try:
        from mindspore.communication import GlobalComm
        if not getattr(GlobalComm, "INITED", False) or group == GlobalComm.WORLD_COMM_GROUP:
            return None
        from mindspore.communication.management import get_process_group_ranks
        return sorted(int(r) for r in get_process_group_ranks(group))
    except Exception:  # noqa: BLE001 - an unknown group stays unknown
        return None


def find_parallel_config(objects: Iterable[Any]) -> dict[str, Any] | None:
    """mindformers' degrees, read off the first parallel-config object found."""
    for obj in objects:
        try:
            if type(obj).__name__ not in _CONFIG_CLASSES or not hasattr(obj, "data_parallel"):
                continue
            out = {k: int(getattr(obj, k)) for k in ("data_parallel", "model_parallel", "pipeline_stage")
                   if isinstance(getattr(obj, k, None), int)}
            shard = getattr(obj, "optimizer_shard", None)
            if isinstance(shard, bool):
                out["optimizer_shard"] = shard
            if out.get("data_parallel"):
                return out
        except Exception:  # noqa: BLE001 - a proxy or half-built object met in the scan
            continue
    return None


def param_layouts(cells: Iterable[Any]) -> list[list]:
    """The distinct (device matrix, tensor map, optimizer-sharded) layouts MindSpore gave
    the networks' parameters under semi/auto parallel, with how many parameters have each.
    ``parameter_layout_dict`` rows are ``[dev_matrix, tensor_map, slice_shape, field_size,
    uniform_split, opt_shard_group, ...]``."""
    counts: dict[tuple, int] = {}
    for cell in cells:
        layout = getattr(cell, "parameter_layout_dict", None) or {}
        for row in layout.values():
            try:
                dev, tmap = [int(d) for d in row[0]], [int(t) for t in row[1]]
                sharded = bool(row[5]) if len(row) > 5 else False
            except (TypeError, ValueError, IndexError):
                continue
            key = (tuple(dev), tuple(tmap), sharded)
            counts[key] = counts.get(key, 0) + 1
    rows = sorted(counts.items(), key=lambda kv: -kv[1])[:MAX_ITEMS]
    return [[list(dev), list(tmap), sharded, n] for (dev, tmap, sharded), n in rows]
