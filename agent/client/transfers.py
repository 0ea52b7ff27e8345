"""File transfers a rank makes on request: its RDR bundle (export) and its local dump (collect).

Each runs on a short-lived thread of its own and puts ``("chunk", body)`` /
``("status", body)`` items on the client's bounded outbox; the client's I/O thread sends
them (it owns the socket). Blocking on a full outbox here is fine: this is not the
training thread. Chunk bodies come from :func:`rankscope.rdr.transfer.iter_file_chunks`.
"""
from __future__ import annotations

import logging
import queue
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from rankscope.wire.layout import (
    bundle_root_of,
    graph_rank_dir,
    graph_step_of_dir,
    rank_from_wire,
    safe_id,
    step_of_dir,
)

log = logging.getLogger(__name__)

_PUT_TIMEOUT_S = 120.0
#: Bundles written only to be sent live in folders named so under the temp dir: once
#: their chunks are queued the folder goes (the incident folder is the one copy kept).
SCRATCH_PREFIX = "rankscope-export-"


def export_scratch(incident: str | None) -> Path:
    """A private folder for a bundle that is written only to be sent."""
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{safe_id(str(incident or 'export'))}-"))


def _discard_scratch(paths: list[Path]) -> None:
    tmp = Path(tempfile.gettempdir()).resolve()
    for folder in {p.resolve().parents[i] for p in paths for i in range(len(p.resolve().parents))}:
        if folder.name.startswith(SCRATCH_PREFIX) and folder.parent == tmp:
            shutil.rmtree(folder, ignore_errors=True)


def run_export(out: queue.Queue, on_export: Callable[[str | None], Iterable[Path]] | None,
               incident: str | None, transfer: str, rank: int) -> None:
    """Send the bundle ``on_export`` writes; without one (or when it fails) say so with a
    STATUS ``export_none`` so the node agent sends what it recorded of this rank instead."""
    from rankscope.rdr.transfer import iter_file_chunks

    error = ""
    paths: list[Path] = []
    if rank_from_wire(rank) is None:
        # No id yet: the bundle would have no rank_<id> folder to land in.
        error = "this process has no rank id yet"
    elif on_export is not None:
        try:
            paths = [Path(p) for p in (on_export(incident) or [])]
        except Exception as exc:  # the export must not take the rank down
            error = f"on_export failed: {exc!r}"[:500]
    try:
        if paths:
            for p in paths:
                for body in iter_file_chunks([p], bundle_root_of(p), rank, safe_id(transfer)):
                    out.put(("chunk", body), timeout=_PUT_TIMEOUT_S)
            return
    except Exception as exc:
        error = f"sending the bundle failed: {exc!r}"[:500]
    finally:
        _discard_scratch(paths)
    out.put(("status", {"what": "export_none", "detail": {
        "incident": incident, "transfer": transfer, "rank": rank, "error": error}}), timeout=_PUT_TIMEOUT_S)


def step_selected(step: int, steps: str | None) -> bool:
    """``steps`` like ``"3"``, ``"2-5"``, ``"1,4-6"``; None selects every step."""
    if not steps:
        return True
    for part in steps.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            if int(lo) <= step <= int(hi or lo):
                return True
        except ValueError:
            return False
    return False


def dump_files(dump_path: Path, label: str, steps: str | None) -> list[Path]:
    """This rank's files of an msProbe-layout dump: ``step{N}/{label}/**``."""
    files: list[Path] = []
    if not dump_path.is_dir():
        return files
    for d in sorted(dump_path.iterdir()):
        step = step_of_dir(d.name)
        if step is not None and step_selected(step, steps) and (d / label).is_dir():
            files += sorted(f for f in (d / label).rglob("*") if f.is_file() and not f.name.startswith("."))
    graph = dump_path / graph_rank_dir(label)  # compiled steps' kernels: rank_{ID}/{ts}/step_{N}/
    for d in sorted(graph.glob("*/step_*")) if graph.is_dir() else ():
        step = graph_step_of_dir(d.name)
        if step is not None and step_selected(step, steps):
            files += sorted(f for f in d.rglob("*") if f.is_file() and not f.name.startswith("."))
    return files


def run_collect(out: queue.Queue, dump_path: str | None, label: str, rank: int, args: dict) -> None:
    """Stream this rank's dump files (paths relative to dump_path), then ``collect_done``."""
    from rankscope.rdr.transfer import iter_file_chunks

    transfer = str(args.get("transfer") or "collect")
    ranks = args.get("ranks")
    if isinstance(ranks, list) and ranks and rank not in ranks:
        return  # not asked for
    detail: dict = {"rank": rank, "transfer": transfer, "files": 0}
    try:
        if not dump_path:
            raise ValueError("this rank has no local dump_path")
        root = Path(dump_path)
        files = dump_files(root, label, args.get("steps"))
        resume = args.get("resume") if isinstance(args.get("resume"), dict) else None
        for body in iter_file_chunks(files, root, rank, transfer, resume=resume):
            out.put(("chunk", body), timeout=_PUT_TIMEOUT_S)
        detail["files"] = len(files)
    except Exception as exc:
        log.warning("rankscope collect failed on rank %s: %s", rank, exc)
        detail["error"] = str(exc)[:500]
    out.put(("status", {"what": "collect_done", "detail": detail}), timeout=_PUT_TIMEOUT_S)
