"""A rank's position (step, token) kept where its node agent can read it after a crash.

A worker killed in the middle of decoding (SIGKILL, ``os._exit``, a segfault) runs no
code on the way out, and its last heartbeat may be several tokens old; a training rank
killed just after a step may take that step's records with it, unsent. So the rank
writes its position into a small memory-mapped file at every root forward call (serving)
and at every step boundary (training: the step it began, ``NO_TOKEN``); the
node agent, on the same host, reads it when the process is gone and reports it with
the death. One aligned 8-byte store per call (step in the high half, token in the low
half), so a reader never sees half an update, and nothing on the rank's side waits.
"""
from __future__ import annotations

import mmap
import os
import sys
from typing import Any

_SIZE = 8
_LOW = 0xFFFFFFFF
#: The stored word while nothing has been written yet.
_EMPTY = -1


#: The token half of a training rank's position: it began the step, it counts no tokens.
NO_TOKEN = _LOW


def pack(step: int, token: int) -> int:
    if not (0 <= step <= 0x7FFFFFFF and 0 <= token <= _LOW):
        return _EMPTY
    return (step << 32) | token


def unpack(word: int) -> tuple[int, int | None] | None:
    if word < 0:
        return None
    token = word & _LOW
    return word >> 32, (None if token == NO_TOKEN else token)


class PositionWriter:
    """Owned by the rank: :meth:`write` costs one store; every failure is swallowed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._map: Any = None
        self._word: Any = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, _SIZE)
                self._map = mmap.mmap(fd, _SIZE)
            finally:
                os.close(fd)
            self._word = memoryview(self._map).cast("q")
            self._word[0] = _EMPTY
        except (OSError, ValueError):
            self._map = self._word = None

    @property
    def ok(self) -> bool:
        return self._word is not None

    def write(self, step: int, token: int) -> None:
        if self._word is not None:
            self._word[0] = pack(step, token)

    def close(self, remove: bool = True) -> None:
        word, self._word = self._word, None
        try:
            if word is not None:
                word.release()
            if self._map is not None:
                self._map.close()
            if remove:
                _remove(self.path)
        except (ValueError, BufferError):
            pass
        self._map = None


def position_from_wire(d: Any) -> tuple[int, int | None] | None:
    """(step, token) from a RANK_LOST ``position`` (token None: a training step, no tokens);
    None for anything malformed."""
    if not isinstance(d, dict):
        return None
    step, token = d.get("step"), d.get("token")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (step, token) if v is not None) \
            or step is None:
        return None
    return step, token


def read_position(path: str, remove: bool = True) -> dict[str, int | None] | None:
    """``{"step", "token"}`` the rank last wrote, or None (no file, nothing written)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_SIZE)
    except OSError:
        return None
    if remove:
        _remove(path)
    if len(data) != _SIZE:
        return None
    pos = unpack(int.from_bytes(data, sys.byteorder, signed=True))
    return None if pos is None else {"step": pos[0], "token": pos[1]}


def _remove(path: str) -> None:
    """The file, and the job's folder once its last rank's file is gone."""
    try:
        os.unlink(path)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass  # other ranks of the job still have theirs
