"""Registrations held until the coordinator confirms their job-wide id.

This agent's registry makes ids unique on this host; the coordinator makes them unique
across hosts (``rankscope.coordinator.logic.job.identities``). A registration is forwarded
with the id proposed here and the rank is answered once the coordinator says which id
it gets (STATUS "assigned"), or after ``wait_s`` with the local id, so one node without
a reachable coordinator works as before. ``wait_s`` 0: answer at once. Nothing is held
before the coordinator has said anything at all: one that never answers (or is not up
yet) must not delay every rank's start.
"""
from __future__ import annotations

import logging
from typing import Callable

from rankscope.node.registry import RankEntry, RankRegistry

log = logging.getLogger(__name__)


def parse_assigned(detail: object) -> tuple[str, int, int] | None:
    """(host, pid, rank) of a coordinator's "assigned" STATUS, or None when malformed."""
    if not isinstance(detail, dict):
        return None
    host, pid, rank = detail.get("host"), detail.get("pid"), detail.get("rank")
    if not isinstance(host, str) or not host:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (pid, rank)):
        return None
    return host, pid, rank


class HeldAnswers:
    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self.heard = False  # any frame from the coordinator yet
        self._held: dict[tuple[str, str, int], tuple[RankEntry, float]] = {}

    def hold(self, entry: RankEntry, now: float) -> None:
        self._held[(entry.job, entry.host, entry.pid)] = (entry, now + self.wait_s)

    def route(self, due: list[RankEntry], now: float,
              forward: Callable[[RankEntry], None]) -> list[RankEntry]:
        """Of registrations just given a local id, forward and hold them (the answer's
        ``forwarded`` mark says the coordinator has it); return those to answer now."""
        if self.wait_s <= 0 or not self.heard:
            return due + self.expired(now)
        for entry in due:
            forward(entry)
            entry.extra["forwarded"] = True
            self.hold(entry, now)
        return self.expired(now)

    def confirm(self, job: str, host: str, pid: int) -> RankEntry | None:
        held = self._held.pop((job, host, pid), None)
        return held[0] if held is not None else None

    def expired(self, now: float) -> list[RankEntry]:
        out = [k for k, (_, deadline) in self._held.items() if now >= deadline]
        entries = [self._held.pop(k)[0] for k in out]
        for e in entries:
            log.warning("job %s: no job-wide id from the coordinator for pid %d within %gs: "
                        "it uses this host's id %s", e.job, e.pid, self.wait_s, e.assigned_rank)
        return entries


def confirm_assigned(registry: RankRegistry, held: HeldAnswers, job: str, detail: object,
                     answer: Callable[[RankEntry], None]) -> bool:
    """Apply a coordinator's "assigned" and answer the rank it held; False if malformed."""
    got = parse_assigned(detail)
    if got is None:
        return False
    host, pid, rank = got
    entry = held.confirm(job, host, pid)
    if entry is not None:
        registry.reassign(entry, rank)
        settings = detail.get("settings") if isinstance(detail, dict) else None
        if isinstance(settings, dict) and settings.get("on_terminate") in ("raise", "exit"):
            entry.extra["settings"] = {"on_terminate": settings["on_terminate"]}
        answer(entry)
        return True
    for e in registry.entries(job):
        if e.host == host and e.pid == pid and e.assigned_rank != rank:
            # Answered already (the coordinator was late): an id in use is never taken back.
            log.warning("job %s: the coordinator gives pid %d id %d, but it was answered %s already",
                        job, pid, rank, e.assigned_rank)
    return True
