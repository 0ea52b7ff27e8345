"""The console's web app (aiohttp, which ``ray[default]`` already brings): the page, its
assets, a snapshot and an event stream of snapshots, the tensor queries, the training
controls and the incident folders' files.

The app talks to the coordinator only through ``backend`` (``console(what, args)`` and
``control(verb, args)``, as :class:`~rankscope.coordinator.server.client.Coordinator`
has them), in a worker thread, so a slow coordinator never blocks the page's loop. Every
request needs the token (:mod:`.auth`); a malformed one gets a 4xx naming what was
wrong, a coordinator that refused or failed a 400 or 502 with its reason.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from rankscope.config.watchpoints import condition_params
from rankscope.coordinator.console import auth
from rankscope.coordinator.console.feed import Feed, encode

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
#: The control buttons' verbs; ``collect`` stays a CLI command (it moves dump files).
VERBS = ("pause", "resume", "step", "terminate", "export")
#: Seconds between two keep-alive comments on an idle event stream; under the feed's
#: IDLE_S, so an open page keeps the snapshots coming while nothing changes.
KEEPALIVE_S = 5.0
#: Files of the export folder run in a sandbox: a report (or anything else put there) must
#: not act as this console's page, which holds the token.
_FILE_HEADERS = {"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff"}
_ASSETS = {"console.js": "application/javascript", "values.js": "application/javascript", "console.css": "text/css"}


#: POSTs that change nothing in the job (their body is too large for a query string): a
#: read-only console answers them, still behind the token and the origin check.
POSTED_READS = frozenset({"/api/recheck"})


class Hub:
    """Wakes every open event stream when the feed has a new snapshot (on the app's loop)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def publish(self) -> None:
        old, self._event = self._event, asyncio.Event()
        old.set()

    def current(self) -> asyncio.Event:
        """Taken before reading the latest snapshot: a publish in between still wakes."""
        return self._event

    @staticmethod
    async def wait(event: asyncio.Event, timeout: float) -> None:
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass


class Recent:
    """Answers of the coordinator kept for ``ttl_s`` by what was asked: many pages asking
    the same thing within an interval cost the coordinator one read, as the snapshots do."""

    MAX = 64

    def __init__(self, ttl_s: float, clock: Any = time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self._kept: dict[tuple, tuple[float, bytes]] = {}

    def get(self, key: tuple) -> bytes | None:
        got = self._kept.get(key)
        return got[1] if got is not None and self.clock() - got[0] < self.ttl_s else None

    def put(self, key: tuple, body: bytes) -> bytes:
        if len(self._kept) >= self.MAX:
            now = self.clock()
            self._kept = {k: v for k, v in self._kept.items() if now - v[0] < self.ttl_s}
            if len(self._kept) >= self.MAX:
                self._kept.clear()
        self._kept[key] = (self.clock(), body)
        return body


class ConsoleApp:
    def __init__(self, backend: Any, feed: Feed, token: str, export_dir: Path | None, read_only: bool = False,
                 job: str | None = None) -> None:
        self.backend, self.feed, self.token = backend, feed, token
        self.export_dir = export_dir.resolve() if export_dir is not None else None
        self.read_only, self.job = read_only, job
        self.hub: Hub | None = None
        self.streams = 0
        self.closing = False
        self.cookie = auth.cookie_name(token)
        self.reads = Recent(feed.interval_s)

    # --- wiring -------------------------------------------------------------------------
    def build(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=1 << 20)
        app.router.add_get("/", self.index)
        app.router.add_get("/static/{name}", self.asset)
        app.router.add_get("/api/snapshot", self.snapshot)
        app.router.add_get("/api/events", self.events)
        app.router.add_get("/api/tensors", self.tensors)
        app.router.add_get("/api/tensor", self.tensor)
        app.router.add_post("/api/control/{verb}", self.control)
        app.router.add_post("/api/watchpoints", self.watchpoints)
        app.router.add_post("/api/recheck", self.recheck)
        app.router.add_post("/api/capture", self.capture)
        app.router.add_get("/api/capture", self.captured)
        app.router.add_get("/files/{path:.+}", self.file)
        app.on_startup.append(self._started)
        return app

    async def _started(self, _app: web.Application) -> None:
        self.hub = Hub()

    def close_streams(self) -> None:
        """On the app's loop: let every event stream end (the console is stopping)."""
        self.closing = True
        if self.hub is not None:
            self.hub.publish()

    def new_snapshot(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called from the feed's thread: wake the streams on the app's loop (gone once the
        console stopped; a read that outlived the stop has nobody to tell)."""
        if self.hub is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self.hub.publish)
            except RuntimeError:
                pass

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        query = request.query.get("token")
        if not auth.may_read(self.token, query, request.cookies.get(self.cookie), request.headers.get(auth.HEADER)):
            return _error(401, "this console needs its token: open the URL that `rankscope launch --console` "
                               "or `rankscope console` printed")
        if request.method == "POST":
            if self.read_only and request.path not in POSTED_READS:
                return _error(403, "this console is read-only (--read-only): its controls are off")
            why = auth.may_act(self.token, request.headers.get(auth.HEADER), request.headers.get("Origin"),
                               request.host)
            if why:
                return _error(403, why)
        try:
            resp = await handler(request)
        except web.HTTPException:
            raise
        except ValueError as exc:  # the coordinator or a parser refused the arguments
            return _error(400, str(exc))
        except Exception as exc:  # noqa: BLE001 - the coordinator is gone or failed: said, not raised
            log.debug("console request %s failed", request.path, exc_info=True)
            return _error(502, f"the coordinator did not answer: {exc}")
        if query:
            resp.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
        return resp

    # --- pages and data -----------------------------------------------------------------
    async def index(self, _request: web.Request) -> web.Response:
        html = (STATIC / "index.html").read_text()
        html = (html.replace("{{TOKEN}}", self.token).replace("{{READ_ONLY}}", "true" if self.read_only else "false")
                .replace("{{CONDITIONS}}", json.dumps(condition_params())))
        return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _ASSETS:
            return _error(404, f"no asset {name!r}")
        return web.Response(body=(STATIC / name).read_bytes(), content_type=_ASSETS[name])

    async def snapshot(self, _request: web.Request) -> web.Response:
        self.feed.want()
        _, data = self.feed.latest()
        return web.Response(body=data, content_type="application/json", headers={"Cache-Control": "no-store"})

    async def events(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await resp.prepare(request)
        self.streams += 1
        last = -1
        try:
            while not self.closing:
                self.feed.want()
                assert self.hub is not None
                woken = self.hub.current()
                version, data = self.feed.latest()
                if version != last:
                    await resp.write(b"data: " + data + b"\n\n")
                    last = version
                else:
                    await resp.write(b": idle\n\n")
                await self.hub.wait(woken, KEEPALIVE_S)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        except Exception:  # noqa: BLE001 - the response has begun: end it, never answer twice
            log.debug("console event stream ended", exc_info=True)
        finally:
            self.streams -= 1
        return resp

    async def tensors(self, request: web.Request) -> web.Response:
        args = {"group": request.query.get("group", ""), "step": _int_arg(request, "step")}
        key = ("tensors", args["group"], args["step"])
        body = self.reads.get(key)
        if body is None:  # pages open on one step ask the coordinator once an interval
            body = self.reads.put(key, encode(await self._call(self.backend.console, "tensors", args)))
        return web.Response(body=body, content_type="application/json")

    async def tensor(self, request: web.Request) -> web.Response:
        ranks = request.query.get("ranks", "")
        try:
            focus = [int(r) for r in ranks.split(",") if r.strip()]
        except ValueError:
            raise ValueError(f"ranks: {ranks!r} must be comma-separated rank ids") from None
        args = {"group": request.query.get("group", ""), "tensor": request.query.get("tensor", ""),
                "step": _int_arg(request, "step"), "ranks": focus}
        return _json(await self._call(self.backend.console, "tensor", args))

    # --- actions ------------------------------------------------------------------------
    async def control(self, request: web.Request) -> web.Response:
        verb = request.match_info["verb"]
        if verb not in VERBS:
            return _error(404, f"no control {verb!r}: one of {', '.join(VERBS)}")
        body = await _body(request)
        args: dict[str, Any] = {"job": self.job} if self.job else {}
        if verb == "step":
            n = body.get("n", 1)
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"step: n must be an integer >= 1, got {n!r}")
            args["n"] = n
        if verb == "terminate" and body.get("confirm") is not True:
            raise ValueError('terminate: send {"confirm": true}; it ends the job on every rank')
        answer = await self._call(self.backend.control, verb, args)
        self.feed.want()
        return _json(answer)

    async def watchpoints(self, request: web.Request) -> web.Response:
        body = await _body(request)
        return _json(await self._call(self.backend.console, "watchpoints", {"rules": body.get("rules")}))

    async def recheck(self, request: web.Request) -> web.Response:
        body = await _body(request)
        return _json(await self._call(self.backend.console, "recheck", {"rules": body.get("rules")}))

    async def capture(self, request: web.Request) -> web.Response:
        """Ask ranks for a tensor's values at their next step (a control: it changes what
        the ranks write)."""
        body = await _body(request)
        args: dict[str, Any] = {"job": self.job} if self.job else {}
        args.update(tensor=body.get("tensor"), ranks=body.get("ranks"))
        answer = await self._call(self.backend.control, "capture", args)
        self.feed.want()
        return _json(answer)

    async def captured(self, request: web.Request) -> web.Response:
        """The kept captures (no ``id``), or one capture's window: ``a``, ``b`` (ranks),
        ``index`` (comma-separated, the leading dimensions), ``row``, ``col``."""
        args: dict[str, Any] = {}
        if request.query.get("id"):
            args["id"] = request.query["id"]
            for key in ("a", "b", "row", "col"):
                args[key] = _int_arg(request, key)
            raw = request.query.get("index", "")
            try:
                args["index"] = [int(i) for i in raw.split(",") if i.strip()] if raw else None
            except ValueError:
                raise ValueError(f"index: {raw!r} must be comma-separated integers") from None
        return _json(await self._call(self.backend.console, "capture", args))

    async def file(self, request: web.Request) -> web.StreamResponse:
        """A file of the export folder (an incident's report.html and what it links)."""
        if self.export_dir is None:
            return _error(404, "this console has no export folder to serve")
        rel = request.match_info["path"]
        path = (self.export_dir / rel).resolve()
        if self.export_dir not in path.parents or not path.is_file():
            return _error(404, f"no file {rel!r} in the export folder")
        return web.FileResponse(path, headers=_FILE_HEADERS)

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _json(value: Any) -> web.Response:
    return web.Response(body=encode(value), content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=encode({"error": message}), content_type="application/json")


async def _body(request: web.Request) -> dict:
    text = await request.text()
    if not text.strip():
        return {}
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the request body is not JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    return body


def _int_arg(request: web.Request, key: str) -> int | None:
    raw = request.query.get(key)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{key}: {raw!r} is not an integer") from None
