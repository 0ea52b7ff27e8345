"""What a rank tells the coordinator about the job's parallel layout (STATUS ``layout``).

A rank reports only what it saw itself; the coordinator puts every rank's facts together
(:mod:`rankscope.coordinator.logic.job.layout`). The detail is ``{"rank": <id>, "facts": {...}}``
with these facts, every one optional:

- ``mindspore_rank`` / ``world``: the rank and world size MindSpore gave this process;
  ``world_group``: the name of its world group.
- ``groups``: {name: [world ranks]} of every communication group the process made.
- ``reducers``: the groups its gradient reducers (``nn.DistributedGradReducer``) reduce
  over; ``collectives``: [[op, group], ...] the collectives its own code calls.
- ``context``: MindSpore's auto-parallel context: ``parallel_mode``, ``device_num``,
  ``pipeline_stages``, ``parallel_optimizer``.
- ``param_layouts``: under semi/auto parallel, the distinct parameter layouts MindSpore
  gave the trained network: [[device_matrix, tensor_map, optimizer_sharded, count], ...].
- ``parallel_config``: mindformers' ``data_parallel``, ``model_parallel``,
  ``pipeline_stage``, ``optimizer_shard``.
- ``params``: a short signature of the trained parameters' names and shapes (equal on the
  tensor-parallel shards of one stage, different between stages).
- ``unread``: what the rank tried to read and could not, in words.

Every size is bounded and every field type-checked: a rank's facts are input.
"""
from __future__ import annotations

from typing import Any

from rankscope.wire.errors import ProtocolError

MAX_GROUPS = 256
MAX_GROUP_RANKS = 1 << 17
MAX_ITEMS = 64
MAX_TEXT = 200
WHAT = "layout"

_CONTEXT = {"parallel_mode": str, "device_num": int, "pipeline_stages": int, "parallel_optimizer": bool}
_CONFIG = {"data_parallel": int, "model_parallel": int, "pipeline_stage": int, "optimizer_shard": bool}
_FIELDS = frozenset({"mindspore_rank", "world", "world_group", "groups", "reducers", "collectives", "context",
                     "param_layouts", "parallel_config", "params", "unread"})


def _bad(field: str, why: str) -> ProtocolError:
    return ProtocolError("bad_field", f"status.layout.facts.{field}: {why}")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _text(field: str, v: Any) -> str:
    if not isinstance(v, str) or not v or len(v) > MAX_TEXT:
        raise _bad(field, f"expected a non-empty string of at most {MAX_TEXT} characters")
    return v


def _ranks(field: str, v: Any) -> list[int]:
    if not isinstance(v, list) or not v or len(v) > MAX_GROUP_RANKS or not all(_int(r) and r >= 0 for r in v):
        raise _bad(field, "expected a non-empty list of rank ids >= 0")
    return [int(r) for r in v]


def _typed_map(field: str, v: Any, spec: dict[str, type]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _bad(field, "expected a map")
    out = {}
    for key, val in v.items():
        typ = spec.get(key)
        if typ is None:
            raise _bad(f"{field}.{key!s:.40}", "not a known field")
        if val is None:
            continue
        ok = isinstance(val, bool) if typ is bool else (_int(val) if typ is int else isinstance(val, typ))
        if not ok or (typ is str and len(val) > MAX_TEXT):
            raise _bad(f"{field}.{key}", f"expected {typ.__name__}")
        out[key] = val
    return out


def _layout_row(i: int, row: Any) -> list:
    field = f"param_layouts[{i}]"
    if not isinstance(row, list) or len(row) != 4:
        raise _bad(field, "expected [device_matrix, tensor_map, optimizer_sharded, count]")
    dev, tmap, sharded, count = row
    if not isinstance(dev, list) or not 0 < len(dev) <= 16 or not all(_int(d) and d >= 1 for d in dev):
        raise _bad(field, "device_matrix: expected a list of 1 to 16 integers >= 1")
    if not isinstance(tmap, list) or len(tmap) > 16 or not all(_int(t) and -1 <= t < len(dev) for t in tmap):
        raise _bad(field, "tensor_map: expected integers from -1 to len(device_matrix) - 1")
    if not isinstance(sharded, bool) or not _int(count) or count < 1:
        raise _bad(field, "optimizer_sharded must be true/false and count an integer >= 1")
    return [list(dev), list(tmap), sharded, int(count)]


def check_facts(facts: Any) -> dict[str, Any]:
    """The facts, validated (ProtocolError naming the first bad field otherwise)."""
    if not isinstance(facts, dict):
        raise _bad("", "expected a map")
    out: dict[str, Any] = {}
    for key, val in facts.items():
        if key not in _FIELDS:
            raise _bad(f"{key!s:.40}", "not a known field")
        if val is None:
            continue
        if key in ("mindspore_rank", "world"):
            if not _int(val) or val < 0:
                raise _bad(key, "expected an integer >= 0")
            out[key] = int(val)
        elif key in ("world_group", "params"):
            out[key] = _text(key, val)
        elif key == "groups":
            if not isinstance(val, dict) or len(val) > MAX_GROUPS:
                raise _bad(key, f"expected a map of at most {MAX_GROUPS} groups")
            out[key] = {_text(f"{key} name", name): _ranks(f"{key}.{name}", ranks) for name, ranks in val.items()}
        elif key in ("reducers", "unread"):
            if not isinstance(val, list) or len(val) > MAX_ITEMS:
                raise _bad(key, f"expected a list of at most {MAX_ITEMS} strings")
            out[key] = [_text(key, g) for g in val]
        elif key == "collectives":
            if not isinstance(val, list) or len(val) > MAX_ITEMS or not all(
                    isinstance(p, list) and len(p) == 2 for p in val):
                raise _bad(key, f"expected at most {MAX_ITEMS} [op, group] pairs")
            out[key] = [[_text(key, op), _text(key, group)] for op, group in val]
        elif key == "context":
            out[key] = _typed_map(key, val, _CONTEXT)
        elif key == "parallel_config":
            out[key] = _typed_map(key, val, _CONFIG)
        elif key == "param_layouts":
            if not isinstance(val, list) or len(val) > MAX_ITEMS:
                raise _bad(key, f"expected a list of at most {MAX_ITEMS} layouts")
            out[key] = [_layout_row(i, row) for i, row in enumerate(val)]
    return out


def check_detail(detail: Any) -> tuple[int, dict[str, Any]]:
    """(rank, facts) of a STATUS ``layout`` detail."""
    if not isinstance(detail, dict) or set(detail) != {"rank", "facts"}:
        raise ProtocolError("bad_field", "status.layout needs a detail of exactly {rank, facts}")
    rank = detail["rank"]
    if not _int(rank) or rank < 0:
        raise ProtocolError("bad_field", "status.layout.rank: expected a rank id >= 0")
    return int(rank), check_facts(detail["facts"])
