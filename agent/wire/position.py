"""A rank's position (step, token) kept where its node agent can read it after a crash.

A worker killed in the middle of decoding (SIGKILL, ``os._exit``, a segfault) runs no
code on the way out, and its last heartbeat may be several tokens old; a training rank
killed just after a step may take that step's records with it, unsent. So the rank
writes its position into a small memory-mapped file at every root forward call (serving)
and at every step boundary (training: the step it began, ``NO_TOKEN``); the
node agent, on the same host, reads it when the process is gone and reports it with
the death. One aligned 8-byte store per call (step in the high half, token in the low
half), so a reader never sees half an update, and nothing on the rank's side waits.

The same file holds the rank's newest sync point (:mod:`rankscope.wire.sync`), stored at
every collective it enters or leaves: heartbeats carry it at most every few tenths of a
second (later on a loaded node), so a rank killed right after it reached a collective
could otherwise be taken for one that never reached it. A second word holds step, call
index, kind and phase, a third its time (a death between the two stores leaves the
word with the time of the event after it, microseconds later).
"""
from __future__ import annotations

import mmap
import os
import sys
from typing import Any

from rankscope.wire.sync import GRAPH, IN, OUT, SyncPoint

_SIZE = 24  # position word, sync word, sync time (float64)
_WORD = 8
_LOW = 0xFFFFFFFF
#: The stored word while nothing has been written yet.
_EMPTY = -1


#: The token half of a training rank's position: it began the step, it counts no tokens.
NO_TOKEN = _LOW


def pack(step: int, token: int) -> int:
    if not (0 <= step <= 0x7FFFFFFF and 0 <= token <= _LOW):
        return _EMPTY
    return (step << 32) | token


#: Collective kinds the sync word can name (its code is the index; 0 is none).
_SYNC_KINDS = ("", "AllReduce", GRAPH)
_SEQ_MAX = (1 << 24) - 1


def pack_sync(point: SyncPoint) -> int:
    """step (high half) | call index (24 bits) | kind (7 bits) | phase (1 bit, 1 = out)."""
    try:
        kind = _SYNC_KINDS.index(point.what, 1)
    except ValueError:
        return _EMPTY
    if not (0 <= point.step <= 0x7FFFFFFF and 0 <= point.seq <= _SEQ_MAX):
        return _EMPTY
    return (point.step << 32) | (point.seq << 8) | (kind << 1) | (point.phase == OUT)


def unpack_sync(word: int, at: float) -> SyncPoint | None:
    if word < 0 or not 0 < (word >> 1) & 0x7F < len(_SYNC_KINDS):
        return None
    return SyncPoint(_SYNC_KINDS[(word >> 1) & 0x7F], word >> 32, (word >> 8) & _SEQ_MAX,
                     OUT if word & 1 else IN, at)


def unpack(word: int) -> tuple[int, int | None] | None:
    if word < 0:
        return None
    token = word & _LOW
    return word >> 32, (None if token == NO_TOKEN else token)


class PositionWriter:
    """Owned by the rank: each write costs a store or two; every failure is swallowed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._map: Any = None
        self._word: Any = None
        self._at: Any = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, _SIZE)
                self._map = mmap.mmap(fd, _SIZE)
            finally:
                os.close(fd)
            view = memoryview(self._map)
            self._word, self._at = view[:2 * _WORD].cast("q"), view[2 * _WORD:].cast("d")
            view.release()
            self._word[0] = self._word[1] = _EMPTY
        except (OSError, ValueError):
            self._map = self._word = self._at = None

    @property
    def ok(self) -> bool:
        return self._word is not None

    def write(self, step: int, token: int) -> None:
        if self._word is not None:
            self._word[0] = pack(step, token)

    def write_sync(self, point: SyncPoint) -> None:
        word = self._word
        if word is not None:
            self._at[0] = point.at
            word[1] = pack_sync(point)

    def close(self, remove: bool = True) -> None:
        views, self._word, self._at = (self._word, self._at), None, None
        try:
            for view in views:
                if view is not None:
                    view.release()
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


def read_rank_file(path: str, remove: bool = True) -> tuple[dict[str, int | None] | None, dict | None]:
    """What a rank last wrote: ``{"step", "token"}`` it began and its newest sync point in
    wire form; each None when not written (no file, a file cut short)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_SIZE)
    except OSError:
        return None, None
    if remove:
        _remove(path)
    if len(data) < _WORD:
        return None, None
    pos = unpack(int.from_bytes(data[:_WORD], sys.byteorder, signed=True))
    sync = None
    if len(data) == _SIZE:
        at = float(memoryview(data[2 * _WORD:]).cast("d")[0])
        sync = unpack_sync(int.from_bytes(data[_WORD:2 * _WORD], sys.byteorder, signed=True), at)
    return (None if pos is None else {"step": pos[0], "token": pos[1]},
            None if sync is None else sync.to_wire())


def read_position(path: str, remove: bool = True) -> dict[str, int | None] | None:
    """``{"step", "token"}`` the rank last wrote, or None (no file, nothing written)."""
    return read_rank_file(path, remove)[0]


def _remove(path: str) -> None:
    """The file, and the job's folder once its last rank's file is gone."""
    try:
        os.unlink(path)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass  # other ranks of the job still have theirs
