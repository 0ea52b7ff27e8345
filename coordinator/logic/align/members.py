"""A job's ranks as the aligner keeps them: their states, and the group they are aligned in."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankscope.coordinator.logic.align.columns import RankNames
from rankscope.coordinator.logic.job.row_sets import RowSets
from rankscope.coordinator.logic.align.slots import Layout, StepSlot, StepView
from rankscope.wire.sync import SyncPoint


class RankState(str, enum.Enum):
    """EXPECTED: in the group (world size / configured list) but not heard from yet.
    RUNNING/PAUSED: live, per its heartbeats. STALLED: missed a deadline; not waited
    for until it reports again. LOST: gone (the node agent said so). FINISHED: ended
    normally."""

    EXPECTED = "expected"
    RUNNING = "running"
    PAUSED = "paused"
    STALLED = "stalled"
    LOST = "lost"
    FINISHED = "finished"


LIVE_STATES = frozenset({RankState.EXPECTED, RankState.RUNNING, RankState.PAUSED})
#: State -> small code, live states first, so one pass over a group's members yields
#: both masks a tick needs (the tick runs 20 times a second over every rank).
_CODE = {RankState.EXPECTED: 0, RankState.RUNNING: 1, RankState.PAUSED: 2, RankState.STALLED: 3,
         RankState.LOST: 4, RankState.FINISHED: 5}


@dataclass
class RankRecord:
    job: str
    rank: int
    group: Group
    pos: int
    state: RankState = RankState.EXPECTED
    info: dict[str, Any] = field(default_factory=dict)
    names: RankNames = field(default_factory=RankNames)
    last_step: int = -1  # newest step this rank reported
    last_seen: float | None = None
    heartbeat_step: int | None = None
    started: int | None = None  # the step it says it last began (heartbeats)
    layout: Layout | None = None
    #: Its newest sync point (where it stands relative to its collectives), coordinator clock.
    sync: SyncPoint | None = None
    #: How it ended, when it was lost: exit status, signal, reason, exception, time.
    death: dict[str, Any] | None = None
    #: How the rank said it is watched (STATUS ``watch``: mode, how, reason), once.
    watch: dict[str, Any] | None = None


class Group:
    def __init__(self, job: str, index: int, label: str, fixed: tuple[int, ...] | None) -> None:
        self.job, self.index, self.label = job, index, label
        self.members: list[RankRecord] = []
        self.slots: dict[int, StepSlot] = {}
        self.judged_through = -1
        self.prev: StepView | None = None
        self.state: dict[str, Any] = {}  # per-detector history, owned by the detectors
        self.fixed = fixed
        self.generation = 0  # bumped when a new run reuses the job id (reset_group)
        #: Members that ever reported a sync point: none (collectives not watched, e.g. a
        #: serving job) spares the hang scan its walk over every member.
        self.synced = 0
        #: Positions of members whose layout facts are owed (they said they would send
        #: them): a step they reported is not judged before their facts are in.
        self.owed: set[int] = set()
        self.sets: tuple[tuple[int, int], RowSets] | None = None
        self._ranks = np.zeros(0, np.int64)

    def ranks(self) -> np.ndarray:
        """Each member's rank id, read-only (kept while no member joins: members are only
        ever added, and at 16k ranks building it took ~8 ms of every judged step)."""
        n = len(self.members)
        if self._ranks.shape[0] != n:
            self._ranks = np.fromiter((m.rank for m in self.members), np.int64, n)
            self._ranks.flags.writeable = False
        return self._ranks

    def paused_mask(self) -> np.ndarray:
        return self.masks()[1]

    def live_mask(self) -> np.ndarray:
        return self.masks()[0]

    def masks(self) -> tuple[np.ndarray, np.ndarray]:
        """(live, paused) per member."""
        code = _CODE
        codes = np.fromiter((code[m.state] for m in self.members), np.int8, len(self.members))
        return codes <= 2, codes == 2

    def newest_step(self) -> int:
        return max((m.last_step for m in self.members), default=-1)


def expected_world(info: dict[str, Any]) -> int | None:
    """How many ranks the job this rank belongs to has: its world size, or, for a DP
    serving worker alone in a world of 1, the number of workers its server started."""
    ws, dp = info.get("world_size"), info.get("dp_size")
    if isinstance(dp, int) and dp > 1 and not (isinstance(ws, int) and ws > 1):
        return dp
    return ws if isinstance(ws, int) else None
