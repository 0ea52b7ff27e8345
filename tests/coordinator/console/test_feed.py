"""The console's one reader: a new version only when the snapshot changed, the
coordinator's failure shown once, nothing read while no page is open."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from rankscope.coordinator.console.feed import Feed


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_versions_follow_changes_and_failures_are_said_once():
    answers = [{"step": 1}, {"step": 1}, RuntimeError("actor died\ntraceback..."), RuntimeError("actor died"),
               {"step": 2}]
    seen = []

    def source():
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    feed = Feed(source, on_new=lambda v, d: seen.append((v, json.loads(d))))
    assert [feed.poll_once() for _ in range(5)] == [True, False, True, False, True]
    assert seen == [(1, {"step": 1}), (2, {"error": "the coordinator did not answer: actor died"}), (3, {"step": 2})]
    assert feed.latest() == (3, b'{"step":2}') and feed.reads == 5


def test_no_page_no_reads_and_a_page_wakes_the_reader():
    clock = Clock()
    feed = Feed(lambda: {"t": clock.t}, interval_s=0.02, idle_s=5.0, clock=clock).start()
    try:
        time.sleep(0.2)
        assert feed.reads == 0  # nobody asked
        feed.want()
        deadline = time.monotonic() + 5
        while feed.reads < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert feed.reads >= 3
        clock.t += 6.0  # the page went away longer ago than idle_s
        time.sleep(0.1)
        before = feed.reads
        time.sleep(0.2)
        assert feed.reads == before
    finally:
        feed.stop()


def test_slow_snapshots_are_read_less_often():
    def slow():
        time.sleep(0.03)
        return {"x": 1}

    feed = Feed(slow, interval_s=0.5)
    assert feed.wait_s() == 0.5
    feed.poll_once()
    assert feed.last_read_s >= 0.03 and feed.wait_s() >= 0.03 / 0.05  # at most 5% of the coordinator's time


def test_offers_from_the_launchs_own_poll_stand_in_for_reads():
    clock = Clock()
    reads = []
    feed = Feed(lambda: reads.append(1) or {"read": True}, interval_s=0.02, clock=clock).start()
    try:
        feed.want()
        assert feed.wanted()
        for i in range(20):
            feed.offer({"offered": i})
            time.sleep(0.01)
        deadline = time.monotonic() + 5.0  # encoded on the feed's own (lowest-priority) thread
        while feed.latest()[1] != b'{"offered":19}' and time.monotonic() < deadline:
            time.sleep(0.01)
        assert feed.latest()[1] == b'{"offered":19}'
        assert len(reads) <= 2  # at most the one before the first offer arrived
        clock.t += 11.0
        assert not feed.wanted()
    finally:
        feed.stop()


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread priorities are Linux's")
def test_the_console_s_threads_yield_the_cpu_and_the_process_s_others_do_not():
    from rankscope.coordinator.console.priority import NICE
    from rankscope.coordinator.console.server import ConsoleServer

    class Backend:
        def console(self, what, args):
            return {"job": "j"}

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    server = ConsoleServer(Backend(), None, interval_s=0.05)
    server.start()
    try:
        server.feed.want()
        names = {"rankscope-console", "rankscope-console-feed"}
        found = {t.name: os.getpriority(os.PRIO_PROCESS, t.native_id) for t in threading.enumerate() if t.name in names}
        assert found == {n: NICE for n in names}
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    finally:
        server.stop()
