"""Step alignment: every rank's records of one step side by side, as (ranks x columns) arrays.

Records are keyed by (group, step, name, call index): the group picks the slot
table, the step the slot, the rank the row and (name, call index) the column
(:mod:`rankscope.coordinator.logic.columns`). A slot is released for judging once every live
rank of its group has reported the step, or once ``deadline_s`` has passed since
its first record (the missing ranks are then a finding), or when more than
``max_pending_steps`` slots wait or they hold more than ``max_pending_mb`` (all groups of
this aligner together), so memory stays bounded when a rank falls behind.
Slots are released in step order, so detectors always see the earliest step first.
Judged slots are dropped; the group keeps only the previous one (``prev``) for
detectors that compare consecutive steps, plus whatever state a detector keeps.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankscope.config.cluster import ClusterSettings
from rankscope.coordinator.logic.columns import MAX_LAYOUTS, UNKNOWN, KeyTable, RankNames
from rankscope.coordinator.logic.packed_ingest import Run, ingest_whole, write_one
from rankscope.coordinator.logic.slots import NO_EXEC, Layout, SlotPool, StepSlot, StepView  # noqa: F401 (NO_EXEC: home was here)
from rankscope.wire.records import StepBatch
from rankscope.wire.step_pack import StepPack
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
    group: "Group"
    pos: int
    state: RankState = RankState.EXPECTED
    info: dict[str, Any] = field(default_factory=dict)
    names: RankNames = field(default_factory=RankNames)
    last_step: int = -1  # newest step this rank reported
    last_seen: float | None = None
    heartbeat_step: int | None = None
    started: int | None = None  # the step it says it last began (heartbeats)
    layout: "Layout | None" = None
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


class StepAligner:
    def __init__(self, settings: ClusterSettings) -> None:
        self.settings = settings
        self.keys: dict[str, KeyTable] = {}
        self.groups: dict[tuple[str, int], Group] = {}
        self.ranks: dict[tuple[str, int], RankRecord] = {}
        self._world: dict[str, int] = {}
        self.pool = SlotPool()
        self.counters = {"records": 0, "batches": 0, "late_records": 0, "unknown_name_records": 0,
                         "steps_judged": 0, "steps_by_deadline": 0, "steps_forced": 0, "unranked_batches": 0,
                         "bad_names": 0}

    # --- membership ---------------------------------------------------------------
    def _group_for(self, job: str, rank: int) -> Group:
        groups = self.settings.groups
        if isinstance(groups, tuple):
            index = next((i for i, g in enumerate(groups) if rank in g), len(groups))
            fixed = groups[index] if index < len(groups) else None
        else:
            index, fixed = 0, None
        grp = self.groups.get((job, index))
        if grp is None:
            grp = self.groups[(job, index)] = Group(job, index, f"{job}/{index}", fixed)
            for r in fixed or ():
                self._add(job, r, grp)
        return grp

    def _add(self, job: str, rank: int, grp: Group) -> RankRecord:
        rec = RankRecord(job, rank, grp, len(grp.members))
        grp.members.append(rec)
        self.ranks[(job, rank)] = rec
        return rec

    def rank(self, job: str, rank: int) -> RankRecord:
        rec = self.ranks.get((job, rank))
        if rec is None:
            grp = self._group_for(job, rank)  # may create the configured members, this rank among them
            rec = self.ranks.get((job, rank)) or self._add(job, rank, grp)
        return rec

    def register(self, job: str, rank: int, info: dict[str, Any]) -> RankRecord:
        rec = self.rank(job, rank)
        if rec.state in (RankState.LOST, RankState.FINISHED) and info.get("pid") not in (None, rec.info.get("pid")):
            grp = rec.group
            if not any(m.state in (RankState.RUNNING, RankState.PAUSED, RankState.STALLED) for m in grp.members):
                # Every process of the group had ended: this is a new run under the same
                # job id. Its steps start again, so the group's alignment starts over.
                self.reset_group(grp, expected_world(info))
            rec.state = RankState.EXPECTED  # a new process took this rank id (a restart): await it again
            rec.names, rec.layout = RankNames(), None
        rec.info.update(info)
        ws = expected_world(info)
        # In "dp"/"replicas" mode the group is the whole job: expect every rank of the
        # world size, so step 0 is not judged before the slow starters registered.
        if isinstance(ws, int) and not isinstance(self.settings.groups, tuple) \
                and ws > self._world.get(job, 0):
            self._world[job] = ws
            for r in range(min(ws, 1 << 16)):
                self.rank(job, r)
        return rec

    def reset_group(self, grp: Group, world_size: Any = None) -> None:
        grp.slots.clear()
        grp.judged_through, grp.prev, grp.state = -1, None, {}
        grp.generation += 1
        for m in grp.members:
            m.last_step, m.heartbeat_step, m.layout = -1, None, None
            # The new run's world is awaited; ranks beyond it are not (the run may be smaller).
            within = grp.fixed is not None or (isinstance(world_size, int) and m.rank < world_size)
            m.state = RankState.EXPECTED if within else RankState.FINISHED

    # --- ingestion ----------------------------------------------------------------
    def ingest(self, b: StepBatch, now: float) -> None:
        self.ingest_many([b], now)

    def ingest_many(self, items: list[StepBatch | StepPack], now: float) -> None:
        """Place each batch, in order. A pack (a node agent's parts) goes in at once when it
        is the usual case (:func:`~.packed_ingest.ingest_whole`), else part by part; parts
        landing in the same slot columns are written together either way."""
        todo: list[StepBatch] = []
        for item in items:
            if type(item) is not StepPack:
                todo.append(item)
                continue
            if todo:
                self._ingest_each(todo, now)
                todo = []
            if not ingest_whole(self, item, now):
                self._ingest_each(item.batches(), now)
        if todo:
            self._ingest_each(todo, now)

    def _ingest_each(self, batches: list[StepBatch], now: float) -> None:
        run: Run | None = None
        for b in batches:
            placed = self._place(b, now)
            if placed is None:
                continue
            slot, p, layout = placed
            pk = b.packed
            n = layout.count
            if pk is None or layout.rows is not None or type(layout.cols) is not slice or n != len(b):
                write_one(slot, p, layout, b)
                continue
            if run is not None and not run.extends(slot, layout.cols, pk, n):
                run.write()
                run = None
            if run is None:
                run = Run(slot, layout.cols, pk.cols, pk.start, n)
            run.rows.append(p)
        if run is not None:
            run.write()

    def _place(self, b: StepBatch, now: float) -> tuple[StepSlot, int, Layout] | None:
        """Bookkeeping for one batch; the slot, row and layout its records go to (None: nothing to write)."""
        rec = self.ranks.get((b.job, b.rank)) or self.rank(b.job, b.rank)
        table = self.keys.get(b.job)
        if table is None:
            table = self.keys[b.job] = KeyTable()
        if b.new_names:
            refused = rec.names.learn(table, b.new_names)
            if refused:
                self.counters["bad_names"] += refused
            rec.layout = None
        n = len(b)
        self.counters["batches"] += 1
        self.note_step(rec, b.step, now)
        grp = rec.group
        if b.step <= grp.judged_through:
            self.counters["late_records"] += n
            return None
        slot = grp.slots.get(b.step)
        if slot is None:
            slot = grp.slots[b.step] = self.pool.take(b.step, now, len(grp.members), max(len(table), 1))
        p = rec.pos
        if p >= slot.shape[0]:
            slot.grow(len(grp.members), len(table))
        slot.reported[p] = True
        slot.token[p] = b.token
        if not n:
            return None
        # A rank records the same names in the same order step after step: remember the
        # column layout of its last batch and reuse it while the ids are byte-identical.
        raw = b.name_ids.tobytes()
        layout = rec.layout
        if layout is None or layout.raw != raw:
            layout = rec.layout = self._layout(rec, table, b, raw)
        if layout.width > slot.shape[1]:
            slot.grow(len(grp.members), len(table))
        self.counters["records"] += layout.count
        if layout.unknown:
            self.counters["unknown_name_records"] += layout.unknown
        return slot, p, layout

    @staticmethod
    def note_step(rec: RankRecord, step: int, now: float) -> None:
        """A rank reported ``step``: it is alive and running."""
        rec.last_seen = now
        if rec.state in (RankState.EXPECTED, RankState.STALLED) or \
                (rec.state is RankState.FINISHED and rec.last_step < 0):
            rec.state = RankState.RUNNING
        if step > rec.last_step:
            rec.last_step = step

    def _layout(self, rec: RankRecord, table: KeyTable, b: StepBatch, raw: bytes) -> "Layout":
        sig = rec.names.sig
        if sig is not None:
            same = table.layouts.get((sig, raw))
            if same is not None:
                return same  # type: ignore[return-value]
        ids = b.name_ids
        keys = rec.names.map(ids)
        rows = None
        unknown = 0
        if (keys == UNKNOWN).any():  # names lost (e.g. our restart before the resend)
            rows = np.flatnonzero(keys != UNKNOWN)
            unknown = ids.shape[0] - rows.shape[0]
            keys, ids = keys[rows], ids[rows]
        if keys.shape[0] > 1:
            srt = np.sort(keys)
            if (srt[1:] == srt[:-1]).any():
                keys = rec.names.with_calls(table, ids, keys)
        table.learn_kinds(keys, b.kinds if rows is None else b.kinds[rows])
        width = int(keys.max()) + 1 if keys.shape[0] else 0
        cols: Any = keys
        # Contiguous ascending columns (the usual case) are written as a slice: a memcpy
        # per column array instead of a scatter.
        if rows is None and keys.shape[0] and keys[-1] - keys[0] + 1 == keys.shape[0] \
                and (keys.shape[0] == 1 or bool((np.diff(keys) == 1).all())):
            cols = slice(int(keys[0]), int(keys[-1]) + 1)
        layout = Layout(raw, cols, rows, width, int(keys.shape[0]), unknown)
        if sig is not None and len(table.layouts) < MAX_LAYOUTS:
            for arr in (cols, rows):
                if isinstance(arr, np.ndarray):
                    arr.setflags(write=False)  # shared by every rank with this layout
            table.layouts[(sig, raw)] = layout
        return layout

    # --- release for judging ------------------------------------------------------
    def ready(self, now: float, force: bool = False) -> list[tuple[Group, StepView]]:
        """Slots to judge now, oldest step first per group."""
        out: list[tuple[Group, StepView]] = []
        held = self.pending_bytes()
        max_bytes = self.settings.max_pending_mb * 2**20
        for grp in self.groups.values():
            states = None
            while grp.slots:
                step = min(grp.slots)
                slot = grp.slots[step]
                live, paused = states = states or grp.masks()  # nobody's state changes in here
                rows = slot.shape[0]
                if rows < live.shape[0]:
                    slot.grow(live.shape[0], slot.shape[1])
                missing = live & ~slot.reported[: live.shape[0]]
                over = len(grp.slots) > self.settings.max_pending_steps or held > max_bytes
                if missing.any() and (missing & paused).any():
                    # A paused rank is not late: the deadline restarts once nobody it waits for is paused.
                    slot.created = now
                late = now - slot.created >= self.settings.deadline_s
                if missing.any() and not (force or late or over):
                    break
                del grp.slots[step]
                held -= slot.nbytes
                grp.judged_through = step
                self.counters["steps_judged"] += 1
                if missing.any():
                    self.counters["steps_by_deadline" if late else "steps_forced"] += 1
                # A paused rank is never reported missing, even when the pending bound forces a judgement.
                missing &= ~paused
                out.append((grp, self._view(grp, slot, live.copy(), missing, by_deadline=bool(missing.any()) and late)))
                self.pool.give(slot)
        return out

    def _view(self, grp: Group, slot: StepSlot, live: np.ndarray, missing: np.ndarray,
              by_deadline: bool) -> StepView:
        table = self.keys.get(grp.job) or KeyTable()
        r, k = len(grp.members), min(len(table), slot.shape[1])
        slot.settle(r, k)
        ranks = grp.ranks()
        return StepView(
            job=grp.job, group=grp.label, step=slot.step, ranks=ranks, live=live,
            reported=slot.reported[:r], token=slot.token[:r], present=slot.present[:r, :k], exec=slot.exec[:r, :k],
            stats=slot.stats[:r, :k], nan=slot.nan[:r, :k], inf=slot.inf[:r, :k],
            numel=slot.numel[:r, :k], crc=slot.crc[:r, :k], kind=table.kind[:k].copy(), keys=table,
            replicas_mode=self.settings.replicas_mode, prev=grp.prev,
            missing=[int(x) for x in ranks[missing]], by_deadline=by_deadline,
        )

    def prepare_slots(self) -> None:
        """Idle, nothing pending: have a slot ready for each group's next step (SlotPool)."""
        for grp in self.groups.values():
            if not grp.slots and grp.members:
                self.pool.prepare(len(grp.members), max(len(self.keys.get(grp.job) or ()), 1))

    def pending_steps(self) -> int:
        return sum(len(g.slots) for g in self.groups.values())

    def pending_bytes(self) -> int:
        """Memory of the slots waiting to be judged (what ``max_pending_mb`` bounds)."""
        return sum(s.nbytes for g in self.groups.values() for s in g.slots.values())

