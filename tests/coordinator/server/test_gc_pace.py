"""Full collections paced by the ingest loop: one after a judged step, then none until the
pace allows, the surviving heap frozen in between (and unfrozen for the next full one)."""
from __future__ import annotations

import gc
import weakref

from rankscope.coordinator.server.gc_pace import GcPacer


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_judged_step_collects_and_freezes_then_waits_for_the_pace() -> None:
    now = [100.0]
    pacer = GcPacer(every_s=60.0, clock=lambda: now[0])
    try:
        dead = _cycle()
        pacer.judged()
        assert dead() is None  # the full collection found the cycle
        assert pacer.collections == 1 and gc.get_freeze_count() > 0
        kept = _Node()  # survives, and is frozen by the next full collection
        now[0] += 59.0
        pacer.judged()
        assert pacer.collections == 1  # not yet
        now[0] += 1.0
        pacer.judged()
        assert pacer.collections == 2 and gc.get_freeze_count() > 0
        # A cycle of objects frozen while alive is found by the next paced collection,
        # which unfreezes first: nothing frozen is kept for ever.
        node = _Node()
        node.other = _Node()
        node.other.other = node
        ref = weakref.ref(node)
        now[0] += 60.0
        pacer.judged()  # due: collects, and freezes the (live) cycle
        del node
        gc.collect()  # an ordinary full collection skips the frozen heap
        assert ref() is not None
        now[0] += 60.0
        pacer.judged()
        assert ref() is None and pacer.collections == 4
        assert kept.other is None
    finally:
        gc.unfreeze()
