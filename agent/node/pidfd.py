"""Learning that a local rank process ended the moment it does: one pidfd per process.

A pidfd (Linux 5.3+) becomes readable when its process terminates, whoever its parent is,
so the agent's poll loop wakes at once instead of noticing at its next /proc scan, and
reads the exit status from /proc while the launcher has not yet reaped the zombie
(msrun polls its children once a second). Where pidfds are unavailable the periodic scan
in :mod:`.liveness` still finds every death, a little later.
"""
from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)


class PidWatch:
    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # pid -> fd
        self._pids: dict[int, int] = {}  # fd -> pid
        self._ended: set[int] = set()  # told once; not watched again while still wanted
        self._poller: Any = None
        self.available = hasattr(os, "pidfd_open")
        self._warned = False

    def sync(self, poller: Any, pids: set[int]) -> None:
        """Watch exactly ``pids`` (open new pidfds, close those no longer wanted)."""
        if not self.available:
            return
        self._poller = poller
        self._ended &= pids
        for pid in set(self._fds) - pids:
            self._drop(poller, pid)
        for pid in pids - set(self._fds) - self._ended:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue  # already gone: the /proc scan reports it
            except OSError as exc:
                if not self._warned:
                    log.warning("pidfd unavailable (%s); deaths are noticed by the periodic scan", exc)
                    self._warned = True
                self.available = False
                return
            self._fds[pid], self._pids[fd] = fd, pid
            poller.register(fd, 1)  # zmq.POLLIN

    def ended(self, events: dict) -> list[int]:
        """Pids whose pidfd became readable in this poll's ``events`` (each told once: a
        readable pidfd stays readable, and would wake every poll)."""
        pids = [self._pids[fd] for fd in events if isinstance(fd, int) and fd in self._pids]
        for pid in pids:
            self._ended.add(pid)
            self._drop(self._poller, pid)
        return pids

    def _drop(self, poller: Any, pid: int) -> None:
        fd = self._fds.pop(pid)
        self._pids.pop(fd, None)
        try:
            poller.unregister(fd)
        except KeyError:
            pass
        os.close(fd)

    def close(self) -> None:
        for fd in list(self._pids):
            os.close(fd)
        self._fds.clear()
        self._pids.clear()
