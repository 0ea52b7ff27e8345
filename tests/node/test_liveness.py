"""Silent is not hung when the process works: real processes, the real /proc reader."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

from rankscope.node.liveness import LivenessMonitor, read_stat

TIMEOUT_S = 1.0


def _watch_for(proc: subprocess.Popen, seconds: float) -> list:
    mon = LivenessMonitor("h", heartbeat_timeout_s=TIMEOUT_S)
    entry = SimpleNamespace(host="h", pid=proc.pid)
    mon.watch(entry)  # the last heartbeat: now
    lost, end = [], time.monotonic() + seconds
    while time.monotonic() < end and not lost:
        lost = mon.check([entry])
        time.sleep(0.1)
    return lost


def test_a_silent_rank_that_keeps_working_is_not_unresponsive():
    # What a rank looks like while MindSpore compiles a big graph: no heartbeat (the GIL is
    # held), the process busy on a core.
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert read_stat(busy.pid).cpu_ticks > 0
        assert _watch_for(busy, 4 * TIMEOUT_S) == []
    finally:
        busy.kill()
        busy.wait()


def test_a_stopped_rank_is_unresponsive_after_the_timeout():
    idle = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        os.kill(idle.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        [lost] = _watch_for(idle, 4 * TIMEOUT_S)
        assert lost.reason == "unresponsive" and TIMEOUT_S <= time.monotonic() - t0 < 3 * TIMEOUT_S
    finally:
        idle.kill()
        idle.wait()
