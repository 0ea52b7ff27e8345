"""How a rank process that could not attach tells ``rankscope launch`` so.

A rank that fails to attach keeps training, unwatched (attaching must never stop the
user's program), and it has no node-agent connection to say so over: the failure is
usually what prevented the connection (a config error, an unreachable agent). So it
leaves one small JSON note in a folder launch named in :data:`ENV_VAR`, and launch,
which polls that folder, warns on the terminal at once and counts the rank as unwatched.
Both sides use this module, so the folder's layout has one spelling.

A rank that attached but runs with settings other than the job's (its own config
disagrees on a cluster-wide setting) leaves a *note* the same way; launch says each
distinct note once.
"""
from __future__ import annotations

import json
import os
import socket
import zlib
from pathlib import Path
from typing import Any, Mapping

#: The folder launch watches; unset outside ``rankscope launch``.
ENV_VAR = "RANKSCOPE_ATTACH_REPORTS"
_PREFIX = "attach-failed-"
_NOTE_PREFIX = "note-"


def one_line(exc: BaseException) -> str:
    """The error as one line: its own message (a ConfigError names field, value and
    expectation), with the type when the message alone would not say what happened."""
    text = " ".join(str(exc).split())
    if not text:
        return type(exc).__name__
    return text if isinstance(exc, ValueError) else f"{type(exc).__name__}: {text}"


def write_failure(rank: int | None, reason: str, env: Mapping[str, str] | None = None,
                  raised: bool = False) -> Path | None:
    """Leave the note for launch; None when not under launch or the folder is gone.
    ``raised``: the error also went to the script (its own debugger's), which likely ends.
    Never raises: the caller is the process's start-up, which must go on."""
    folder = (os.environ if env is None else env).get(ENV_VAR)
    if not folder:
        return None
    pid = os.getpid()
    note = {"rank": rank, "pid": pid, "host": socket.gethostname(), "reason": reason, "raised": raised}
    path = Path(folder) / f"{_PREFIX}{pid}.json"
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(note), encoding="utf-8")
        os.replace(tmp, path)  # launch never reads half a note
    except OSError:
        return None
    return path


def read_failures(folder: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """Every note in ``folder`` by pid (a note that does not parse is skipped: it is
    still being written or is not ours)."""
    out: dict[int, dict[str, Any]] = {}
    try:
        paths = sorted(Path(folder).glob(f"{_PREFIX}*.json"))
    except OSError:
        return out
    for path in paths:
        try:
            note = json.loads(path.read_text(encoding="utf-8"))
            out[int(note["pid"])] = note
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def write_note(text: str, env: Mapping[str, str] | None = None) -> Path | None:
    """Leave a note launch shows on its terminal; None when not under launch. Never raises."""
    folder = (os.environ if env is None else env).get(ENV_VAR)
    if not folder:
        return None
    pid = os.getpid()
    path = Path(folder) / f"{_NOTE_PREFIX}{pid}-{zlib.crc32(text.encode()):08x}.json"
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "text": text}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return None
    return path


_said: set[str] = set()


def say_once(note: str) -> None:
    """Something about this rank's settings the user must see: once per process, on its
    stderr (the rank's log) and, through :func:`write_note`, on launch's terminal."""
    if note in _said:
        return
    _said.add(note)
    import sys
    print(f"[rankscope] WARNING: {note}", file=sys.stderr, flush=True)
    write_note(note)


def read_notes(folder: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Every note in ``folder`` by file name."""
    out: dict[str, dict[str, Any]] = {}
    try:
        paths = sorted(Path(folder).glob(f"{_NOTE_PREFIX}*.json"))
    except OSError:
        return out
    for path in paths:
        try:
            note = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(note.get("text"), str):
                out[path.name] = note
        except (OSError, ValueError, AttributeError):
            continue
    return out
