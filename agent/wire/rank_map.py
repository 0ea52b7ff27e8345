"""``rank_map.json``: which process got which rank id, in one format everywhere.

The node agent writes one per job beside its bundles; every incident holds the job-wide
one. Rows: ``claimed_rank``, ``assigned_rank``, ``remapped``, ``host``, ``pid``,
``device_id``, ``dp_index``, ``local_rank``, ``world_size``, ``label``, ``state``,
``last_step``, ``exit_status``, ``reason``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from rankscope.wire.atomic import atomic_write_bytes

FORMAT = "rankscope-rank-map/1"


def rank_map_document(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"format": FORMAT, "entries": list(rows)}


def write_rank_map(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(rank_map_document(rows), indent=1).encode("utf-8"))
    return path
