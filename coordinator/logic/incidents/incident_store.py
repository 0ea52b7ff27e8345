"""Incidents on disk: ``incident.json`` (the contract) and ``state.json`` (for restarts).

``EXPORT_DIR/incidents/<incident_id>/state.json`` is rewritten atomically at every
transition, so a coordinator restarted with the same export dir picks up its
incidents where they were (:meth:`IncidentStore.load_all`). ``incident.json`` is the
user-facing summary DESIGN.md promises; it is written once the bundles are in.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Mapping

from rankscope.coordinator.logic.incidents.incident import Incident
from rankscope.coordinator.logic.verdict import JOB_WIDE
from rankscope.files.atomic import atomic_write_bytes
from rankscope.wire.layout import incident_dir, incidents_root
from rankscope.wire.rank_map import rank_map_document

log = logging.getLogger(__name__)


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/Inf become strings, NumPy scalars plain numbers, keys strings."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def _atomic_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Strict JSON (browsers and jq reject NaN): whatever a detector put in evidence.
    text = json.dumps(_clean(obj), indent=2, sort_keys=False, allow_nan=False, default=str)
    atomic_write_bytes(path, text.encode("utf-8"), fsync=True)


def iso(epoch: float) -> str:
    return _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc).isoformat(timespec="milliseconds")


def timeline(incident: Incident) -> list[dict[str, Any]]:
    """Incident.history (event, new state, wall time) as ``[{event, state, at}]``."""
    return [{"event": event, "state": state, "at": iso(wall)} for event, state, wall in incident.history]


def incident_document(incident: Incident, ranks: Mapping[int, Mapping[str, Any]] | None = None,
                      bundles: Mapping[int, str] | None = None, rank_map: list[dict[str, Any]] | None = None,
                      export_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """The incident as users read it: ``incident.json``, ``rankscope status`` and the
    verdict launch prints are all this one document. ``ranks``/``bundles`` default to
    the incident's."""
    v = incident.verdict
    ranks = dict(incident.ranks if ranks is None else ranks)
    bundles = dict(incident.bundles if bundles is None else bundles)
    doc = {
        "incident_id": incident.incident_id,
        "detector": v.detector,
        # None when the ranks that disagree cannot be told apart: never a guess.
        "first_diverging_rank": v.rank if v.decided else None,
        "ties": v.ties if v.decided else [],
        "decided": v.decided,
        "undecided_between": [] if v.decided or JOB_WIDE in v.evidence else v.candidates,
        "step": v.step,
        "token": v.token,
        "tensor": v.tensor,
        "kind": v.kind,
        "exec_index": v.exec_index,
        "group": v.group,
        "job": incident.job,
        "detected_at": iso(incident.detected_at),
        "detected_at_epoch": incident.detected_at,
        "evidence": v.evidence,
        "summary": v.summary(),
        "policy": incident.policy.value,
        "state": incident.state.value,
        "ranks": {str(r): dict(info) for r, info in sorted(ranks.items())},
        "bundles": {str(r): str(p) for r, p in sorted(bundles.items())},
        "missing_bundles": sorted(int(r) for r in ranks if r not in bundles),
        "rank_map": rank_map_document(rank_map or []),
        "related_verdicts": incident.related,
        # detected -> paused -> exported -> written -> resumed/terminated, as it happened.
        "timeline": timeline(incident),
        "cut": incident.cut,
    }
    if export_dir is not None:
        doc["dir"] = str(incident_dir(export_dir, incident.incident_id))
        doc["incident_json"] = incident.incident_json
    return doc


def write_incident(export_dir: str | os.PathLike, incident: Incident,
                   ranks: Mapping[int, Mapping[str, Any]] | None = None,
                   bundles: Mapping[int, str] | None = None,
                   rank_map: list[dict[str, Any]] | None = None) -> Path:
    """Write ``incidents/<id>/incident.json``."""
    path = incident_dir(export_dir, incident.incident_id) / "incident.json"
    _atomic_json(path, incident_document(incident, ranks, bundles, rank_map))
    return path


class IncidentStore:
    """Persists incident state under an export dir; without one it keeps nothing."""

    def __init__(self, export_dir: str | os.PathLike | None) -> None:
        self.export_dir = Path(export_dir) if export_dir is not None else None

    def save(self, incident: Incident) -> None:
        if self.export_dir is None:
            return
        _atomic_json(incident_dir(self.export_dir, incident.incident_id) / "state.json", incident.to_dict())

    def load_all(self) -> list[Incident]:
        if self.export_dir is None:
            return []
        out = []
        for path in sorted(incidents_root(self.export_dir).glob("*/state.json")):
            try:
                out.append(Incident.from_dict(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                # One damaged file must not stop the coordinator from starting.
                log.error("ignoring unreadable incident state %s: %s", path, exc)
        out.sort(key=lambda i: i.detected_at)
        return out
