"""Is a rank's process still there, and how did it end?

The agent is usually not the rank's parent (msrun is), so it cannot ``waitpid``. It reads
``/proc/<pid>/stat`` instead: the process start time guards against pid reuse, and while
the dead process is still a zombie (its parent has not reaped it yet) the kernel shows its
wait status in field 52 (Linux >= 3.5) -- the exit status "when known". A process whose
heartbeats stop for ``heartbeat_timeout_s`` while its pid lives is reported as
unresponsive (stopped, or blocked with the GIL held) -- unless it used CPU within that
time: MindSpore compiling a graph holds the GIL for minutes on a large model, so the
rank's heartbeat thread is silent while the rank works. A busy rank that never gets
past its collective is still named, by the hang rule (its peers wait there).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from rankscope.node.registry import RankEntry


@dataclass(frozen=True)
class ProcStat:
    state: str  # one letter: R, S, D, Z, ...
    start_time: int  # clock ticks since boot
    wait_status: int | None  # raw waitpid status, meaningful for a zombie
    cpu_ticks: int = 0  # user + system time used so far, in clock ticks


def read_stat(pid: int) -> ProcStat | None:
    """None when the pid does not exist (or /proc is unavailable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: the fields start after the last ')'.
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        state, start, cpu = rest[0], int(rest[19]), int(rest[11]) + int(rest[12])
        wait = int(rest[49]) if len(rest) > 49 else None
    except (IndexError, ValueError):
        return None
    return ProcStat(state, start, wait, cpu)


def decode_wait_status(status: int | None) -> int | None:
    """waitpid status -> exit code, or ``-signal`` like subprocess' returncode."""
    if status is None:
        return None
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return None


@dataclass(frozen=True)
class Lost:
    entry: RankEntry
    exit_status: int | None
    reason: str  # "exited" | "unresponsive"


class LivenessMonitor:
    """Polls the local ranks; reports each loss once.

    ``heartbeat`` records a sign of life; ``check`` returns the ranks lost since the last
    call. Ranks on another host (no /proc to read) are judged by heartbeats alone.
    """

    def __init__(self, host: str, heartbeat_timeout_s: float = 15.0,
                 read: Callable[[int], ProcStat | None] = read_stat) -> None:
        self._read = read
        self.host = host
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._start: dict[int, int | None] = {}
        self._seen: dict[int, float] = {}  # id(entry) -> last sign of life
        self._unresponsive: set[int] = set()
        self._cpu: dict[int, tuple[int, float]] = {}  # pid -> (cpu ticks, when they last grew)

    def watch(self, entry: RankEntry, now: float | None = None) -> None:
        if entry.host == self.host and entry.pid not in self._start:
            st = self._read(entry.pid)
            self._start[entry.pid] = None if st is None else st.start_time
        self._seen[id(entry)] = time.monotonic() if now is None else now

    def heartbeat(self, entry: RankEntry, now: float | None = None) -> bool:
        """Record life; True when the rank had been reported unresponsive (it is back)."""
        self._seen[id(entry)] = time.monotonic() if now is None else now
        if id(entry) in self._unresponsive:
            self._unresponsive.discard(id(entry))
            return True
        return False

    def forget(self, entry: RankEntry) -> None:
        self._start.pop(entry.pid, None)
        self._cpu.pop(entry.pid, None)
        self._seen.pop(id(entry), None)
        self._unresponsive.discard(id(entry))

    def check(self, entries: Iterable[RankEntry], now: float | None = None) -> list[Lost]:
        now = time.monotonic() if now is None else now
        lost: list[Lost] = []
        for e in entries:
            busy_at = None
            if e.host == self.host:
                st = self._read(e.pid)
                dead, status = self._dead_from(e.pid, st)
                if dead:
                    lost.append(Lost(e, status, "exited"))
                    continue
                busy_at = self._cpu_grew(e.pid, st, now)
            seen = self._seen.get(id(e))
            if seen is not None and busy_at is not None:
                seen = max(seen, busy_at)  # working, though silent: a sign of life
            if seen is not None and now - seen > self.heartbeat_timeout_s and id(e) not in self._unresponsive:
                self._unresponsive.add(id(e))
                lost.append(Lost(e, None, "unresponsive"))
        return lost

    def _cpu_grew(self, pid: int, st: ProcStat | None, now: float) -> float | None:
        """When the process last used CPU, as far as these checks saw (None: not yet known)."""
        if st is None:
            return None
        last = self._cpu.get(pid)
        if last is None:
            self._cpu[pid] = (st.cpu_ticks, float("-inf"))
            return None
        if st.cpu_ticks > last[0]:
            self._cpu[pid] = (st.cpu_ticks, now)
            return now
        return last[1] if last[1] != float("-inf") else None

    def last_seen(self, entry: RankEntry) -> float | None:
        return self._seen.get(id(entry))

    def dead(self, pid: int) -> tuple[bool, int | None]:
        """(gone, exit status when the kernel still shows it) for a local pid."""
        return self._dead(pid)

    def _dead(self, pid: int) -> tuple[bool, int | None]:
        return self._dead_from(pid, self._read(pid))

    def _dead_from(self, pid: int, st: ProcStat | None) -> tuple[bool, int | None]:
        if st is None:
            return True, None
        known = self._start.get(pid)
        if known is not None and st.start_time != known:
            return True, None  # the pid now belongs to another process
        if st.state in ("Z", "X"):
            return True, decode_wait_status(st.wait_status)
        return False, None
