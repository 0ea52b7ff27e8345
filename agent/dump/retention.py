"""How much of a rank's local dump stays on disk, so a run of 100,000 steps cannot fill it.

By default each rank keeps the newest ``keep_steps`` steps of its dump, within a byte and
a file budget (``cluster.dump_keep_steps``, ``dump_max_mb``, ``dump_max_files``); each
older step's folder is removed once a newer one is written. What msProbe users ask for
stays exactly as asked: a config whose ``step`` list names the steps to dump keeps every
one of them. Steps on disk when an incident exports are pinned: kept for the rest of the
run (``rankscope collect`` can still gather them), up to :data:`MAX_PINNED`.

Nothing here is what the coordinator judges with: records stream to it whatever is on
disk, and bundles come from the in-memory flight recorder. Pure bookkeeping over sizes
the writer reports; the writer removes what it is told to, off the training thread.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

#: Steps kept pinned for incidents at most, however many incidents a run has.
MAX_PINNED = 1024


@dataclass(frozen=True)
class RetentionPolicy:
    """None for a bound: no bound of that kind."""

    keep_steps: int | None = 100
    max_mb: float | None = 1024.0
    max_files: int | None = 20_000

    def describe(self) -> str:
        parts = [f"the newest {self.keep_steps} steps" if self.keep_steps else "every step"]
        if self.max_mb:
            parts.append(f"{self.max_mb:g} MB")
        if self.max_files:
            parts.append(f"{self.max_files} files")
        return ", at most ".join(parts)


class DumpRetention:
    """Which of one rank's dumped steps stay: :meth:`wrote` after each step is written
    returns the steps to remove now, oldest first."""

    def __init__(self, policy: RetentionPolicy, keep_all: bool = False) -> None:
        self.policy = policy
        #: The msProbe ``step`` list names the steps: every one is kept.
        self.keep_all = keep_all
        self._steps: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()  # step -> bytes, files
        self._pinned: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.bytes = 0
        self.files = 0
        self.removed = 0
        self.removed_through: int | None = None
        #: Why the last step was removed: "window", "bytes" or "files".
        self.reason = ""

    def wrote(self, step: int, nbytes: int, files: int) -> list[int]:
        """Step ``step`` now holds ``nbytes`` in ``files`` files; the steps to remove."""
        old = self._steps.pop(step, (0, 0))
        self._steps[step] = (nbytes, files)
        self.bytes += nbytes - old[0]
        self.files += files - old[1]
        return [] if self.keep_all else self._over()

    def _over(self) -> list[int]:
        p, out = self.policy, []
        while len(self._steps) > 1:
            unpinned = [s for s in self._steps if s not in self._pinned]
            if len(unpinned) <= 1:
                break
            if p.keep_steps and len(unpinned) > p.keep_steps:
                why = "window"
            elif p.max_mb and self.bytes > p.max_mb * 2**20:
                why = "bytes"
            elif p.max_files and self.files > p.max_files:
                why = "files"
            else:
                break
            oldest = unpinned[0]  # never the step just written: it is the newest
            nbytes, files = self._steps.pop(oldest)
            self.bytes -= nbytes
            self.files -= files
            self.removed += 1
            self.removed_through = max(oldest, self.removed_through if self.removed_through is not None else oldest)
            self.reason = why
            out.append(oldest)
        return out

    def pin(self) -> None:
        """An incident: keep the steps now on disk for the rest of the run."""
        for step in self._steps:
            self._pinned[step] = None
            self._pinned.move_to_end(step)
        while len(self._pinned) > MAX_PINNED:
            self._pinned.popitem(last=False)

    def kept(self) -> list[int]:
        return list(self._steps)

    def report(self) -> dict[str, Any]:
        """What is on disk and what was removed, for the coordinator's coverage."""
        steps = self.kept()
        return {"kept_from": min(steps) if steps else -1, "kept_to": max(steps) if steps else -1,
                "kept": len(steps), "removed": self.removed,
                "removed_through": -1 if self.removed_through is None else self.removed_through,
                "bytes": self.bytes, "files": self.files, "why": self._why()}

    def _why(self) -> str:
        if self.keep_all:
            return "the config's step list: every step it names is kept"
        what = {"window": "rolling window", "bytes": "byte budget", "files": "file budget"}.get(self.reason, "")
        kept = f"keeps {self.policy.describe()}"
        return f"{kept}; older steps removed by the {what}" if what else kept
