"""Which exports the coordinator asked of a job lately.

A rank that dies just after an export was asked of it cannot answer it any more; the
node agent answers on its behalf with the bundle it wrote from its flight recorder. Only
recent exports count (an export from an hour ago is not owed by a rank dying now), and
only the newest few are kept.
"""
from __future__ import annotations

from typing import Callable

#: A rank dying this soon after an export was asked still owes it.
EXPORT_ANSWER_S = 600.0
MAX_EXPORTS = 4


class RecentExports:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._asked: dict[str, list[tuple[str, float]]] = {}  # job -> (transfer, when asked)

    def asked(self, job: str, transfer: str) -> None:
        exports = self._asked.setdefault(job, [])
        exports.append((transfer, self._clock()))
        del exports[:-MAX_EXPORTS]

    def owed(self, job: str) -> list[str]:
        now = self._clock()
        return [t for t, at in self._asked.get(job, []) if now - at <= EXPORT_ANSWER_S]
