"""Messages numbered by their sender, taken in the order they were sent.

Ray runs the calls of a threaded actor on several threads, so two calls one caller made in
order may run in the other order. A sender numbers its messages from 0; the receiver holds
one that overtook an earlier one until the earlier one is in. Logic only: no clock of its
own, no threads (the caller owns both).
"""
from __future__ import annotations

from typing import Any


class InOrder:
    """One sender's numbered messages, released in order."""

    def __init__(self, late: str = "drop") -> None:
        if late not in ("drop", "deliver"):
            raise ValueError(f"late: {late!r} is not 'drop' or 'deliver'")
        #: What to do with a message numbered below the next one expected: it was already
        #: taken (a repeat), superseded by a reset ("drop"), or skipped over when a gap was
        #: given up on ("deliver": late is better than lost).
        self.late = late
        self.next = 0
        self.early: dict[int, Any] = {}

    def put(self, seq: int, item: Any) -> list[Any]:
        """The messages now in order: this one and those it let through; [] while an
        earlier one is missing."""
        if seq < self.next:
            return [item] if self.late == "deliver" else []
        self.early[seq] = item
        out = []
        while self.next in self.early:
            out.append(self.early.pop(self.next))
            self.next += 1
        return out

    def reset(self, seq: int) -> None:
        """Count from ``seq`` on: what was numbered before it is dropped, held or late."""
        self.next = seq
        self.early = {k: v for k, v in self.early.items() if k >= seq}

    def held(self) -> int:
        return len(self.early)

    def skip(self) -> list[Any]:
        """Give up on the missing messages: everything held, in order."""
        out = [self.early[k] for k in sorted(self.early)]
        if self.early:
            self.next = max(self.early) + 1
        self.early = {}
        return out


class Senders:
    """Several senders, each numbered in its own order. A sender that started again (a new
    ``epoch``: a restarted process) counts from 0 again; what its old self still had in
    flight is delivered when it comes in, late rather than lost. A gap that lasts
    ``gap_s`` (the message was lost, or this receiver joined mid-stream) is given up on."""

    def __init__(self, gap_s: float = 3.0) -> None:
        self.gap_s = gap_s
        self._now: dict[Any, tuple[Any, InOrder]] = {}
        self._old: set[tuple[Any, Any]] = set()
        self._gap_since: dict[Any, float] = {}
        #: Gaps given up on, per sender (each one a message that may be lost).
        self.skipped: dict[Any, int] = {}

    def put(self, sender: Any, epoch: Any, seq: int, item: Any, now: float) -> list[Any]:
        if (sender, epoch) in self._old:
            return [item]
        cur = self._now.get(sender)
        if cur is None or cur[0] != epoch:
            if cur is not None:
                self._old.add((sender, cur[0]))
            cur = self._now[sender] = (epoch, InOrder(late="deliver"))
            self._gap_since.pop(sender, None)
        out = cur[1].put(seq, item)
        if not cur[1].held():
            self._gap_since.pop(sender, None)
        elif out or sender not in self._gap_since:
            # A gap is timed from when the sender last made progress: under steady
            # reordering something is always held, but no one gap lasts long.
            self._gap_since[sender] = now
        return out

    def waiting(self) -> bool:
        """A message is held for an earlier one."""
        return bool(self._gap_since)

    def overdue(self, now: float, force: bool = False) -> list[Any]:
        """What was held behind a gap older than ``gap_s`` (any gap, with ``force``)."""
        out = []
        for sender, since in list(self._gap_since.items()):
            if force or now - since >= self.gap_s:
                out += self._now[sender][1].skip()
                self.skipped[sender] = self.skipped.get(sender, 0) + 1
                del self._gap_since[sender]
        return out
