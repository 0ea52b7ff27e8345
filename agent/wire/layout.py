"""One spelling for every rank id and every path that crosses a process.

- Rank ids: in Python an unknown rank is ``None``; on the wire, whose fields are
  integers, it is :data:`NO_RANK`. Convert only with :func:`rank_to_wire` and
  :func:`rank_from_wire`, so "unknown" never turns into rank 0.
- msProbe's dump layout: ``dump_path/step{N}/rank{ID}/`` (``proc{pid}`` while the rank
  is unknown), read by msProbe's own tools.
- msProbe's static-graph L2 layout (kernel tensors of compiled steps):
  ``dump_path/rank_{ID}/{timestamp}/step_{N}/`` (``proc{pid}`` while the rank is unknown).
- Bundles: ``<root>/rank_<id>/rdr/`` (RDR's layout, seeds/000); an incident holds one per
  rank: ``EXPORT_DIR/incidents/<incident_id>/rank_<id>/``.
- Transfer ids and job folders: only ``[A-Za-z0-9_.-]``.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

#: The wire's "this process has no rank id (yet)".
NO_RANK = -1

INCIDENTS_DIR = "incidents"
_STEP_DIR = re.compile(r"^step(\d+)$")
_GRAPH_STEP_DIR = re.compile(r"^step_(\d+)$")
_BUNDLE_DIR = re.compile(r"^rank_(\d+)$")
_SAFE_LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def rank_to_wire(rank: int | None) -> int:
    return NO_RANK if rank is None else int(rank)


def rank_from_wire(value: int | None) -> int | None:
    return None if value is None or value < 0 else int(value)


# --- msProbe's dump layout -------------------------------------------------------------
def dump_label(rank: int | None, pid: int | None = None) -> str:
    """Dump folder name: ``rank3`` for a known rank, ``proc1234`` otherwise."""
    if rank is not None:
        return f"rank{rank}"
    return f"proc{os.getpid() if pid is None else pid}"


def step_dir_name(step: int) -> str:
    return f"step{step}"


def step_of_dir(name: str) -> int | None:
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def graph_rank_dir(label: str) -> str:
    """The static-graph L2 rank folder for a dump label: ``rank3`` -> ``rank_3``."""
    return f"rank_{label[4:]}" if label.startswith("rank") and label[4:].isdigit() else label


def graph_step_dir(label: str, timestamp: str, step: int) -> str:
    """``rank_{ID}/{timestamp}/step_{N}`` relative to dump_path."""
    return f"{graph_rank_dir(label)}/{timestamp}/step_{step}"


def graph_step_of_dir(name: str) -> int | None:
    m = _GRAPH_STEP_DIR.match(name)
    return int(m.group(1)) if m else None


# --- bundles and incidents -------------------------------------------------------------
def bundle_dir_name(rank: int | str) -> str:
    """``3`` / ``"3"`` / ``"rank3"`` -> ``rank_3``; ``"proc1234"`` -> ``rank_proc1234``."""
    if isinstance(rank, int) and not isinstance(rank, bool):
        if rank < 0:
            raise ValueError(f"rank: expected a non-negative id, got {rank!r}")
        return f"rank_{rank}"
    text = str(rank)
    m = re.fullmatch(r"(?:rank_?)?(\d+)", text)
    if m:
        return f"rank_{int(m.group(1))}"
    if not _SAFE_LABEL.fullmatch(text):
        raise ValueError(f"rank: {rank!r} is not a rank id or a safe label")
    return f"rank_{text}"


def rank_of_bundle_dir(name: str) -> int | None:
    m = _BUNDLE_DIR.match(name)
    return int(m.group(1)) if m else None


def bundle_dirs(folder: str | os.PathLike) -> list[tuple[str, Path]]:
    """The ``rank_<id>`` folders under an incident (or bundle root), as (id or label, path)."""
    return [(p.name[len("rank_"):], p) for p in sorted(Path(folder).glob("rank_*")) if p.is_dir()]


def bundle_root_of(path: Path) -> Path:
    """The ``rank_<id>`` folder a bundle file sits in (what wire paths are relative to)."""
    for parent in path.parents:
        if parent.name.startswith("rank_"):
            return parent
    return path.parent


def incidents_root(export_dir: str | os.PathLike) -> Path:
    return Path(export_dir) / INCIDENTS_DIR


def incident_dir(export_dir: str | os.PathLike, incident_id: str) -> Path:
    return incidents_root(export_dir) / incident_id


def incident_rank_dir(incident: str | os.PathLike, rank: int) -> Path:
    """A rank's bundle inside an incident folder."""
    return Path(incident) / bundle_dir_name(rank)


def safe_id(text: str, default: str = "export") -> str:
    """A transfer id or folder name the receiver accepts (letters, digits, ``_.-``)."""
    safe = _UNSAFE.sub("_", text)[:120] or default
    return safe if safe[0].isalnum() or safe[0] == "_" else "_" + safe[1:]


def position_file(job: str, pid: int) -> str:
    """Where a rank keeps its current (step, token) for its node agent to read after a
    crash (:mod:`rankscope.wire.position`); local to the rank's host."""
    import tempfile
    return os.path.join(tempfile.gettempdir(), "rankscope-position", safe_id(job), f"{pid}.pos")
