"""Asking a job's local ranks to write every thread's stack (their SIGUSR2 handler).

When one rank dies, the launcher takes the others down within a second; when the
coordinator declares a hang, the stuck rank may be killed next. Either way, now is the
last chance to learn where each rank was. Only ranks that registered a stacks file (and
so installed the handler) are signalled: SIGUSR2's default action would end the process.
"""
from __future__ import annotations

import logging
import signal
from typing import Callable

from rankscope.node.registry import RankRegistry

log = logging.getLogger(__name__)

#: The signal whose handler writes a rank's stacks (see rankscope.probe.stack_signal).
STACKS_SIGNAL = signal.SIGUSR2
#: A teardown asks a job's ranks once, not once per dying rank.
ASK_AGAIN_S = 10.0


class StackRequests:
    def __init__(self, registry: RankRegistry, host: str, clock: Callable[[], float],
                 wall_clock: Callable[[], float], send_signal: Callable[[int, int], None]) -> None:
        self.registry, self.host = registry, host
        self.clock, self.wall, self._send = clock, wall_clock, send_signal
        self._asked: dict[str, float] = {}  # job -> when its ranks were last asked

    def ask(self, job: str, ranks: list[int] | None = None, why: str = "", exclude: int | None = None) -> int:
        """Signal the job's live local ranks (or ``ranks``, in that order: the suspect
        first); a teardown's repeated asks are folded into one. Returns how many."""
        now = self.clock()
        if ranks is None and now - self._asked.get(job, -ASK_AGAIN_S) < ASK_AGAIN_S:
            return 0
        self._asked[job] = now
        # A rank that said goodbye is on its way out: leave it be.
        live = [e for e in self.registry.live() if e.job == job and e.host == self.host and "stacks_file" in e.extra
                and e.pid != exclude and "bye" not in e.extra]
        if ranks is not None:
            order = {r: i for i, r in enumerate(ranks)}
            live = sorted((e for e in live if e.assigned_rank in order), key=lambda e: order[e.assigned_rank])
        asked = 0
        for e in live:
            try:
                self._send(e.pid, STACKS_SIGNAL)
            except OSError:
                continue
            e.extra["stacks_at"] = self.wall()
            asked += 1
        if asked:
            log.info("asked %d rank(s) of job %s for their stacks (%s)", asked, job, why or "requested")
        return asked
