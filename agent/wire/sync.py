"""Sync points: where a rank stands relative to the collectives every rank must reach.

A data-parallel step cannot finish on any rank until every rank has entered its gradient
AllReduce. So when ranks hang or die, "who never reached the collective the others are
waiting in" names the cause, and "which collective did the others leave" says which steps
a dead rank completed (the flight recorder idea, applied to values' collectives).

A rank reports its latest sync point with every heartbeat: ``what`` (``"AllReduce"`` for
the gradient reducer, ``"graph"`` for a compiled step), the training ``step``, ``seq``
(the call's index within the step), ``phase`` (``"in"`` while inside, ``"out"`` once it
left) and ``at`` (the rank's wall clock when it got there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IN, OUT = "in", "out"
#: What a compiled step's sync point is called (``what``).
GRAPH = "graph"
_FIELDS = {"what": str, "step": int, "seq": int, "phase": str, "at": (int, float)}


@dataclass(frozen=True)
class SyncPoint:
    what: str
    step: int
    seq: int
    phase: str
    at: float

    def key(self) -> tuple[int, int]:
        """Order of collectives within a job: by step, then by call within the step."""
        return (self.step, self.seq)

    def to_wire(self) -> dict[str, Any]:
        return {"what": self.what, "step": self.step, "seq": self.seq, "phase": self.phase, "at": self.at}

    @classmethod
    def from_wire(cls, d: Any) -> "SyncPoint | None":
        """None for anything that is not a well-formed sync point."""
        if not isinstance(d, dict) or set(d) != set(_FIELDS):
            return None
        for k, typ in _FIELDS.items():
            v = d[k]
            if isinstance(v, bool) or not isinstance(v, typ):
                return None
        if d["phase"] not in (IN, OUT) or d["step"] < 0 or d["seq"] < 0:
            return None
        return cls(d["what"][:64], d["step"], d["seq"], d["phase"], float(d["at"]))

    def shifted(self, offset_s: float) -> "SyncPoint":
        """The same point with ``at`` moved onto another clock."""
        return SyncPoint(self.what, self.step, self.seq, self.phase, self.at + offset_s)


def point_name(what: Any, seq: Any, step: Any, phase: Any = None) -> str:
    """A sync point for people: "AllReduce #0 of step 4", "step 4's compiled graph"
    (numbered only when a step runs several), "(in)"/"(out)" when the phase is given."""
    name = (f"step {step}'s compiled graph" + (f" #{seq}" if seq else "")) if what == GRAPH \
        else f"{what} #{seq} of step {step}"
    return name + {IN: " (inside)", OUT: " (left)"}.get(phase, f" ({phase})" if phase else "")
