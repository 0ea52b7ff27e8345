"""The probe's waits for MindSpore's queue: run by a waiter thread of a lower priority
while the training thread sleeps, so a spinning ``sync`` does not take a core
from the kernels waited for; from any other thread, ``sync`` is called in place."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from rankscope.probe.tensors import device_wait
from rankscope.probe.tensors.stats import wait_for_device


def _tid_of(name: str) -> int:
    return next(t.native_id for t in threading.enumerate() if t.name == name)


def test_the_wait_runs_on_a_lowered_waiter_thread_not_the_caller():
    ran_on: list[str] = []
    device_wait.wait(lambda: ran_on.append(threading.current_thread().name))
    assert ran_on == ["rankscope-device-wait"]
    waiter = device_wait._waiter[0]  # noqa: SLF001
    tid = _tid_of("rankscope-device-wait")
    assert os.getpriority(os.PRIO_PROCESS, tid) >= device_wait.WAITER_NICE
    assert waiter.priority == f"nice {os.getpriority(os.PRIO_PROCESS, tid)}"
    # The caller's own scheduling is untouched.
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < device_wait.WAITER_NICE


def test_an_error_in_the_wait_is_raised_in_the_thread_that_waited():
    def broken() -> None:
        raise RuntimeError("kernel failed: the queue's error")

    with pytest.raises(RuntimeError, match="the queue's error"):
        device_wait.wait(broken)
    ran: list[bool] = []
    device_wait.wait(lambda: ran.append(True))  # the waiter goes on serving
    assert ran == [True]


def test_a_wait_from_another_thread_is_made_in_place():
    ran_on: list[str] = []
    t = threading.Thread(target=device_wait.wait, args=(lambda: ran_on.append(threading.current_thread().name),),
                         name="serving-worker")
    t.start()
    t.join(10)
    assert ran_on == ["serving-worker"]


def test_a_forked_child_gets_a_waiter_of_its_own():
    device_wait.wait(lambda: None)
    first = device_wait._waiter[0]  # noqa: SLF001
    first.pid = -1  # what a forked child sees: its parent's object, whose thread is not its own
    ran_on: list[str] = []
    device_wait.wait(lambda: ran_on.append(threading.current_thread().name))
    assert device_wait._waiter[0] is not first and ran_on == ["rankscope-device-wait"]  # noqa: SLF001


def test_mindspore_queue_is_drained_through_the_waiter():
    ms = pytest.importorskip("mindspore")
    from mindspore import ops
    ms.set_context(mode=ms.PYNATIVE_MODE)
    rs = np.random.RandomState(0)
    a = rs.randn(128, 128).astype(np.float32) / 16
    x = ms.Tensor(a)
    for _ in range(20):
        x = ops.matmul(x, ms.Tensor(a))
    device_wait.wait(lambda: None)
    served = device_wait._waiter[0].served  # noqa: SLF001
    wait_for_device()
    assert device_wait._waiter[0].served == served + 1  # noqa: SLF001
    want = a
    for _ in range(20):
        want = want @ a
    np.testing.assert_allclose(x.asnumpy(), want, rtol=1e-3, atol=1e-6)
