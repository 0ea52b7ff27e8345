"""What the aligner holds per pending step, and what a detector judges.

A :class:`StepSlot` is one step of one group as (ranks x columns) arrays; a
:class:`StepView` is a released slot trimmed to its ranks and columns; a :class:`Layout`
is where one rank's batch lands in a slot (cached while its name ids repeat).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankscope.coordinator.logic.columns import KeyTable
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


class StepSlot:
    """One step of one group. Rows are group positions, columns job-wide keys."""

    def __init__(self, step: int, created: float, rows: int, cols: int) -> None:
        self.step, self.created = step, created
        self.reported = np.zeros(rows, bool)
        self.token = np.full(rows, -1, np.int64)  # inference: decode/forward-call index per rank
        self.present = np.zeros((rows, cols), bool)
        self.exec = np.full((rows, cols), NO_EXEC, np.int64)
        self.stats = np.full((rows, cols, 4), np.nan)
        self.nan = np.zeros((rows, cols), np.int64)
        self.inf = np.zeros((rows, cols), np.int64)
        self.numel = np.zeros((rows, cols), np.int64)
        self.crc = np.full((rows, cols), NO_CRC, np.int64)

    @property
    def shape(self) -> tuple[int, int]:
        return self.present.shape

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.reported, self.token, self.present, self.exec, self.stats, self.nan,
                                      self.inf, self.numel, self.crc))

    def grow(self, rows: int, cols: int) -> None:
        r0, c0 = self.shape
        rows, cols = max(rows, r0), max(cols, c0)
        for attr, fill in (("present", False), ("exec", NO_EXEC), ("nan", 0), ("inf", 0),
                           ("numel", 0), ("crc", NO_CRC)):
            old = getattr(self, attr)
            new = np.full((rows, cols), fill, old.dtype)
            new[:r0, :c0] = old
            setattr(self, attr, new)
        stats = np.full((rows, cols, 4), np.nan)
        stats[:r0, :c0] = self.stats
        self.stats = stats
        reported = np.zeros(rows, bool)
        reported[:r0] = self.reported
        self.reported = reported
        token = np.full(rows, -1, np.int64)
        token[:r0] = self.token
        self.token = token


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
    missing: list[int] = field(default_factory=list)  # live ranks absent at judging
    by_deadline: bool = False
    cache: dict[str, Any] = field(default_factory=dict)  # values one detector computed for others
