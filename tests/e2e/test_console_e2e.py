"""End to end: the live console of a real 4-rank msrun job, driven in Debian's Chromium.

One job, ``rankscope launch --console``: the grid fills as steps are judged; the fault's
verdict shows on the page within 2 s of the terminal's line; the page's Step 1 and
Resume drive the divergence-paused job and ``rankscope status`` agrees; Pause pauses it;
a watchpoint made on the page fires on a later step; the model tree and a tensor's
ranks side by side with a two-rank difference; its values captured on a paused job (Capture
values, then Step) on two ranks, with their difference as a heat map; Terminate (confirmed)
ends it. Without the
token the console serves nothing about the job.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rankscope.coordinator.cli.demo import msrun_command
from tests.browser import MISSING, chromium_page

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]
JOB = Path(__file__).parent / "jobs" / "train_skewed.py"
BIN = Path(sys.executable).parent
URL_LINE = re.compile(r"^\[rankscope\] console: (http://127\.0\.0\.1:(\d+)/\?token=(\S+))$", re.M)
#: Where the screenshots go when RANKSCOPE_SHOTS names a folder (the README's and the
#: closing notes' pictures are taken by this test).
SHOTS = os.environ.get("RANKSCOPE_SHOTS")


def _launch(out: Path) -> tuple[subprocess.Popen, Path]:
    out.mkdir(parents=True)
    log = out.parent / "launch.out"
    env = dict(os.environ, TRAIN_STEPS="400", TRAIN_FAULT="perturb:1:6", SKEW_SLEEP_S="0.15")
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    cmd = [sys.executable, "-m", "rankscope", "launch", "--console", "--export-dir", str(out),
           "--on-divergence", "pause", "--log", str(out / "command.log"), "--",
           *msrun_command(4, out / "msrun_logs", JOB)]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT), log


def _wait(what: str, probe, proc: subprocess.Popen, log: Path, timeout: float = 180, every: float = 0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = probe()
        if got:
            return got
        assert proc.poll() is None, f"launch exited {proc.returncode} waiting for {what}:\n" + log.read_text()[-4000:]
        time.sleep(every)
    raise AssertionError(f"no {what} within {timeout} s:\n{log.read_text(errors='replace')[-4000:]}")


def _status(job: str) -> dict:
    r = subprocess.run([str(BIN / "rankscope"), "status", "--job", job, "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _states(st: dict) -> set[str]:
    return {v.get("state") for v in (st.get("ranks") or {}).values()}


def _shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def test_console_drives_a_real_job(tmp_path):
    proc, log = _launch(tmp_path / "out")
    try:
        m = _wait("the console line", lambda: URL_LINE.search(log.read_text(errors="replace")), proc, log, 120)
        url, port, token = m.group(1), m.group(2), m.group(3)
        job = re.search(r"\(job (job-[\w-]+)", log.read_text()).group(1)
        # The same job's console from another terminal, found as `rankscope status` finds it.
        other = subprocess.Popen([str(BIN / "rankscope"), "console", "--job", job, "--read-only"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # Without the token: refused, and nothing about the job in the answer.
        for path in ("/", "/api/snapshot", "/api/events"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
            assert err.value.code == 401 and job.encode() not in err.value.read()

        with chromium_page() as page:
            page.on("dialog", lambda d: d.accept())  # Terminate's confirmation
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url)
            # The grid fills as steps are judged.
            _wait("a filled grid", lambda: int(page.locator("figure.grid").first.get_attribute("data-filled") or 0)
                  >= 8 if page.locator("figure.grid").count() else False, proc, log)
            # The fault's verdict: on the page within 2 s of the terminal's line.
            t_term = t_page = None
            end = time.monotonic() + 180
            while (t_term is None or t_page is None) and time.monotonic() < end:
                now = time.monotonic()
                if t_term is None and "DIVERGENCE: replica names rank 1" in log.read_text(errors="replace"):
                    t_term = now
                if t_page is None and page.locator('tr.verdict[data-detector="replica"]').count():
                    t_page = now
                time.sleep(0.05)
            assert t_term is not None and t_page is not None, log.read_text()[-4000:]
            assert t_page - t_term <= 2.0, (t_page, t_term)
            row = page.locator('tr.verdict[data-detector="replica"]').first
            assert row.locator("td.rank").inner_text() == "1" and row.locator("td.step").inner_text() == "6"
            # The divergence paused the job: the page and `rankscope status` agree.
            _wait("a paused job", lambda: "paused" in page.locator("#state").inner_text(), proc, log, 60)
            st = _status(job)
            assert _states(st) == {"paused"}, st["ranks"]
            held = max(v["step"] for v in st["ranks"].values())
            _shot(page, "console-diverged")

            # Step 1 from the page: every rank runs one more step and holds again.
            page.get_by_role("button", name="Step").click()
            _wait("one step more", lambda: (lambda s: _states(s) == {"paused"} and
                                            max(v["step"] for v in s["ranks"].values()) == held + 1)(_status(job)),
                  proc, log, 60, every=1.0)
            # Resume, then Pause, from the page.
            page.get_by_role("button", name="Resume").click()
            _wait("a running job", lambda: _states(_status(job)) == {"running"}, proc, log, 60, every=1.0)
            page.get_by_role("button", name="Pause").click()
            _wait("a paused job", lambda: _states(_status(job)) == {"paused"}, proc, log, 60, every=1.0)
            # A watchpoint made on the paused page: rechecked over the kept steps it answers
            # for steps before it was made (the job is held, so the kept steps cannot move
            # past that step however slow the machine), then it fires on a later step.
            made_at = max(v["step"] for v in _status(job)["ranks"].values())
            # A gradient's rms is what the default watch records of it (its norm).
            page.select_option("#wp-condition", "GL")
            page.select_option("#wp-param", "rms_gt")
            page.fill("#wp-value", "1e-30")
            page.fill("#wp-names", "*out.weight*")
            page.get_by_role("button", name="Add watchpoint").click()
            _wait("the watchpoint listed", lambda: page.locator("#wp-list li").count() == 1, proc, log, 30)
            page.get_by_role("button", name="Recheck kept steps").click()
            rechecked = page.locator("#wp-rechecked li")
            _wait("the recheck's hits", lambda: rechecked.count() > 0, proc, log, 30)
            past = [int(t.split()[1]) for t in rechecked.all_inner_texts()]
            assert max(past) <= made_at and all("out.weight" in t for t in rechecked.all_inner_texts()), past
            # Resumed, the job may hit the rule (and pause on it) before a status poll
            # would see it running: the hit is what is waited for.
            page.get_by_role("button", name="Resume").click()
            hits = page.locator('tr.verdict[data-detector="watchpoint"]')
            hit = _wait("a watchpoint hit", lambda: hits.all(), proc, log, 120)
            assert int(hit[0].locator("td.step").inner_text()) > made_at
            assert "out.weight" in hit[0].locator("td.tensor").inner_text()
            _shot(page, "console-watchpoint")

            # The model tree at the fault's step, and one tensor on every rank.
            row.locator("td.step").click()
            _wait("the model tree", lambda: page.locator("#tree-list li.leaf").count() > 3, proc, log, 30)
            page.fill("#tree-search", "out.weight")
            shown = page.locator("#tree-list li.leaf:not([hidden])")
            assert shown.count() >= 2 and all("out.weight" in n for n in
                                              [shown.nth(i).get_attribute("data-name") for i in range(shown.count())])
            shown.locator('xpath=self::*[@data-name="Sentinel.param.out.weight"]').click()
            _wait("the tensor view", lambda: page.locator("#tensor-table tr[data-rank]").count() == 4, proc, log, 30)
            _shot(page, "console-tensor")
            assert not errors, errors
            # The default watch keeps the weight's fingerprint: rank 1's, nudged at step 6,
            # differs from the other three at every kept step, rank 1 minus rank 0 says so.
            body = page.locator("#tensor-body")
            assert page.locator("#tensor-stat").input_value() == "crc32", body.inner_html()[:3000]
            alike = page.locator("#tensor-table tr.median td").all_inner_texts()
            assert alike and all(t == "3 / 1" for t in alike), alike
            assert page.locator("#diff-table td.split").count() == len(alike), body.inner_html()[:3000]

            # The weight's values on a paused job: asked for on ranks 0 and 1, Step 1, and
            # the two ranks' values show with their difference (rank 1's were nudged).
            page.get_by_role("button", name="Pause").click()
            _wait("a paused job", lambda: _states(_status(job)) == {"paused"}, proc, log, 60, every=1.0)
            paused_at = max(v["step"] for v in _status(job)["ranks"].values())
            page.fill("#capture-ranks", "0,1")
            page.get_by_role("button", name="Capture values").click()
            _wait("the capture asked", lambda: "waiting for rank(s) 0, 1" in page.locator("#capture-out").inner_text(),
                  proc, log, 30)
            page.get_by_role("button", name="Step", exact=True).click()
            _wait("the captured values", lambda: page.locator("#capture-diff").count() == 1, proc, log, 60)
            summary = page.locator("#capture-summary").inner_text()
            m3 = re.match(r"(\d+) of (\d+) values differ between rank 0 and rank 1", summary)
            assert m3 and 0 < int(m3.group(1)) <= int(m3.group(2)), summary
            assert page.locator("#capture-values-a tr").count() > 1 and page.locator("#capture-values-b tr").count() > 1
            answers = page.locator("#capture-answers").inner_text()
            steps = [int(s) for s in re.findall(r"rank [01]: step (\d+), shape", answers)]
            assert len(steps) == 2 and steps[0] == steps[1] > paused_at - 1, (answers, paused_at)
            where = [int(i) for i in re.search(r"at \[([\d, ]+)\]", summary).group(1).split(",")]
            page.get_by_role("button", name="show it").click()
            # The window moves to hold the largest difference (8 rows and columns before it),
            # and that cell is the heat map's fullest colour.
            want = (str(max(0, where[-2] - 8)) if len(where) > 1 else "0", str(max(0, where[-1] - 8)))
            _wait("the window at the largest difference", lambda: (
                page.locator("#capture-row").input_value(), page.locator("#capture-col").input_value()) == want and
                page.locator("#capture-diff td[style*='rgb(198,40,40)'], #capture-diff td[style*='rgb(21,101,192)']"
                             ).count() >= 1, proc, log, 30)
            page.locator("#capture-diff").scroll_into_view_if_needed()
            _shot(page, "console-values")
            assert not errors, errors

            # The other terminal's console: its own token, read-only, the same job.
            line = other.stdout.readline()
            m2 = re.match(r"^\[rankscope\] console: (http://127\.0\.0\.1:\d+)/\?token=(\S+)$", line.strip())
            assert m2, line + other.stdout.read() if other.poll() is not None else line
            assert m2.group(2) != token
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                snap = json.load(urllib.request.urlopen(f"{m2.group(1)}/api/snapshot?token={m2.group(2)}", timeout=10))
                if snap.get("job") == job:
                    break
                time.sleep(0.5)
            assert snap.get("job") == job and snap["verdicts"], snap
            req = urllib.request.Request(f"{m2.group(1)}/api/control/pause?token={m2.group(2)}", data=b"{}",
                                         headers={"X-Rankscope-Token": m2.group(2)}, method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=10)
            assert refused.value.code == 403 and b"read-only" in refused.value.read()

            page.get_by_role("button", name="Terminate").click()
            assert proc.wait(240) is not None
        text = log.read_text(errors="replace")
        assert "terminate" in text.lower(), text[-3000:]
        # The job's coordinator is gone: the other console says so and ends.
        assert other.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        if "other" in locals() and other.poll() is None:
            other.kill()
            other.wait(10)
