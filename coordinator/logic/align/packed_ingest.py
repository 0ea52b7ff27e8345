"""Writing packed parts (wire.step_pack) into a step slot with one array write per column.

A node agent packs the parts its ranks sent for one shard; in the usual case they are one
step, one group, names already known and one column layout (a data-parallel job's ranks
record the same tensors in the same order), and then :func:`ingest_whole` does the
aligner's bookkeeping for all of them at once and writes their rows as one
(parts x records) block per column. Anything else goes part by part (the aligner's
``_ingest_each``), which still writes runs of same-layout parts together (:class:`Run`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rankscope.coordinator.logic.align.slots import Layout, StepSlot
from rankscope.wire.records import PackedRows, StepBatch
from rankscope.wire.step_pack import StepPack

if TYPE_CHECKING:
    from rankscope.coordinator.logic.align.aligner import StepAligner


def ingest_whole(al: "StepAligner", pack: StepPack, now: float) -> bool:
    """All parts of a pack at once; False, with nothing done, unless they are the usual case
    (one step and group, no new names, as many records each, every rank's cached layout the
    same slice of columns and its ids those of every part)."""
    steps, rows = pack.steps, pack.rows
    k = len(steps)
    if not k or any(pack.names):
        return False
    step, n = steps[0], rows[0]
    if not n or steps.count(step) != k or rows.count(n) != k:
        return False
    job = pack.job
    get = al.ranks.get
    recs = [get((job, r)) for r in pack.ranks]
    rec0 = recs[0]
    lay = rec0.layout if rec0 is not None else None
    if lay is None or lay.rows is not None or type(lay.cols) is not slice or lay.count != n:
        return False
    grp, cols, raw = rec0.group, lay.cols, lay.raw
    for r in recs:
        if r is None or r.group is not grp:
            return False
        rl = r.layout
        if rl is not lay and (rl is None or rl.rows is not None or type(rl.cols) is not slice or rl.cols != cols
                              or rl.raw != raw):
            return False
    packed = pack.cols
    if packed["name_ids"].tobytes() != raw * k:  # every part's ids are the layout's
        return False
    note = al.note_step
    for r in recs:
        note(r, step, now)
    counters = al.counters
    counters["batches"] += k
    if step <= grp.judged_through:
        counters["late_records"] += n * k
        return True
    slot = grp.slots.get(step)
    if slot is None:
        slot = grp.slots[step] = al.pool.take(step, now, len(grp.members), max(len(al.keys[job]), 1))
    pos = [r.pos for r in recs]
    if max(pos) >= slot.shape[0] or lay.width > slot.shape[1]:
        slot.grow(len(grp.members), len(al.keys[job]))
    at = _rows(pos)
    slot.reported[at] = True
    slot.token[at] = pack.tokens if k > 1 else pack.tokens[0]
    run = Run(slot, cols, packed, 0, n)
    run.rows = pos
    run.write(at)
    counters["records"] += n * k
    return True


def write_one(slot: StepSlot, p: int, layout: Layout, b: StepBatch) -> None:
    cols, rows = layout.cols, layout.rows
    sel = (lambda a: a) if rows is None else (lambda a: a[rows])
    slot.present[p, cols] = True
    slot.exec[p, cols] = sel(b.exec_index)
    slot.stats[p, cols] = sel(b.stats)
    slot.nan[p, cols] = sel(b.nan_count)
    slot.inf[p, cols] = sel(b.inf_count)
    slot.numel[p, cols] = sel(b.numel)
    slot.crc[p, cols] = sel(b.crc32)


class Run:
    """Consecutive parts of one packed frame, each ``n`` rows, bound for the same slot
    columns: their rows of the frame are one (parts x n) block per column."""

    def __init__(self, slot: StepSlot, cols: slice, packed: dict, start: int, n: int) -> None:
        self.slot, self.cols, self.packed, self.start, self.n = slot, cols, packed, start, n
        self.rows: list[int] = []

    def extends(self, slot: StepSlot, cols: slice, pk: PackedRows, n: int) -> bool:
        return slot is self.slot and cols == self.cols and pk.cols is self.packed and n == self.n \
            and pk.start == self.start + n * len(self.rows)

    def write(self, at: np.ndarray | slice | int | None = None) -> None:
        """``at``: the slot rows, when the caller has them as an index already."""
        slot, c, k, n = self.slot, self.cols, len(self.rows), self.n
        p = at if at is not None else _rows(self.rows)
        lo, hi = self.start, self.start + k * n
        src = self.packed

        def block(name: str) -> np.ndarray:
            a = src[name][lo:hi]
            return a.reshape(k, n, *a.shape[1:]) if k > 1 else a

        slot.present[p, c] = True
        slot.exec[p, c] = block("exec_index")
        slot.stats[p, c] = block("stats")
        slot.nan[p, c] = block("nan_count")
        slot.inf[p, c] = block("inf_count")
        slot.numel[p, c] = block("numel")
        slot.crc[p, c] = block("crc32")


def _rows(pos: list[int]) -> int | slice | np.ndarray:
    """Slot rows as an index numpy writes fastest: one row, a slice when they are evenly
    spaced (a node's ranks usually are: a strided block, not a scatter), else an array."""
    k = len(pos)
    if k == 1:
        return pos[0]
    first, step = pos[0], pos[1] - pos[0]
    if step > 0 and pos[-1] == first + step * (k - 1) and all(b - a == step for a, b in zip(pos, pos[1:])):
        return slice(first, pos[-1] + 1, step)
    return np.array(pos, np.int64)
