"""Keep two processes that claim the same rank from writing one dump folder.

DP inference workers (SGLang/vLLM style) all say rank 0; without a node agent to remap
them, each would write ``step{N}/rank0`` and the last one would win. The first live
process to claim ``rank{N}`` for a dump path keeps the name; the others fall back to
msProbe's ``proc{pid}``. A claim is an exclusive ``flock`` on a file in the temp dir (not
in the dump, whose layout stays exactly msProbe's), held for as long as the process
lives. The kernel drops it when the process ends, however it ends, so a dead holder never
blocks a later claim and there is no stale-file takeover to race on. The file holds the
holder's pid only so a loser can say who holds the name.

Claim files are never unlinked: a process may have opened the file and be about to lock
it, and unlinking would let a third process lock a fresh file of the same name.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import threading
import time

from rankscope.wire.layout import dump_label

# path -> (pid that locked it, fd). The pid tells a forked child, which inherits the dict
# and the fd, that the claim is its parent's, not its own.
_held: dict[str, tuple[int, int]] = {}
_lock = threading.Lock()
UNKNOWN_HOLDER = -1


def claims_dir(dump_path: str | os.PathLike) -> str:
    key = hashlib.sha1(os.path.abspath(os.fspath(dump_path)).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "rankscope-claims", key)


def claim_path(dump_path: str | os.PathLike, label: str) -> str:
    return os.path.join(claims_dir(dump_path), f"{label}.pid")


def claim_rank_label(dump_path: str | os.PathLike, rank: int | None) -> tuple[str, int | None]:
    """(folder label to use, pid of the live process holding ``rank{N}`` or None).

    The holder is ``UNKNOWN_HOLDER`` when it locked the name but has not written its pid yet.
    """
    pid = os.getpid()
    label = dump_label(rank, pid)
    if rank is None:
        return label, None
    os.makedirs(claims_dir(dump_path), exist_ok=True)
    path = claim_path(dump_path, label)
    with _lock:
        held = _held.get(path)
        if held is not None and held[0] == pid:
            return label, None
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return dump_label(None, pid), _holder(path)
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(pid).encode(), 0)
        _held[path] = (pid, fd)
    return label, None


def release_rank_label(dump_path: str | os.PathLike, label: str) -> None:
    """Drop our claim on ``label`` (the rank changed, e.g. the node agent remapped it)."""
    path = claim_path(dump_path, label)
    with _lock:
        held = _held.get(path)
        if held is None or held[0] != os.getpid():
            return
        del _held[path]
        os.close(held[1])  # closing the only descriptor of ours drops the lock


def _holder(path: str) -> int:
    # The holder writes its pid right after it locks; give it a moment to land.
    for _ in range(5):
        owner = _read_owner(path)
        if owner is not None:
            return owner
        time.sleep(0.01)
    return UNKNOWN_HOLDER


def _read_owner(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
