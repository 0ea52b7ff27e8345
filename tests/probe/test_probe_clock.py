"""The probe's clock on the training thread: nested entries count once, waiting for the
step's own queued work does not count, and a lap inside an entry splits it."""
from __future__ import annotations

import time

from rankscope.probe.vitals.probe_clock import ProbeClock


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_nested_entries_count_once_and_waits_are_taken_back():
    c = ProbeClock()
    with c:
        busy(0.02)
        with c:  # the step's end told from inside the optimizer's hook
            busy(0.02)
        c.discount(0.015)  # a wait for the device inside the entry
    busy(0.03)  # training's own time: not counted
    got = c.lap()
    assert 0.02 <= got < 0.035, got
    assert c.lap() == 0.0


def test_a_lap_inside_a_running_entry_splits_it_between_steps():
    c = ProbeClock()
    with c:
        busy(0.02)
        first = c.lap()  # the step's accounting, taken from inside the hook that ends it
        busy(0.01)
    second = c.lap()
    assert 0.02 <= first < 0.03 and 0.01 <= second < 0.02, (first, second)
    c.discount(1.0)  # outside any entry: nothing to take back from
    assert c.lap() == 0.0
