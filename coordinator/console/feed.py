"""One reader of the coordinator for every open page.

The console asks the coordinator for a snapshot at most once per interval, whatever the
number of pages, and only while some page wants one: pages are served the same encoded
bytes. So twenty open pages cost the coordinator what one does, and none costs it
anything once they are closed.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from rankscope.coordinator.console.priority import yield_cpu

#: Seconds between two snapshots while a page is open.
INTERVAL_S = 1.0
#: A page that asked within this many seconds still counts as open (an event stream
#: renews it on every snapshot it is sent).
IDLE_S = 10.0
#: At most this share of the coordinator's time goes to snapshots: a snapshot that took
#: 60 ms (a large job, a busy coordinator) is read again after 1.2 s, not 1 s.
MAX_SHARE = 0.05


def encode(value: Any) -> bytes:
    return json.dumps(value, default=str, allow_nan=False, separators=(",", ":")).encode()


class Feed:
    """``source()`` returns a snapshot or raises; ``render(snapshot)`` makes the bytes the
    pages are sent (JSON by default); ``on_new(version, data)`` is called on the feed's
    thread with each snapshot that differs from the last."""

    def __init__(self, source: Callable[[], Any], on_new: Callable[[int, bytes], None] | None = None,
                 interval_s: float = INTERVAL_S, idle_s: float = IDLE_S,
                 clock: Callable[[], float] = time.monotonic, render: Callable[[Any], bytes] = encode) -> None:
        self.source, self.on_new, self.render = source, on_new, render
        self.interval_s, self.idle_s, self.clock = interval_s, idle_s, clock
        self.version, self.data = 0, encode({"waiting": "no snapshot yet"})
        self.reads = 0  # snapshots asked of the coordinator (the cost the pages put on it)
        self.last_read_s = 0.0  # how long the last one took, answer included
        self._wanted_at = -float("inf")
        self._offered_at = -float("inf")
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._pending: Any = None  # an offered snapshot the feed's thread has not encoded yet

    def want(self) -> None:
        """A page is open: keep snapshots coming (and take one now if none is fresh)."""
        idle = self.clock() - self._wanted_at > self.idle_s
        self._wanted_at = self.clock()
        if idle:
            self._wake.set()

    def wanted(self) -> bool:
        """Whether a page is open (asked within the idle limit)."""
        return self.clock() - self._wanted_at <= self.idle_s

    def latest(self) -> tuple[int, bytes]:
        with self._lock:
            return self.version, self.data

    def offer(self, value: Any) -> None:
        """A snapshot read by someone else (the launch's own poll): published as if read
        here, and the feed's own reads pause while such offers keep coming. Encoded on the
        feed's thread, which yields the CPU to the job (rankscope.coordinator.console.priority),
        not on the caller's."""
        self._offered_at = self.clock()
        if self._thread is None or not self._thread.is_alive():
            self._publish(self.render(value))
            return
        with self._lock:
            self._pending = value
        self._wake.set()

    def _publish_offered(self) -> None:
        with self._lock:
            value, self._pending = self._pending, None
        if value is not None:
            self._publish(self.render(value))

    def poll_once(self) -> bool:
        """Read one snapshot; True when it differs from the last one."""
        self.reads += 1
        t0 = time.perf_counter()
        try:
            data = self.render(self.source())
            self.last_read_s = time.perf_counter() - t0
            self._error = None
        except Exception as exc:  # noqa: BLE001 - shown on the page, the console stays up
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if why == self._error:
                return False
            self._error = why
            data = encode({"error": f"the coordinator did not answer: {why}"})
        return self._publish(data)

    def _publish(self, data: bytes) -> bool:
        with self._lock:
            if data == self.data:
                return False
            self.version += 1
            self.data = data
            version = self.version
        if self.on_new is not None:
            try:
                self.on_new(version, data)
            except Exception:  # noqa: BLE001 - the pages read latest() anyway
                pass
        return True

    def wait_s(self) -> float:
        """Seconds until the next read: the interval, longer when reads are slow."""
        return max(self.interval_s, self.last_read_s / MAX_SHARE)

    def _run(self) -> None:
        yield_cpu()
        while not self._stop.is_set():
            self._publish_offered()
            if self.clock() - self._offered_at <= 2 * self.wait_s():
                self._wake.wait(self.wait_s())  # the launch's own poll is feeding the pages
                self._wake.clear()
            elif self.wanted():
                self.poll_once()
                self._stop.wait(self.wait_s())
            else:
                self._wake.wait(self.interval_s)
                self._wake.clear()

    def start(self) -> "Feed":
        self._thread = threading.Thread(target=self._run, name="rankscope-console-feed", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
