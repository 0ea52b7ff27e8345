"""Serving the console from a thread of the process that holds the coordinator handle
(``rankscope launch --console`` or ``rankscope console``), on its own event loop."""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
from pathlib import Path
from typing import Any

from rankscope.coordinator.console import auth
from rankscope.coordinator.console.app import ConsoleApp
from rankscope.coordinator.console.feed import Feed, encode
from rankscope.coordinator.console.grid import GridWindow, with_grid
from rankscope.coordinator.console.priority import yield_cpu
from rankscope.coordinator.console.view import page_snapshot
from rankscope.coordinator.server.service_console import GRID_STEPS

log = logging.getLogger(__name__)

#: Loopback unless told otherwise: the console controls the job.
DEFAULT_HOST = "127.0.0.1"


def console_line(url: str) -> str:
    """The one line other tools may read the console's address from."""
    return f"[rankscope] console: {url}"


class ConsoleServer:
    """``backend``: the coordinator (``console``, ``control``). ``port`` 0: any free one."""

    def __init__(self, backend: Any, export_dir: Path | None, *, host: str = DEFAULT_HOST, port: int = 0,
                 read_only: bool = False, job: str | None = None, interval_s: float | None = None) -> None:
        self.host, self.port = host, port
        self.export_dir = export_dir
        self.token = auth.new_token()
        kw = {} if interval_s is None else {"interval_s": interval_s}
        self.grid = GridWindow(GRID_STEPS)
        self.feed = Feed(lambda: backend.console("snapshot", self.snapshot_args()), render=self.render, **kw)
        self.app = ConsoleApp(backend, self.feed, self.token, export_dir, read_only=read_only, job=job)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    def read_status(self, coordinator: Any) -> dict:
        """The launch's own status poll, read as the console's snapshot (a superset of the
        status) and shown on the pages: one read of the coordinator a second, not two."""
        if not self.feed.wanted():
            return coordinator.status(timeout=10)  # no page open: nothing to show it on
        snap = coordinator.console("snapshot", self.snapshot_args(), timeout=10)
        try:
            self.feed.offer(snap)
        except Exception:  # noqa: BLE001 - the page's trouble never costs the launch its status
            log.debug("console: a snapshot could not be shown", exc_info=True)
        return snap

    def snapshot_args(self) -> dict:
        """Only the grid's steps the console does not hold yet."""
        return {"steps": GRID_STEPS, "since": self.grid.since()}

    def render(self, snapshot: dict) -> bytes:
        """The page's JSON: the coordinator's snapshot with the grid's new steps merged into
        the console's window, whose columns were encoded as they came."""
        snap = dict(snapshot)
        self.grid.merge(snap.pop("grid", None) or {})
        return with_grid(encode(page_snapshot(snap, self.export_dir)), self.grid.encoded())

    @property
    def url(self) -> str:
        shown = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{shown}:{self.port}/?token={self.token}"

    def start(self, timeout_s: float = 20.0) -> str:
        """Bind and serve; the URL (with the token). OSError naming the address if the bind fails."""
        self._thread = threading.Thread(target=self._serve, name="rankscope-console", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise OSError(f"the console did not start within {timeout_s:g} s")
        if self._error is not None:
            raise OSError(f"the console could not listen on {self.host}:{self.port}: {self._error}")
        self.feed.on_new = lambda _v, _d: self.app.new_snapshot(self._loop)
        self.feed.start()
        return self.url

    def _serve(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from aiohttp import web
        yield_cpu()
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        # The coordinator calls run here: they wait on the coordinator, at the same priority.
        loop.set_default_executor(ThreadPoolExecutor(4, "rankscope-console-call", initializer=yield_cpu))
        try:
            self._runner = web.AppRunner(self.app.build(), access_log=None, handle_signals=False, shutdown_timeout=2.0)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # the free port picked for 0
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
            if self._runner is not None:
                loop.run_until_complete(self._runner.cleanup())
            loop.close()
            self._started.set()
            return
        self._started.set()
        loop.run_forever()
        # A coordinator call still running in the default executor is not waited for
        # past its own timeout.
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    async def _close(self) -> None:
        self.app.close_streams()
        await self._runner.cleanup()

    def stop(self) -> None:
        """End the open event streams, close the socket, stop the thread (idempotent)."""
        self.feed.stop()
        loop = self._loop
        if loop is not None and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._close(), loop).result(15)
            except Exception:  # noqa: BLE001 - stopping anyway
                pass
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
