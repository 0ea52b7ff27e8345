"""Waiting for MindSpore's queue without taking a core from the kernels waited for.

MindSpore's ``sync`` spin-waits: the thread that calls it stays on a CPU until the queue
has drained. On a host whose cores MindSpore's own kernel threads fill (a CPU job), a
training thread spinning there takes a core from the very kernels it waits for. Measured
here (2 cores, 60 queued 1024x1024 matmuls): drained in 1.03-1.30 s while the training
thread spun in ``sync``, in 0.70-0.78 s when the same ``sync`` ran on a thread of the idle
scheduling class and the training thread slept on an event; at nice 10, 1.23-1.55 s against
0.84-1.05 s in a later run of the same. The hand-over costs ~18 µs against ~1 µs for a
``sync`` with nothing queued.

So the probe's waits on the training thread are made by one waiter thread that lowered
its own priority (:data:`WAITER_NICE`), while the training thread sleeps on an event. The
training thread's own scheduling is never touched. A wait from any other thread (a
MindSpore callback, a serving worker) calls ``sync`` directly, as before: handing it over
from a thread the queue may itself be waiting on could never return.
"""
from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable


class _Request:
    __slots__ = ("fn", "done", "error")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.error: BaseException | None = None


#: The waiter's nice value. Its CFS weight (110 against 1024) leaves the kernels it waits
#: for ~90% of a core it shares with them, while a waiter that has nothing to wait for
#: still gets its fair share of a contended core within one scheduling period. The idle
#: class (weight 3) would do the first as well, but where other work fills the cores
#: (another rank's kernels, a data loader) its wake-up could lag by many periods.
WAITER_NICE = 10


def lower_own_priority() -> str:
    """The calling thread to :data:`WAITER_NICE` (raising a nice value needs no privilege,
    and the waiter never climbs back); says what it got."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(WAITER_NICE, os.getpriority(os.PRIO_PROCESS, tid)))
        return f"nice {os.getpriority(os.PRIO_PROCESS, tid)}"
    except (AttributeError, OSError):
        return "unchanged"


class Waiter:
    """One daemon thread that runs a wait for the thread that asked, and wakes it."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self.pid = os.getpid()
        self.priority = ""
        self.served = 0
        self._thread = threading.Thread(target=self._run, name="rankscope-device-wait", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.priority = lower_own_priority()
        while True:
            req = self._requests.get()
            try:
                req.fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the thread that waits
                req.error = exc
            self.served += 1
            req.done.set()

    def usable(self) -> bool:
        return self.pid == os.getpid() and self._thread.is_alive()

    def wait(self, sync: Callable[[], Any]) -> None:
        req = _Request(sync)
        self._requests.put(req)
        req.done.wait()
        if req.error is not None:
            raise req.error


_waiter: list[Waiter] = []  # this process's, made at the first wait (again in a forked child)


def wait(sync: Callable[[], Any]) -> None:
    """Run ``sync`` (MindSpore's wait for its queue) so that the training thread sleeps
    through it rather than spinning."""
    if threading.current_thread() is not threading.main_thread():
        sync()
        return
    if not _waiter or not _waiter[0].usable():
        _waiter[:] = [Waiter()]
    _waiter[0].wait(sync)
