"""At most once per interval per key: for scans over every member of a group (a hang, a
lagging rank), which the ingest loop's tick, 20 a second, need not repeat each time."""
from __future__ import annotations

#: How often a group's members are scanned for what takes seconds to matter (a lag of
#: several steps, a hang of minutes): at 16k ranks a scan costs a few ms.
MEMBER_SCAN_S = 0.25


class Pace:
    def __init__(self, every_s: float = MEMBER_SCAN_S) -> None:
        self.every_s = every_s
        self._next: dict[str, float] = {}  # key -> when it is due again

    def due(self, key: str, now: float) -> bool:
        """True (and the next one ``every_s`` from now) when ``key`` is due at ``now``."""
        if now < self._next.get(key, now):
            return False
        self._next[key] = now + self.every_s
        return True
