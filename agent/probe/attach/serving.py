"""Zero-code attach for inference servers: find the model a worker only ever calls forward.

A serving worker has no grad function and no optimizer, so nothing of training marks
its model or its steps. Until one of those appears, every Cell's ``__call__`` is
watched (one class-level wrapper, removed as soon as the model is found or the
process turns out to train): the first Cell holding parameters that is called from
outside any other Cell is the root the decode loop drives. It is then watched like
``PrecisionDebugger.start(model, token_range=...)``: its forward calls are the tokens,
``cluster.token_range`` chooses which are recorded.

**Request-batch boundaries** (one step per batch), decided from the root's outermost
calls alone, so every worker given the same requests cuts them identically (a timer
would not: a worker stalled on a loaded host would split a batch its peers did not).
The root's first tensor argument is read as (batch, length). A call continues the
current batch when its batch size is unchanged and its length is 1 (a decode step
with a KV cache) or one more than the previous call's (a decode step re-reading the
whole sequence); any other call is the prefill of a new batch. The step of the
previous batch ends right then, before the new prefill runs, on the worker's own
thread (so a pause holds the worker there, between batches); the last batch ends at
exit. A root whose first argument has no shape never starts a new batch.

Never breaks the server: nothing here runs while MindSpore compiles (a GRAPH-mode
root is reported, not hooked), every hook swallows its own errors. The one exception
that reaches the worker is ``RankscopeTerminated`` at a batch boundary, when the job is
terminated (``on_divergence: terminate`` or ``rankscope terminate``), as in training.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, Callable

from rankscope.probe.graph import compile_guard
from rankscope.probe.gate import RankscopeTerminated

#: ``token_range`` when the config gives none: every forward call is recorded.
ALL_TOKENS = (0, 2**31 - 1)


def input_shape(args: tuple, kwargs: dict) -> tuple[int, int] | None:
    """(batch, length) of the root call's first tensor argument; None without one."""
    for value in (*args, *kwargs.values()):
        shape = getattr(value, "shape", None)
        if shape is None or not hasattr(value, "dtype"):
            continue
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            return None
        if not dims:
            return None
        return (1, dims[0]) if len(dims) == 1 else (dims[0], dims[1])
    return None


class BatchBoundary:
    """Pure logic: does a root call begin a new request batch?"""

    def __init__(self) -> None:
        self.prev: tuple[int, int] | None = None
        self.calls = 0

    def new_batch(self, shape: tuple[int, int] | None) -> bool:
        prev, first = self.prev, self.calls == 0
        self.calls += 1
        if shape is None:
            return first
        self.prev = shape
        if first or prev is None:
            return True
        (b0, l0), (b1, l1) = prev, shape
        return not (b1 == b0 and (l1 == 1 or l1 == l0 + 1))


class ServingFinder:
    """The class-level ``Cell.__call__`` wrapper that finds the root, then goes away."""

    def __init__(self, wanted: Callable[[], bool], found: Callable[[Any, tuple, dict], None]) -> None:
        self.wanted, self.found = wanted, found
        self._local = threading.local()
        self._orig: Any = None
        self._cls: Any = None

    def install(self) -> None:
        from mindspore import nn
        if self._orig is not None:
            return
        cls, orig, finder = nn.Cell, nn.Cell.__call__, self

        def __call__(cell, *args, **kwargs):  # noqa: N807, ANN001
            local = finder._local
            depth = getattr(local, "depth", 0)
            if depth == 0:
                finder._consider(cell, args, kwargs)
            local.depth = depth + 1
            try:
                return orig(cell, *args, **kwargs)
            finally:
                local.depth = depth

        __call__.__wrapped__ = orig  # type: ignore[attr-defined]
        self._cls, self._orig = cls, orig
        cls.__call__ = __call__

    def uninstall(self) -> None:
        if self._orig is not None and self._cls is not None:
            self._cls.__call__ = self._orig
        self._orig = None

    def _consider(self, cell: Any, args: tuple, kwargs: dict) -> None:
        try:
            if self._orig is None or compile_guard._depth:  # noqa: SLF001 - never inside a compile
                return
            if not self.wanted():
                self.uninstall()
                return
            if next(iter(cell.get_parameters()), None) is None:
                return  # a loss, an activation: not a model
            self.uninstall()
            self.found(cell, args, kwargs)
        except Exception:  # noqa: BLE001 - finding a model never breaks the call
            self.uninstall()


class ServingDriver:
    """Drives the debugger from the root's calls: a step per request batch."""

    def __init__(self, dbg: Any, root: Any, token_range: tuple[int, int] | None) -> None:
        self.dbg, self.root = dbg, root
        self.token_range = list(token_range or ALL_TOKENS)
        self.boundary = BatchBoundary()
        self.batches = 0
        self.retired = False
        self.errors = 0
        # Registered before start(): it must run before the token counter's pre-hook,
        # so a new batch's count restarts before its prefill is counted.
        self._handle = compile_guard.register(root, self._pre, pre=True, prepend=True, with_kwargs=True)
        dbg.start(root, token_range=self.token_range)
        atexit.register(self._at_exit)
        _at_child_exit(self._at_exit)

    def _pre(self, cell: Any, args: tuple, kwargs: dict) -> None:
        if self.retired:
            return None
        try:
            if self.boundary.new_batch(input_shape(args, kwargs or {})):
                if self.batches:
                    self._end_batch()
                    self.dbg.start(self.root, token_range=self.token_range)
                self.batches += 1
        except RankscopeTerminated:
            raise  # the operator's (or the config's) terminate: the one exception meant for the worker
        except Exception as exc:  # noqa: BLE001 - the server goes on
            self.errors += 1
            self.dbg.recorder.error("serving batch boundary", exc)
        return None

    def _end_batch(self) -> None:
        dbg = self.dbg
        dbg.stop()
        first = dbg.current_step == 0 and self.batches == 1
        dbg.step()
        if first:  # after the client's exit handler, so the last batch is sent before it closes
            atexit.unregister(self._at_exit)
            atexit.register(self._at_exit)

    def retire(self) -> None:
        """The process trains after all: its steps come from training from now on."""
        if self.retired:
            return
        self.retired = True
        try:
            self._handle.remove()
            dbg = self.dbg
            if dbg._token_hooks is not None:  # noqa: SLF001
                dbg._token_hooks.remove()  # noqa: SLF001
            dbg._token = dbg._token_hooks = None  # noqa: SLF001
            dbg.stop()
            forget_open_step(dbg)  # the open batch's calls are no part of the first training step
        except Exception as exc:  # noqa: BLE001
            self.dbg.recorder.error("retiring the serving watch", exc)

    def _at_exit(self, close_client: bool = False) -> None:
        if self.retired or self.dbg.closed or not self.batches:
            return
        try:
            self.retired = True
            self.dbg.gate.closing = True  # the server is leaving: no next batch begins
            self._end_batch()
            if close_client and self.dbg.client is not None:
                self.dbg.client.close()  # its own exit handler will not run: send the batch now
        except BaseException:  # noqa: BLE001 - exiting anyway
            pass


def forget_open_step(dbg: Any) -> None:
    """Drop what the debugger's current step recorded so far, keeping its number."""
    r = dbg.recorder
    r.take()
    r.builder.clear()
    r.token = -1
    dbg._save_count.clear()  # noqa: SLF001
    dbg.cells.new_step()
    dbg.apis.new_step()


def _at_child_exit(fn: Callable[..., None]) -> None:
    """A multiprocessing worker leaves through ``os._exit`` when forked (no atexit), and
    runs multiprocessing's finalizers first either way: end the last batch there."""
    import multiprocessing
    from multiprocessing import util
    if multiprocessing.parent_process() is not None:
        util.Finalize(None, fn, kwargs={"close_client": True}, exitpriority=100)


def found_line(cls_name: str) -> str:
    return (f"worker (pid {os.getpid()}): serving model {cls_name} found, watched forward-only, "
            "one step per request batch")


def retired_line(cls_name: str) -> str:
    return (f"worker (pid {os.getpid()}): {cls_name} is trained after all (a grad function or "
            "optimizer appeared): watched as training from here, its forward-only calls before that left out of the training steps")


def say(text: str) -> None:
    # One write: ranks share the launcher's stderr, and print's separate newline write
    # lets another rank's line land in the middle.
    sys.stderr.write(f"[rankscope] {text}\n")
    sys.stderr.flush()
