"""The rank map: which process got which rank id, in one format everywhere.

``{"format": FORMAT, "entries": [row, ...]}`` is the node agent's ``rank_map.json``
beside its bundles, every incident's ``rank_map.json``, the ``rank_map`` of
``incident.json`` and the ``rank_map.json`` of a bundle written on a dead rank's behalf.
Rows: ``job``, ``claimed_rank``, ``assigned_rank``, ``remapped``, ``host``, ``pid``,
``device_id``, ``dp_index``, ``local_rank``, ``world_size``, ``label`` (the dump folder
the assigned id names, e.g. ``rank2``), ``claimed_label`` (the folder the process had
before it was given its id, e.g. ``proc2764``), ``state``, ``last_step``,
``exit_status``, ``reason``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from rankscope.files.atomic import atomic_write_bytes

FORMAT = "rankscope-rank-map/1"


def rank_map_document(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"format": FORMAT, "entries": list(rows)}


def rank_map_entries(doc: Any) -> list[dict[str, Any]]:
    """The rows of a rank map document (a bare list, as incidents written before the
    document was shared, is read too)."""
    if isinstance(doc, dict):
        doc = doc.get("entries")
    return [r for r in doc or [] if isinstance(r, dict)] if isinstance(doc, list) else []


def write_rank_map(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(rank_map_document(rows), indent=1).encode("utf-8"))
    return path
