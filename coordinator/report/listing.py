"""Past incidents of an export folder, read from disk: no coordinator needed.

An incident whose incident.json was never written (the coordinator stopped mid-export)
is still listed from its state.json, marked as such, so nothing recorded is hidden.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankscope.coordinator.report.fmt import when
from rankscope.wire.layout import incidents_root


@dataclass
class IncidentEntry:
    incident_id: str
    dir: Path
    detector: str | None
    rank: Any
    step: Any
    tensor: str | None
    detected_at: str | None
    state: str | None
    written: bool  # incident.json exists (else only state.json)
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"incident_id": self.incident_id, "dir": str(self.dir), "detector": self.detector,
                "first_diverging_rank": self.rank, "step": self.step, "tensor": self.tensor,
                "detected_at": self.detected_at, "state": self.state, "written": self.written,
                "report": str(self.dir / "report.html") if (self.dir / "report.html").is_file() else None,
                "problem": self.problem}


def incident_dirs(path: Path) -> list[Path]:
    """``path`` itself if it is an incident folder, else every incident under it (an
    export folder or its incidents/ folder), oldest first by id."""
    path = Path(path)
    if (path / "incident.json").is_file() or (path / "state.json").is_file():
        return [path]
    root = incidents_root(path) if incidents_root(path).is_dir() else path
    found = {p.parent for p in root.glob("*/incident.json")} | {p.parent for p in root.glob("*/state.json")}
    return sorted(found, key=lambda p: p.name)


def read_entry(d: Path) -> IncidentEntry:
    inc = d / "incident.json"
    try:
        if inc.is_file():
            doc = json.loads(inc.read_text(encoding="utf-8"))
            return IncidentEntry(doc.get("incident_id", d.name), d, doc.get("detector"),
                                 doc.get("first_diverging_rank"), doc.get("step"), doc.get("tensor"),
                                 when(doc.get("detected_at")), _latest_state(d) or doc.get("state"), True)
        st = json.loads((d / "state.json").read_text(encoding="utf-8"))
        v = st.get("verdict") or {}
        return IncidentEntry(st.get("incident_id", d.name), d, v.get("detector"), v.get("rank"), v.get("step"),
                             v.get("tensor"), when(st.get("detected_at")), st.get("state"), False)
    except (OSError, ValueError, AttributeError) as exc:
        return IncidentEntry(d.name, d, None, None, None, None, None, None, False, problem=f"unreadable: {exc}")


def _latest_state(d: Path) -> str | None:
    """incident.json is written before the incident's last move; state.json has it."""
    try:
        return json.loads((d / "state.json").read_text(encoding="utf-8")).get("state")
    except (OSError, ValueError, AttributeError):
        return None


def list_incidents(path: Path) -> list[IncidentEntry]:
    return [read_entry(d) for d in incident_dirs(path)]


def find_incident(path: Path, wanted: str) -> IncidentEntry:
    """The incident whose id is ``wanted``, or the only one whose id contains it."""
    entries = list_incidents(path)
    exact = [e for e in entries if e.incident_id == wanted or e.dir.name == wanted]
    if exact:
        return exact[0]
    hits = [e for e in entries if wanted in e.incident_id]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise LookupError(f"no incident matching {wanted!r} under {path} "
                          f"({len(entries)} incident(s): rankscope incidents {path})")
    raise LookupError(f"{wanted!r} matches {len(hits)} incidents: " + ", ".join(e.incident_id for e in hits[:10]))
