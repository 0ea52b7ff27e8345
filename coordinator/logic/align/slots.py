"""What the aligner holds per pending step, and what a detector judges.

A :class:`StepSlot` is one step of one group as (ranks x columns) arrays (a :class:`SlotPool`
hands a judged one's memory to a later step); a
:class:`StepView` is a released slot trimmed to its ranks and columns; a :class:`Layout`
is where one rank's batch lands in a slot (cached while its name ids repeat).
"""
from __future__ import annotations

import collections
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankscope.coordinator.logic.align.columns import KeyTable
from rankscope.wire.records import NO_CRC

NO_EXEC = np.iinfo(np.int64).max


@dataclass
class Layout:
    """Where one rank's batch lands in a slot, cached while its name ids repeat."""

    raw: bytes
    cols: Any  # slice or int64 array of columns
    rows: np.ndarray | None  # batch rows kept (None = all)
    width: int  # columns the slot needs
    count: int
    unknown: int


#: A slot's arrays: (attribute, fill of an empty cell, items per cell beyond (rows, cols));
#: rows-only arrays have ``None`` for their per-cell items.
_ARRAYS: tuple[tuple[str, Any, Any, tuple[int, ...] | None], ...] = (
    ("reported", False, bool, None), ("token", -1, np.int64, None),  # token: inference decode index
    ("present", False, bool, ()), ("exec", NO_EXEC, np.int64, ()), ("stats", np.nan, np.float64, (4,)),
    ("nan", 0, np.int64, ()), ("inf", 0, np.int64, ()), ("numel", 0, np.int64, ()), ("crc", NO_CRC, np.int64, ()),
)
#: What a reused slot refills at once; the per-cell values under ``present`` are settled
#: when the step is judged (:meth:`StepSlot.settle`), and only where no record landed.
_EAGER = frozenset({"reported", "token", "present"})
_SPEC = {spec[0]: spec for spec in _ARRAYS}


def _empty(name: str, rows: int, cols: int) -> np.ndarray:
    """Array ``name`` of a slot of this shape, every cell empty."""
    _, fill, dtype, tail = _SPEC[name]
    return np.full((rows,) if tail is None else (rows, cols, *tail), fill, dtype)


class StepSlot:
    """One step of one group. Rows are group positions, columns job-wide keys."""

    def __init__(self, step: int, created: float, rows: int, cols: int) -> None:
        self.step, self.created = step, created
        self.stale = False  # cells without a record may still hold an older step's values
        for name, *_ in _ARRAYS:
            setattr(self, name, _empty(name, rows, cols))

    @property
    def shape(self) -> tuple[int, int]:
        return self.present.shape

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name, *_ in _ARRAYS)

    def grow(self, rows: int, cols: int) -> None:
        r0, c0 = self.shape
        rows, cols = max(rows, r0), max(cols, c0)
        for name, *_ in _ARRAYS:
            new = _empty(name, rows, cols)
            new[(slice(r0),) if new.ndim == 1 else (slice(r0), slice(c0))] = getattr(self, name)
            setattr(self, name, new)

    def unshared(self) -> bool:
        """Whether no view of any of its arrays is alive (a judged step's StepView, kept
        for an incident's proof, holds views): only then may its memory hold another step."""
        # Two references: the attribute and getrefcount's own argument.
        return all(sys.getrefcount(getattr(self, name)) == 2 for name, *_ in _ARRAYS)

    def reset(self, step: int, created: float) -> None:
        # A 16k-rank slot is ~100 MB: refilling all of it cost more than its records'
        # copy. Every record sets ``present`` with its cells, so only ``present`` (and the
        # per-rank arrays) are refilled here and the rest waits for :meth:`settle`.
        self.step, self.created = step, created
        for name, fill, *_ in _ARRAYS:
            if name in _EAGER:
                getattr(self, name).fill(fill)
        self.stale = True

    def settle(self, rows: int, cols: int) -> None:
        """Give the cells of ``[:rows, :cols]`` that no record reached their empty values
        (what a fresh slot holds there), before anything reads them."""
        if not self.stale:
            return
        self.stale = False
        pres = self.present[:rows, :cols]
        full = pres.all(axis=1)
        if full.all():
            return
        which = np.flatnonzero(~full)
        # A few ranks short (one missing, one behind): their rows alone. Many (a column
        # only some ranks record): one masked pass over the whole region.
        few = which.shape[0] * 4 < rows
        absent = ~pres[which] if few else ~pres
        for name, fill, _, tail in _ARRAYS:
            if name in _EAGER:
                continue
            part = getattr(self, name)[:rows, :cols]
            if few:
                sub = part[which]
                sub[absent] = fill
                part[which] = sub
            else:
                np.copyto(part, fill, where=absent.reshape(absent.shape + (1,) * len(tail)))


class SlotPool:
    """Judged slots whose memory the next steps take again.

    A step's slot of a 16k-rank shard is ~76 MB of fresh pages each step: faulting them in
    cost more than filling arrays that are already mapped. A judged slot is given back
    here; a new step of the same shape takes the oldest one nothing else still sees
    (:meth:`StepSlot.unshared`). At most ``keep`` are held, so beyond the steps kept for
    proofs a shard holds at most ``keep`` slots more, and only while they wait to be taken.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._free: collections.deque[StepSlot] = collections.deque()
        self.reused = 0

    def give(self, slot: StepSlot) -> None:
        self._free.append(slot)
        while len(self._free) > self.keep:
            self._free.popleft()

    def prepare(self, rows: int, cols: int) -> None:
        """Between steps: make sure the next step of this shape finds a slot to take, so
        its pages are faulted in now and not while its records arrive."""
        if not any(slot.shape == (rows, cols) and slot.unshared() for slot in self._free):
            self.give(StepSlot(-1, 0.0, rows, cols))

    def take(self, step: int, created: float, rows: int, cols: int) -> StepSlot:
        for i, slot in enumerate(self._free):
            if slot.shape == (rows, cols) and slot.unshared():
                del self._free[i]
                slot.reset(step, created)
                self.reused += 1
                return slot
        return StepSlot(step, created, rows, cols)


@dataclass
class StepView:
    """What a detector judges: one step of one group, trimmed to its ranks and columns."""

    job: str
    group: str
    step: int
    ranks: np.ndarray  # (R,) rank id of each row
    live: np.ndarray  # (R,) bool, ranks the step waited for
    reported: np.ndarray  # (R,) bool
    token: np.ndarray  # (R,) int64, -1 unless inference token capture
    present: np.ndarray  # (R, K) bool
    exec: np.ndarray  # (R, K) int64, NO_EXEC where absent
    stats: np.ndarray  # (R, K, 4) Max/Min/Mean/Norm, NaN where absent
    nan: np.ndarray
    inf: np.ndarray
    numel: np.ndarray
    crc: np.ndarray
    kind: np.ndarray  # (K,) int16 per column
    keys: KeyTable
    replicas_mode: bool = False
    prev: "StepView | None" = None
    #: Which rows must agree and which compare (the job's layout); None: every row alike.
    sets: Any = None
    missing: list[int] = field(default_factory=list)  # live ranks absent at judging
    by_deadline: bool = False
    cache: dict[str, Any] = field(default_factory=dict)  # values one detector computed for others
