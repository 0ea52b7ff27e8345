"""Stopping the whole process tree ``rankscope launch`` started, and nothing else.

``msrun`` starts its workers as children that may sit in process groups of their own,
and a worker held by a pause may ignore a polite signal for a while; signalling only
the launcher's child left them running. So the tree is found the way the kernel sees
it (Linux ``/proc``): every descendant of the command, plus every process still in the
session the launcher created for it (a worker whose parent already died is re-parented,
but keeps the session). Each gets SIGTERM, then SIGKILL after ``grace_s``.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def _table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, state) for every process visible now."""
    out: dict[int, tuple[int, int, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
        fields = raw[raw.rfind(")") + 2:].split()
        try:
            out[int(d.name)] = (int(fields[1]), int(fields[3]), fields[0])
        except (IndexError, ValueError):
            continue
    return out


def tree_of(root: int, session: int | None = None) -> list[int]:
    """``root``'s living descendants (and ``root``), plus the living members of ``session``."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo += children.get(pid, [])
    if session is not None and session > 1:
        found |= {pid for pid, (_, sid, _) in table.items() if sid == session}
    return sorted(p for p in found if p in table and table[p][2] not in ("Z", "X") and p != os.getpid())


def stop_tree(root: int, session: int | None = None, grace_s: float = 3.0) -> list[int]:
    """SIGTERM the tree, SIGKILL what is left after ``grace_s``; returns the pids it signalled."""
    pids = tree_of(root, session)
    _send(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not tree_of(root, session):
            return pids
        time.sleep(0.1)
    left = tree_of(root, session)
    _send(left, signal.SIGKILL)
    end = time.monotonic() + 5.0
    while tree_of(root, session) and time.monotonic() < end:
        time.sleep(0.05)
    return sorted(set(pids) | set(left))


def _send(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
