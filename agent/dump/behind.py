"""Writing the local dump off the training thread.

A step's dump is three small files in a new folder: a few directory and file system
calls whose time depends on the disk, not on the step. On a shared file system (where
cluster dumps usually go) one of them can take longer than a step. The default watch's
budget is a few percent of a step, so under launch its dump is written behind the step
by one thread, in order; the training thread only hands the step over.

What is handed over is on disk when :meth:`WriteBehind.drain` returns: the writer
drains before anything reads its folders (an incident's export, a rank's rename), at
close, and at the process's exit (a zero-code rank is never closed, and its thread is a
daemon that the interpreter would stop mid-step: a loaded machine lost the last step's
``dump.json`` that way). A process killed with SIGKILL loses the steps still queued
(normally none: a step is written in a few milliseconds); the node agent already holds
them, sent as they were recorded.
"""
from __future__ import annotations

import atexit
import queue
import threading
from typing import Any, Callable

#: Steps that may wait to be written before the training thread waits for the disk, as
#: a synchronous writer would on every step.
DEPTH = 64
#: How long the process's exit waits for the steps still queued: a disk that hangs must
#: not hold the exit for longer.
EXIT_WAIT_S = 10.0


class WriteBehind:
    def __init__(self, write: Callable[[Any], None], depth: int = DEPTH,
                 name: str = "rankscope-dump-writer") -> None:
        self._write = write
        self._queue: queue.Queue = queue.Queue(depth)
        self._name = name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, item: Any) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
                atexit.register(self._at_exit)
        self._queue.put(item)

    def drain(self) -> None:
        """Return once everything submitted so far is written."""
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._queue.join()

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued, then stop the thread (``timeout``: wait no longer)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        atexit.unregister(self._at_exit)
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        thread.join(timeout)

    def _at_exit(self) -> None:
        self.close(EXIT_WAIT_S)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(item)
            except Exception:  # noqa: BLE001 - the write reports its own failures; the thread lives on
                pass
            finally:
                self._queue.task_done()
