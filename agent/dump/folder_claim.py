"""Keep two processes that claim the same rank from writing one dump folder.

DP inference workers (SGLang/vLLM style) all say rank 0; without a node agent to remap
them, each would write ``step{N}/rank0`` and the last one would win. The first live
process to claim ``rank{N}`` for a dump path keeps the name; the others fall back to
msProbe's ``proc{pid}``. A claim is a pid file in the temp dir (not in the dump, whose
layout stays exactly msProbe's); a claim whose process is gone is stale and taken over.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

from rankscope.wire.layout import dump_label


def claims_dir(dump_path: str | os.PathLike) -> str:
    key = hashlib.sha1(os.path.abspath(os.fspath(dump_path)).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "rankscope-claims", key)


def claim_rank_label(dump_path: str | os.PathLike, rank: int | None,
                     pid: int | None = None) -> tuple[str, int | None]:
    """(folder label to use, pid of the live process holding ``rank{N}`` or None)."""
    pid = os.getpid() if pid is None else pid
    label = dump_label(rank, pid)
    if rank is None:
        return label, None
    folder = claims_dir(dump_path)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{label}.pid")
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = _read_owner(path)
            if owner == pid:
                return label, None
            if owner is not None and alive(owner):
                return dump_label(None, pid), owner
            try:
                os.unlink(path)  # stale: its process has ended
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(str(pid))
        return label, None
    return label, None  # lost three races in a row: keep the rank name rather than stall


def release_rank_label(dump_path: str | os.PathLike, label: str, pid: int | None = None) -> None:
    """Drop our claim on ``label`` (the rank changed, e.g. the node agent remapped it)."""
    pid = os.getpid() if pid is None else pid
    path = os.path.join(claims_dir(dump_path), f"{label}.pid")
    if _read_owner(path) == pid:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _read_owner(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
