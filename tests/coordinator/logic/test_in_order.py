"""Numbered messages taken in their sender's order, and shard findings merged that way.

A threaded Ray actor may run two calls of one caller in the other order; shard findings
that overtake each other must still give one core's verdicts, and the merge's judged step
must never go back."""
from __future__ import annotations

import numpy as np
import pytest
from logic_helpers import FakeClock
from test_sharded_verdicts import SETTINGS, _plain, _run, _scenario

from rankscope.coordinator.logic.align.in_order import InOrder, Senders
from rankscope.coordinator.logic.shards.merge import VerdictMerge
from rankscope.coordinator.logic.shards.shard import ShardFindings
from rankscope.coordinator.logic.shards.sharded import ShardedCore
from rankscope.coordinator.logic.verdict import Verdict


def test_a_message_that_overtook_an_earlier_one_waits_for_it() -> None:
    q = InOrder()
    assert q.put(1, "b") == [] and q.held() == 1
    assert q.put(2, "c") == []
    assert q.put(0, "a") == ["a", "b", "c"] and q.held() == 0
    assert q.put(1, "b again") == []  # already taken: a repeat is dropped
    late = InOrder(late="deliver")
    late.put(2, "c")
    assert late.skip() == ["c"] and late.next == 3
    assert late.put(1, "b") == ["b"]  # given up on, then came: late rather than lost
    with pytest.raises(ValueError, match="late: 'keep'"):
        InOrder(late="keep")


def test_a_reset_counts_from_its_number_and_drops_what_came_before() -> None:
    q = InOrder()
    q.put(3, "old")
    q.put(7, "after")
    q.reset(5)
    assert q.put(5, "snapshot") == ["snapshot"] and q.held() == 1
    assert q.put(4, "stale") == []
    assert q.put(6, "x") == ["x", "after"]


def test_senders_are_ordered_apart_and_a_restarted_one_counts_again() -> None:
    s = Senders(gap_s=3.0)
    assert s.put(0, "e1", 1, "0b", now=0.0) == [] and s.waiting()
    assert s.put(1, "f1", 0, "1a", now=0.0) == ["1a"]  # another sender is not held up
    assert s.put(0, "e1", 0, "0a", now=0.5) == ["0a", "0b"] and not s.waiting()
    s.put(0, "e1", 3, "0d", now=1.0)  # 2 never comes
    assert s.overdue(now=3.9) == []
    assert s.overdue(now=4.0) == ["0d"] and s.skipped == {0: 1} and not s.waiting()
    assert s.put(0, "e2", 0, "new", now=5.0) == ["new"]  # restarted: counts from 0
    assert s.put(0, "e1", 2, "old", now=5.0) == ["old"]  # its old self's last push: late, not lost
    s.put(0, "e2", 2, "held", now=6.0)
    assert s.overdue(now=6.0, force=True) == ["held"]


def test_a_gap_is_timed_from_the_senders_last_progress_not_its_first_hold() -> None:
    s = Senders(gap_s=3.0)
    s.put(0, "e", 1, "b", now=0.0)  # 0 missing
    s.put(0, "e", 3, "d", now=0.5)  # 2 missing too
    assert s.put(0, "e", 0, "a", now=2.0) == ["a", "b"]  # progress; "d" still held (for 2)
    assert s.overdue(now=3.5) == [] and s.waiting()
    assert s.overdue(now=5.0) == ["d"]


def test_the_merge_never_moves_a_judged_step_back() -> None:
    m = VerdictMerge(2)
    m.add(ShardFindings(0, judged={"j/0": 11}))
    m.add(ShardFindings(1, judged={"j/0": 11}))
    m.add(ShardFindings(0, judged={"j/0": 10}))  # an older push, taken late
    assert m.judged_through("j/0") == 11


class _Wire(ShardedCore):
    """The shards' pushes on a wire that reorders them: each tick delivers a random part of
    what is on it, in random order; ``ordered`` puts them through :class:`Senders` first."""

    def __init__(self, rng: np.random.Generator, ordered: bool, k: int) -> None:
        clock = FakeClock()
        super().__init__(SETTINGS, clock, k)
        self.clock, self.rng, self.ordered = clock, rng, ordered
        self.senders = Senders()
        self.sent = [0] * k
        self.wire: list[tuple[int, int, ShardFindings]] = []

    def _push(self, f: ShardFindings) -> None:
        self.wire.append((f.shard, self.sent[f.shard], f))
        self.sent[f.shard] += 1

    def _deliver(self, share: float) -> None:
        order = self.rng.permutation(len(self.wire))
        now = [self.wire[i] for i in order[: int(np.ceil(len(order) * share))]]
        self.wire = [w for w in self.wire if not any(w is x for x in now)]
        for shard, seq, f in now:
            for g in (self.senders.put(shard, "e", seq, f, self.clock()) if self.ordered else [f]):
                self._add(g)

    def tick(self, now: float | None = None) -> list[Verdict]:
        for s in self.shards:
            self._push(s.judge(now))
        self._deliver(float(self.rng.uniform(0.2, 1.0)))
        return self._file(self.merge.release(), now)

    def drain(self) -> list[Verdict]:
        for s in self.shards:
            self._push(s.judge(force=True))
        self._deliver(1.0)
        return self._file(self.merge.release(force=True), None)


def _reordered(sim, stream, k: int, seed: int, ordered: bool) -> list[tuple]:
    # Sorted: a delayed push changes when a step's verdicts are filed next to the crashes
    # and hangs, which pass at once, as the timing of real pushes does; not what is found.
    return sorted(_run(_Wire(np.random.default_rng(seed), ordered, k), sim, stream), key=repr)


def _one_core(sim, stream) -> list[tuple]:
    return sorted(_plain(sim, stream), key=repr)


@pytest.mark.parametrize("seed", range(12))
def test_findings_that_overtake_each_other_give_the_verdicts_of_one_core(seed) -> None:
    sim, stream = _scenario(seed)
    want = _one_core(sim, stream)
    for k in (2, 4):
        assert _reordered(sim, stream, k, seed, ordered=True) == want, f"{k} shards"


def test_a_push_that_overtakes_the_one_before_it_would_name_the_wrong_rank() -> None:
    # Shard 0 finds rank 1 at step 4, earlier in execution than shard 1's rank 3; its next
    # push (judged through 5) overtakes it. Taken as they come, step 4 is released with
    # rank 3 alone; in order, rank 1 is named.
    first = Verdict("outlier", 1, 4, "a", 3, "forward", "j/0")
    later = Verdict("outlier", 3, 4, "b", 10, "grad_local", "j/0")
    pushes = [(0, 1, ShardFindings(0, judged={"j/0": 5})),
              (1, 0, ShardFindings(1, steps=[(4, later)], judged={"j/0": 5})),
              (0, 0, ShardFindings(0, steps=[(4, first)], judged={"j/0": 4}))]
    named = {}
    for ordered in (False, True):
        m, senders, out = VerdictMerge(2), Senders(), []
        for shard, seq, f in pushes:
            for g in (senders.put(shard, "e", seq, f, 0.0) if ordered else [f]):
                m.add(g)
            out += m.release()
        named[ordered] = [(v.rank, v.step) for v in out]
    assert named[False][0] == (3, 4)
    assert named[True] == [(1, 4)]
