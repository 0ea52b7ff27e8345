"""SlotPool: a judged step's slot holds a later step only once nothing sees it, and a
reused slot holds exactly what a fresh one would."""
from __future__ import annotations

import dataclasses

import numpy as np

from rankscope.config.cluster import parse_cluster
from rankscope.coordinator.logic.align.aligner import StepAligner
from rankscope.coordinator.logic.align.slots import SlotPool, StepSlot
from rankscope.coordinator.server.ingest_load import simulated_batch
from rankscope.wire.columns import STEP_COLUMNS

ARRAYS = ("reported", "token", "present", "exec", "stats", "nan", "inf", "numel", "crc")


def _judged(keep: int, ranks: int = 6, steps: int = 12) -> tuple[list[dict], int]:
    """Each judged step's arrays (copied), and how many slots were reused. A rank skips
    some steps and another sends fewer records, so a reused slot that kept the last
    step's cells would show them."""
    al = StepAligner(parse_cluster({}))
    al.pool.keep = keep
    rng = np.random.default_rng(0)
    out = []
    for s in range(steps):
        for r in range(ranks):
            if r == 2 and s % 3 == 1:
                continue
            b = simulated_batch("j", r, s, 10, rng, fault=(s == 5 and r == 4))
            if r == 3 and s % 2:
                b = _first(b, 6)
            al.ingest(b, float(s))
        for _, view in al.ready(float(s), force=True):
            out.append({name: getattr(view, name).copy() for name in ARRAYS})
    return out, al.pool.reused


def _first(b, n: int):
    return dataclasses.replace(b, **{c: getattr(b, c)[:n] for c in STEP_COLUMNS})


def test_a_reused_slot_holds_exactly_what_a_fresh_one_would() -> None:
    pooled, reused = _judged(keep=4)
    fresh, none = _judged(keep=0)
    assert reused >= 8 and none == 0  # the pool was used, the baseline never
    assert len(pooled) == len(fresh) == 12
    for a, b in zip(pooled, fresh):
        for name in ARRAYS:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_slot_that_a_view_still_sees_is_not_taken_again() -> None:
    pool = SlotPool(keep=4)
    slot = StepSlot(0, 0.0, 4, 3)
    slot.stats[1, 2] = 7.0
    kept = slot.stats[:2]  # what a StepView kept for an incident's proof holds
    pool.give(slot)
    other = pool.take(1, 1.0, 4, 3)
    assert other is not slot and kept[1, 2, 0] == 7.0
    del kept
    again = pool.take(2, 2.0, 4, 3)
    assert again is slot and again.step == 2 and not again.reported.any() and not again.present.any()
    again.settle(4, 3)  # what a judged step's view reads: no record reached any cell
    assert np.isnan(again.stats).all()


def test_a_slot_of_another_shape_is_not_taken_and_the_pool_stays_bounded() -> None:
    pool = SlotPool(keep=2)
    slots = [StepSlot(s, 0.0, 4, 3) for s in range(3)]
    for s in slots:
        pool.give(s)
    assert pool.take(9, 0.0, 5, 3) not in slots  # more ranks now: a new slot
    # Only the two newest were held: the oldest went back to the allocator.
    assert pool.take(9, 0.0, 4, 3) is slots[1] and pool.take(9, 0.0, 4, 3) is slots[2]
    assert pool.take(9, 0.0, 4, 3) not in slots


def test_between_steps_the_next_steps_slot_is_made_ready_once():
    pool = SlotPool(keep=4)
    pool.prepare(4, 3)
    pool.prepare(4, 3)  # one is ready already: nothing more is made
    ready = pool.take(5, 1.0, 4, 3)
    assert ready.step == 5 and pool.reused == 1 and np.isnan(ready.stats).all()
    assert pool.take(6, 1.0, 4, 3) is not ready and pool.reused == 1  # nothing else was waiting


def test_an_idle_aligner_prepares_a_slot_of_its_groups_shape():
    al = StepAligner(parse_cluster({}))
    rng = np.random.default_rng(1)
    for r in range(3):
        al.ingest(simulated_batch("j", r, 0, 10, rng), 0.0)
    [(grp, kept)] = al.ready(0.0, force=True)  # a view kept for proofs: its slot is not free
    al.prepare_slots()
    for r in range(3):
        al.ingest(simulated_batch("j", r, 1, 10, rng), 1.0)
    assert al.pool.reused == 1 and kept.present.shape == (3, 10)
    assert grp.slots[1].present is not kept.present.base


def test_a_reused_slot_settles_cells_no_record_reached_for_few_and_for_many_short_ranks() -> None:
    for short in ([1], [0, 1, 2, 3, 4, 5, 6]):  # one rank short, and most of them
        pool = SlotPool(keep=1)
        old = StepSlot(0, 0.0, 8, 5)
        old.present[:] = True
        for name in ARRAYS[3:]:
            getattr(old, name)[...] = 7
        pool.give(old)
        slot = pool.take(1, 1.0, 8, 5)
        assert slot is old
        fresh = StepSlot(1, 1.0, 8, 5)
        for s in (slot, fresh):
            for r in range(8):
                cols = slice(0, 2) if r in short else slice(0, 5)
                s.present[r, cols] = True
                for name in ARRAYS[3:]:
                    getattr(s, name)[r, cols] = r + 1
        slot.settle(8, 5)
        for name in ARRAYS:
            np.testing.assert_array_equal(getattr(slot, name), getattr(fresh, name), err_msg=f"{name} {short}")
