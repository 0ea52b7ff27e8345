"""A bounded on-disk log of frames on their way to the coordinator.

Every frame the node agent sends upstream is appended here first and stays until it is
*confirmed* (acknowledged by the coordinator, or sent long enough ago on a connection
that stayed up). A send cursor walks the log; when the connection drops the cursor goes
back to the first unconfirmed frame, so frames that were in flight -- in a socket buffer
of a coordinator that died -- are sent again, in their original order. The coordinator
drops the repeats by (src, seq).

Layout: ``<dir>/seg-<n>.spool`` files of ``<4-byte big-endian length><frame>`` records;
whole segments are deleted once confirmed. Leftover segments from an earlier run are
replayed from their start. Writes go straight to the file descriptor (no user-space
buffer to lose); the page cache makes this cheap, and the most recent frames are kept in
memory so a connected agent rarely reads the disk back.
"""
from __future__ import annotations

import collections
import fcntl
import logging
import os
import re
import struct
from pathlib import Path

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
_SEGMENT = re.compile(r"^seg-(\d{10})\.spool$")

Pos = tuple[int, int]  # (segment number, byte offset); compares in log order


class SpoolBusy(OSError):
    """Another live process holds this spool directory."""


class SpoolLog:
    def __init__(self, directory: str | Path, max_bytes: int = 1 << 30,
                 segment_bytes: int = 4 << 20, cache_bytes: int = 16 << 20) -> None:
        if max_bytes < segment_bytes:
            raise ValueError(f"spool max_bytes ({max_bytes}) must be >= segment_bytes ({segment_bytes})")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        # Two agents appending to one spool would interleave records: refuse the second.
        self._lock_fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise SpoolBusy(f"spool directory {self.dir} is in use by another node agent; "
                            "give each agent its own --spool") from None
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.cache_bytes = cache_bytes
        self.dropped = 0
        self._full_warned = False
        self._sizes: dict[int, int] = {}
        for p in sorted(self.dir.iterdir()):
            m = _SEGMENT.match(p.name)
            if m:
                self._sizes[int(m.group(1))] = p.stat().st_size
        first = min(self._sizes, default=0)
        self._write_seg = max(self._sizes, default=0)
        self._sizes.setdefault(self._write_seg, 0)
        self._wfd = os.open(self._path(self._write_seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.sent: Pos = (first, 0)
        self.confirmed: Pos = (first, 0)
        self._rfds: dict[int, int] = {}
        # pos -> frame for recently appended frames: the connected fast path.
        self._cache: collections.OrderedDict[Pos, bytes] = collections.OrderedDict()
        self._cached_bytes = 0

    # --- writing -------------------------------------------------------------------
    def _path(self, seg: int) -> Path:
        return self.dir / f"seg-{seg:010d}.spool"

    @property
    def end(self) -> Pos:
        return (self._write_seg, self._sizes[self._write_seg])

    @property
    def bytes_on_disk(self) -> int:
        return sum(self._sizes.values())

    def append(self, frame: bytes) -> Pos | None:
        """Append one frame; return its position, or None (counted, warned) when full."""
        need = _HEADER.size + len(frame)
        if self.bytes_on_disk + need > self.max_bytes:
            self.dropped += 1
            if not self._full_warned:
                self._full_warned = True
                log.warning("spool %s is full (%d bytes, limit %d): dropping new records until the "
                            "coordinator takes the backlog; raise --spool-max-mb to keep more",
                            self.dir, self.bytes_on_disk, self.max_bytes)
            return None
        if self._full_warned:
            log.warning("spool %s has room again; %d records were dropped while it was full",
                        self.dir, self.dropped)
            self._full_warned = False
        if self._sizes[self._write_seg] and self._sizes[self._write_seg] + need > self.segment_bytes:
            os.close(self._wfd)
            self._write_seg += 1
            self._sizes[self._write_seg] = 0
            self._wfd = os.open(self._path(self._write_seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        pos = self.end
        os.write(self._wfd, _HEADER.pack(len(frame)) + frame)
        self._sizes[self._write_seg] += need
        self._cache[pos] = frame
        self._cached_bytes += len(frame)
        while self._cached_bytes > self.cache_bytes and self._cache:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= len(old)
        return pos

    # --- reading -------------------------------------------------------------------
    def has_unsent(self) -> bool:
        return self.sent < self.end

    def peek(self) -> tuple[Pos, bytes] | None:
        """The next unsent frame and the position just after it (pass it to ``advance``)."""
        while self.sent < self.end:
            seg, off = self.sent
            if off >= self._sizes.get(seg, 0):
                self.sent = (seg + 1, 0)  # end of a finished segment
                continue
            frame = self._cache.get(self.sent)
            if frame is None:
                frame = self._read(seg, off)
            return (seg, off + _HEADER.size + len(frame)), frame
        return None

    def advance(self, to: Pos) -> None:
        self.sent = to

    def _read(self, seg: int, off: int) -> bytes:
        fd = self._rfds.get(seg)
        if fd is None:
            fd = self._rfds[seg] = os.open(self._path(seg), os.O_RDONLY)
        (n,) = _HEADER.unpack(os.pread(fd, _HEADER.size, off))
        data = os.pread(fd, n, off + _HEADER.size)
        if len(data) != n:
            raise OSError(f"spool segment {self._path(seg)} is truncated at offset {off}")
        return data

    # --- confirmation --------------------------------------------------------------
    def rewind(self) -> None:
        """The connection dropped: everything not confirmed goes again."""
        self.sent = self.confirmed

    def confirm(self, upto: Pos) -> None:
        """Frames before ``upto`` are safe at the coordinator; delete finished segments."""
        if upto <= self.confirmed:
            return
        self.confirmed = min(upto, self.sent)
        for seg in sorted(self._sizes):
            if seg >= self.confirmed[0] or seg == self._write_seg:
                break
            fd = self._rfds.pop(seg, None)
            if fd is not None:
                os.close(fd)
            try:
                os.unlink(self._path(seg))
            except FileNotFoundError:
                pass
            del self._sizes[seg]
        # Frames before the confirmed point can never be read again.
        while self._cache:
            pos = next(iter(self._cache))
            if pos >= self.confirmed:
                break
            self._cached_bytes -= len(self._cache.pop(pos))

    def close(self) -> None:
        for fd in [self._wfd, *self._rfds.values(), self._lock_fd]:
            try:
                os.close(fd)
            except OSError:
                pass
        self._rfds.clear()
