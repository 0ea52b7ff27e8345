"""Step alignment: every rank's records of one step side by side, as (ranks x columns) arrays.

Records are keyed by (group, step, name, call index): the group picks the slot
table, the step the slot, the rank the row and (name, call index) the column
(:mod:`rankscope.coordinator.logic.align.columns`). A slot is released for judging once every live
rank of its group has reported the step, or once ``deadline_s`` has passed since
its first record (the missing ranks are then a finding), or when more than
``max_pending_steps`` slots wait or they hold more than ``max_pending_mb`` (all groups of
this aligner together), so memory stays bounded when a rank falls behind.
Slots are released in step order, so detectors always see the earliest step first.
Judged slots are dropped; the group keeps only the previous one (``prev``) for
detectors that compare consecutive steps, plus whatever state a detector keeps.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.config.cluster import ClusterSettings
from rankscope.coordinator.logic.align.columns import MAX_LAYOUTS, UNKNOWN, KeyTable, RankNames
from rankscope.coordinator.logic.job.layout import LayoutBook
from rankscope.coordinator.logic.align.members import (  # noqa: F401 (their home was here)
    LIVE_STATES,
    Group,
    RankRecord,
    RankState,
    expected_world,
)
from rankscope.coordinator.logic.align.packed_ingest import Run, ingest_whole, write_one
from rankscope.coordinator.logic.job.row_sets import RowSets, row_sets
from rankscope.coordinator.logic.align.slots import NO_EXEC, Layout, SlotPool, StepSlot, StepView  # noqa: F401 (NO_EXEC: home was here)
from rankscope.wire.records import StepBatch
from rankscope.wire.step_pack import StepPack


class StepAligner:
    def __init__(self, settings: ClusterSettings) -> None:
        self.settings = settings
        self.keys: dict[str, KeyTable] = {}
        self.groups: dict[tuple[str, int], Group] = {}
        self.ranks: dict[tuple[str, int], RankRecord] = {}
        self._world: dict[str, int] = {}
        self.layouts = LayoutBook(settings.groups, settings.layout)
        self.pool = SlotPool()
        self.counters = {"records": 0, "batches": 0, "late_records": 0, "unknown_name_records": 0,
                         "steps_judged": 0, "steps_by_deadline": 0, "steps_forced": 0, "unranked_batches": 0,
                         "bad_names": 0}

    # --- membership ---------------------------------------------------------------
    def _group_for(self, job: str, rank: int) -> Group:
        """A job's one group: every rank is aligned with every other (a NaN crosses from
        one model shard to another through their collectives); who is compared with whom
        inside it is the layout's (:mod:`.row_sets`)."""
        grp = self.groups.get((job, 0))
        if grp is None:
            groups = self.settings.groups
            fixed = tuple(sorted({r for g in groups for r in g})) if isinstance(groups, tuple) else None
            grp = self.groups[(job, 0)] = Group(job, 0, f"{job}/0", fixed)
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
        if info.get("layout") and not self.layouts.has_facts(job, rank):
            rec.group.owed.add(rec.pos)
        ws = expected_world(info)
        self.layouts.note_rank(job, rank, ws)
        # In "dp"/"replicas" mode the group is the whole job: expect every rank of the
        # world size, so step 0 is not judged before the slow starters registered.
        if isinstance(ws, int) and not isinstance(self.settings.groups, tuple) \
                and ws > self._world.get(job, 0):
            self._world[job] = ws
            for r in range(min(ws, 1 << 16)):
                self.rank(job, r)
        return rec

    def learn_layout(self, job: str, rank: int, facts: dict[str, Any]) -> None:
        """A rank's layout facts (wire.layout_facts), validated."""
        rec = self.rank(job, rank)
        self.layouts.learn(job, rank, facts)
        rec.group.owed.discard(rec.pos)

    def sets_of(self, grp: Group) -> RowSets:
        """The group's rows as the job's layout lays them out, cached until either changes."""
        n = len(grp.members)
        if grp.sets is not None and grp.sets[0] == (self.layouts.current(grp.job), n):
            return grp.sets[1]
        layout = self.layouts.layout(grp.job, grp.ranks().tolist())
        key = (layout.version, n)
        if grp.sets is None or grp.sets[0] != key:
            grp.sets = (key, row_sets(layout, grp.ranks()))
        return grp.sets[1]

    def reset_group(self, grp: Group, world_size: Any = None) -> None:
        grp.slots.clear()
        grp.judged_through, grp.prev, grp.state = -1, None, {}
        grp.owed.clear()
        self.layouts.forget(grp.job)  # the new run says its own layout
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
        rec.last_step = max(rec.last_step, step)

    def _layout(self, rec: RankRecord, table: KeyTable, b: StepBatch, raw: bytes) -> Layout:
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
                if grp.owed:
                    waiting = {p for p in grp.owed if p < rows and slot.reported[p]}
                    if waiting and not (force or late or over):
                        break  # their layout, which says who is compared with whom, is on its way
                    # Waited for once: a layout that never came holds no later step.
                    grp.owed -= waiting
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
            replicas_mode=self.settings.replicas_mode, sets=self.sets_of(grp),
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

