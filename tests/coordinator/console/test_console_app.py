"""The console's web layer on a real socket, against a stand-in coordinator (what the
coordinator answers is tested with the real one in tests/e2e/test_console_e2e.py): the
token gate, cross-site refusals, malformed requests, the export folder's files, and one
coordinator read per interval however many pages are open."""
from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from rankscope.coordinator.console import auth
from rankscope.coordinator.console.server import ConsoleServer, console_line

JOB = "job-secret-name"


class StandIn:
    """Answers as the coordinator would; counts what it was asked."""

    def __init__(self, export_dir: Path) -> None:
        self.reads = 0
        self.tree_reads = 0
        self.controls: list[tuple[str, dict]] = []
        self.rules: list = []
        self.fail: Exception | None = None
        self.inc_dir = export_dir / "incidents" / "inc-1"

    def console(self, what: str, args: dict) -> dict:
        if self.fail is not None:
            raise self.fail
        if what == "snapshot":
            self.reads += 1
            return {"job": JOB, "ranks": {"0": {"state": "running", "step": 3}},
                    "grid": {"g": {"ranks": [0], "steps": [1, 2], "deviation": [[0.0], [0.1]]}},
                    "incidents": [{"incident_id": "inc-1", "dir": str(self.inc_dir), "step": 2}],
                    "watchpoints": self.rules}
        if what == "tensors":
            self.tree_reads += 1
        if what == "watchpoints":
            if not isinstance(args.get("rules"), list):
                raise ValueError("console watchpoints: args.rules must be a list of watchpoint rules")
            self.rules = args["rules"]
            return {"watchpoints": self.rules}
        if what == "recheck":
            if args.get("rules") is not None and not isinstance(args["rules"], list):
                raise ValueError("console recheck: args.rules must be a list of watchpoint rules")
            self.rechecked = args.get("rules")
            return {"hits": [{"step": 2, "rank": 0}], "steps": [1, 2], "checked": 2}
        return {"what": what, **args}

    def control(self, verb: str, args: dict) -> dict:
        if self.fail is not None:
            raise self.fail
        self.controls.append((verb, args))
        return {"command": verb, "sent_to_agents": 1}


@pytest.fixture
def served(tmp_path):
    backend = StandIn(tmp_path)
    backend.inc_dir.mkdir(parents=True)
    (backend.inc_dir / "report.html").write_text("<html>the report</html>")
    (tmp_path / "secret.txt").write_text("outside")
    servers = []

    def start(**kw):
        s = ConsoleServer(backend, tmp_path / "incidents" if kw.pop("narrow", False) else tmp_path,
                          interval_s=0.05, **kw)
        url = s.start()
        servers.append(s)
        return s, url

    yield backend, start
    for s in servers:
        s.stop()


def request(server: ConsoleServer, method: str, path: str, body: object = None, headers: dict | None = None
            ) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    data = None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
    conn.request(method, path, body=data, headers=headers or {})
    resp = conn.getresponse()
    out = resp.status, dict(resp.getheaders()), resp.read()
    conn.close()
    return out


def act(server: ConsoleServer, path: str, body: object = None, **extra: str) -> tuple[int, dict, bytes]:
    return request(server, "POST", path, body if body is not None else {},
                   {auth.HEADER: server.token, "Origin": f"http://127.0.0.1:{server.port}", **extra})


def test_the_url_line_and_the_token_gate(served):
    backend, start = served
    server, url = start()
    assert console_line(url) == f"[rankscope] console: http://127.0.0.1:{server.port}/?token={server.token}"
    for path in ("/", "/api/snapshot", "/api/events", "/static/console.js", "/files/incidents/inc-1/report.html",
                 "/?token=wrong", "/api/snapshot?token=" + server.token[:-1]):
        status, _, body = request(server, "GET", path)
        assert status == 401, path
        assert JOB.encode() not in body and b"the report" not in body
    status, headers, body = request(server, "GET", "/?token=" + server.token)
    assert status == 200 and b"<button" in body
    cookie = headers["Set-Cookie"]
    assert auth.cookie_name(server.token) in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    jar = {"Cookie": f"{auth.cookie_name(server.token)}={server.token}"}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status, _, body = request(server, "GET", "/api/snapshot", headers=jar)
        if JOB.encode() in body:
            break
        time.sleep(0.05)
    assert status == 200 and json.loads(body)["job"] == JOB
    snap = json.loads(body)
    assert snap["incidents"][0]["report_url"] == "/files/incidents/inc-1/report.html"
    status, headers, body = request(server, "GET", snap["incidents"][0]["report_url"], headers=jar)
    assert status == 200 and body == b"<html>the report</html>"
    # A report is served sandboxed: its scripts cannot act as the console's page.
    assert headers["Content-Security-Policy"] == "sandbox" and headers["X-Content-Type-Options"] == "nosniff"
    # A second console on this machine names its cookie apart (cookies ignore the port).
    other, _ = start()
    assert auth.cookie_name(other.token) != auth.cookie_name(server.token)
    assert request(other, "GET", "/api/snapshot", headers=jar)[0] == 401


def test_files_stay_inside_the_export_folder(served):
    _, start = served
    server, _ = start(narrow=True)
    jar = {"Cookie": f"{auth.cookie_name(server.token)}={server.token}"}
    for rel in ("../secret.txt", "%2e%2e/secret.txt", "inc-1/../../secret.txt", "nothing.html"):
        status, _, body = request(server, "GET", "/files/" + rel, headers=jar)
        assert status == 404 and b"outside" not in body, rel
    assert request(server, "GET", "/files/inc-1/report.html", headers=jar)[0] == 200


def test_controls_need_the_header_and_this_origin(served):
    backend, start = served
    server, _ = start()
    jar = {"Cookie": f"{auth.cookie_name(server.token)}={server.token}", "Content-Type": "application/json"}
    # The cookie alone is what a cross-site form would carry: refused.
    status, _, body = request(server, "POST", "/api/control/pause", {}, jar)
    assert status == 403 and auth.HEADER.encode() in body
    status, _, body = act(server, "/api/control/pause", Origin="http://evil.example:80")
    assert status == 403 and b"another site" in body
    assert backend.controls == []
    status, _, body = act(server, "/api/control/pause")
    assert status == 200 and json.loads(body)["sent_to_agents"] == 1
    assert act(server, "/api/control/step", {"n": 3})[0] == 200
    assert backend.controls == [("pause", {}), ("step", {"n": 3})]


def test_malformed_requests_get_a_4xx_naming_what_was_wrong(served):
    backend, start = served
    server, _ = start()
    cases = [
        ("/api/control/reboot", {}, 404, b"no control 'reboot'"),
        ("/api/control/step", {"n": 0}, 400, b"n must be an integer >= 1"),
        ("/api/control/step", {"n": "2"}, 400, b"n must be an integer >= 1"),
        ("/api/control/terminate", {}, 400, b"confirm"),
        ("/api/control/pause", b"{not json", 400, b"not JSON"),
        ("/api/control/pause", b"[1, 2]", 400, b"must be a JSON object"),
        ("/api/watchpoints", {"rules": "TO"}, 400, b"args.rules must be a list"),
        ("/api/recheck", {"rules": "TO"}, 400, b"args.rules must be a list"),
    ]
    for path, body, want, text in cases:
        status, _, got = act(server, path, body)
        assert (status, text in got) == (want, True), (path, body, got)
    assert backend.controls == []
    status, _, got = request(server, "GET", "/api/tensors?step=x&token=" + server.token)
    assert status == 400 and b"'x' is not an integer" in got
    assert act(server, "/api/control/terminate", {"confirm": True})[0] == 200
    backend.fail = ValueError("step: the job is not paused")
    status, _, got = act(server, "/api/control/step", {"n": 1})
    assert status == 400 and b"the job is not paused" in got
    backend.fail = RuntimeError("the coordinator 'rankscope-x' is gone (its actor died)")
    status, _, got = act(server, "/api/control/pause")
    assert status == 502 and b"is gone" in got
    # Still serving after all of that.
    assert request(server, "GET", "/?token=" + server.token)[0] == 200


def test_capture_is_a_control_and_its_window_a_read(served):
    backend, start = served
    server, _ = start()
    status, _, body = act(server, "/api/capture", {"tensor": "Sentinel.loss", "ranks": [0, 1]})
    assert status == 200 and backend.controls == [("capture", {"tensor": "Sentinel.loss", "ranks": [0, 1]})]
    # The window's arguments travel as integers; a malformed one is a 400 naming it.
    status, _, body = request(server, "GET", "/api/capture?id=cap-1&a=0&b=1&index=2,3&row=4&token=" + server.token)
    assert status == 200
    assert json.loads(body) == {"what": "capture", "id": "cap-1", "a": 0, "b": 1, "row": 4, "col": None,
                                "index": [2, 3]}
    for query, text in (("id=cap-1&index=1,x", b"index: '1,x'"), ("id=cap-1&a=one", b"a: 'one' is not an integer")):
        status, _, body = request(server, "GET", f"/api/capture?{query}&token={server.token}")
        assert status == 400 and text in body, query
    # Cross-site and read-only consoles may not ask the ranks to write anything.
    status, _, _ = act(server, "/api/capture", {"tensor": "x", "ranks": [0]}, Origin="http://evil.example:80")
    assert status == 403
    ro, _ = start(read_only=True)
    status, _, body = act(ro, "/api/capture", {"tensor": "x", "ranks": [0]})
    assert status == 403 and b"read-only" in body
    assert len(backend.controls) == 1


def test_read_only_console_refuses_every_control(served):
    backend, start = served
    server, _ = start(read_only=True)
    for path in ("/api/control/pause", "/api/watchpoints"):
        status, _, body = act(server, path, {"rules": []})
        assert status == 403 and b"read-only" in body
    assert backend.controls == [] and backend.rules == []
    status, _, body = request(server, "GET", "/?token=" + server.token)
    assert status == 200 and b"readOnly: true" in body
    # A recheck changes nothing in the job: a read-only console answers it.
    status, _, body = act(server, "/api/recheck", {"rules": [{"condition": "TO"}]})
    assert status == 200 and json.loads(body)["hits"] == [{"step": 2, "rank": 0}]
    assert backend.rechecked == [{"condition": "TO"}]


def test_many_open_pages_cost_the_coordinator_one_reader(served):
    backend, start = served
    server, _ = start()
    stop = threading.Event()
    got: list[int] = []

    def page() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/api/events?token=" + urllib.parse.quote(server.token))
        resp = conn.getresponse()
        n = 0
        while not stop.is_set():
            line = resp.fp.readline()
            if not line:
                break
            n += line.startswith(b"data: ")
        got.append(n)
        conn.close()

    pages = [threading.Thread(target=page, daemon=True) for _ in range(20)]
    for t in pages:
        t.start()
    time.sleep(1.0)
    assert server.app.streams == 20
    reads_1s = backend.reads
    stop.set()
    # One read per interval (0.05 s) at most, whatever the number of pages; the
    # stand-in's snapshot never changes, so each page was sent it once (after the
    # "no snapshot yet" placeholder when it connected first).
    assert reads_1s <= 1.0 / 0.05 + 3, reads_1s
    server.stop()
    for t in pages:
        t.join(5)
    assert len(got) == 20 and all(1 <= n <= 2 for n in got), got


def test_pages_asking_one_step_s_tensors_cost_one_read_an_interval(served):
    backend, start = served
    server, _ = start()
    server.app.reads.ttl_s = 60.0  # one interval for the whole test, however slow the machine
    for _ in range(20):
        status, _, body = request(server, "GET", f"/api/tensors?group=g&step=3&token={server.token}")
        assert status == 200 and json.loads(body) == {"what": "tensors", "group": "g", "step": 3}
    assert backend.tree_reads == 1
    assert request(server, "GET", f"/api/tensors?group=g&step=4&token={server.token}")[0] == 200
    assert backend.tree_reads == 2  # another step is another question
    server.app.reads.ttl_s = 0.0
    request(server, "GET", f"/api/tensors?group=g&step=3&token={server.token}")
    assert backend.tree_reads == 3  # past the interval: read again


def test_a_port_in_use_is_one_error_naming_it(served):
    import socket
    backend, _ = served
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ConsoleServer(backend, None, port=port)
        with pytest.raises(OSError, match=f"could not listen on 127.0.0.1:{port}"):
            server.start()
        server.stop()
