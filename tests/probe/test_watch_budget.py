"""The default watch's budget: K planned from measured times, pieces rotated so replicas
that plan different K still compare every piece."""
from __future__ import annotations

import pytest

from rankscope.probe.vitals.budget import FLOOR_BYTES, PLAN_SHARE, REPLAN_EVERY, WARMUP, WatchBudget, due, pow2_at_least


def _feed(b: WatchBudget, steps: int, step_s: float, vital_s: float, per_piece_s: float, pieces: int,
          piece_bytes: int = 4 << 20) -> None:
    for s in range(steps):
        done = sum(1 for i in range(pieces) if due(i, s, b.every))
        b.note_step(step_s + vital_s + done * per_piece_s, vital_s, done * per_piece_s, done, pieces,
                    cycle_bytes=pieces * piece_bytes)


def test_everything_every_step_when_it_fits():
    b = WatchBudget(0.05)
    _feed(b, 40, step_s=0.100, vital_s=0.001, per_piece_s=0.0001, pieces=20)  # 2 ms of 5 ms
    assert b.every == 1


def test_k_is_the_smallest_power_of_two_that_fits_the_budget():
    b = WatchBudget(0.05)
    # 100 ms steps: 5 ms budget, of which the plan fills 80% (4 ms); 1 ms vital -> 3 ms for
    # 64 pieces of 0.5 ms (32 ms a cycle) -> K = 16 (8 would take 4 ms)
    _feed(b, 60, step_s=0.100, vital_s=0.001, per_piece_s=0.0005, pieces=64)
    assert b.every == 16
    share = b.share()
    assert share is not None and share <= PLAN_SHARE * 0.05 * 1.01


def test_k_is_bounded_by_the_pieces_when_the_vital_signs_alone_spend_the_budget():
    b = WatchBudget(0.05)
    _feed(b, 40, step_s=0.100, vital_s=0.010, per_piece_s=0.010, pieces=12)
    assert b.every == pow2_at_least(12) == 16


def test_a_small_model_is_fingerprinted_every_step_even_when_its_steps_are_short():
    b = WatchBudget(0.05)
    # 4 ms steps: 5% is 0.2 ms, the whole cycle costs 2 ms, but it is 20 x 1 MB of tensors
    _feed(b, 40, step_s=0.004, vital_s=0.0005, per_piece_s=0.0001, pieces=20, piece_bytes=1 << 20)
    assert 20 << 20 <= FLOOR_BYTES and b.every == 1


def test_k_is_first_planned_after_the_warmup_then_every_few_steps():
    b = WatchBudget(0.05)
    _feed(b, WARMUP - 1, step_s=0.100, vital_s=0.001, per_piece_s=0.001, pieces=64)
    assert b.every == 1  # not planned yet: the first steps compile
    _feed(b, 1, step_s=0.100, vital_s=0.001, per_piece_s=0.001, pieces=64)
    assert b.every > 1
    planned = b.every
    # a faster machine from now on: K halves only at the next plan, with room to spare
    _feed(b, REPLAN_EVERY - 1, step_s=10.0, vital_s=0.001, per_piece_s=0.001, pieces=64)
    assert b.every == planned


@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_a_piece_due_under_2k_is_due_under_k_at_the_same_step(k):
    for i in range(50):
        for s in range(4 * k):
            if due(i, s, 2 * k):
                assert due(i, s, k)


def test_every_piece_is_due_once_per_k_steps():
    for k in (1, 2, 4, 8):
        for i in range(20):
            assert sum(due(i, s, k) for s in range(k)) == 1


def test_a_budget_outside_a_step_is_refused():
    with pytest.raises(ValueError, match="budget fraction"):
        WatchBudget(0)
    with pytest.raises(ValueError, match="budget fraction"):
        WatchBudget(1.5)
