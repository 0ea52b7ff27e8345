"""End to end: pausing a real 4-rank msrun job whose ranks are at different points of a step.

``jobs/train_skewed.py`` keeps one rank inside the next step's gradient AllReduce while
the others finish the current step: "pause every rank at its next boundary" deadlocks
there. The divergence pause must hold every rank before one step (no collective
timeout), the operator commands the launcher prints must reach the job (``step 2``,
``resume``), and the run must end with the losses of an unpaused run, bit for bit.
Ctrl-C on a paused launcher must leave no process of the job behind.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankscope.coordinator.cli.demo import msrun_command

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
JOB = Path(__file__).parent / "jobs" / "train_skewed.py"
BIN = Path(sys.executable).parent


def _env(steps: int) -> dict:
    env = dict(os.environ, TRAIN_STEPS=str(steps), TRAIN_FAULT="perturb:1:3", SKEW_SLEEP_S="0.3")
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"  # msrun of this environment
    return env


def _launch(out: Path, steps: int) -> tuple[subprocess.Popen, Path]:
    log = out.parent / "launch.out"
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out), "--on-divergence", "pause",
           "--log", str(out / "command.log"), "--", *msrun_command(4, out / "msrun_logs", JOB)]
    out.mkdir(parents=True)
    proc = subprocess.Popen(cmd, env=_env(steps), stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, log


def _wait_for(log: Path, text: str, proc: subprocess.Popen, after: int = 0, timeout: float = 240) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        lines = log.read_text(errors="replace").splitlines()
        if any(text in line for line in lines[after:]):
            return "\n".join(lines)
        assert proc.poll() is None, f"launch exited {proc.returncode} before {text!r}:\n" + "\n".join(lines[-40:])
        time.sleep(0.5)
    raise AssertionError(f"no {text!r} within {timeout} s:\n{log.read_text(errors='replace')[-4000:]}")


def _operator(printed: str, verb: str) -> None:
    """Run the command exactly as the paused launcher printed it."""
    line = next(ln for ln in printed.splitlines() if re.search(rf"rankscope {verb.split()[0]}\s+", ln) and "#" in ln)
    argv = shlex.split(line.split("]", 1)[1].split("#")[0])
    assert argv[0] == "rankscope" and "--address" in argv and "--job" in argv, line
    argv = ["rankscope", *verb.split(), *argv[2 + (1 if argv[1] == "step" else 0):]]
    r = subprocess.run([str(BIN / "rankscope"), *argv[1:]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (argv, r.stdout, r.stderr)


def _losses(log_dir: Path) -> list[str]:
    return sorted(ln for f in log_dir.glob("worker_*.log") for ln in f.read_text(errors="replace").splitlines()
                  if ln.startswith("LOSS "))


def _held_before(log_text: str) -> list[int]:
    return [int(m) for m in re.findall(r"PAUSED: 4 of 4 rank\(s\) hold before step (\d+)", log_text)]


def test_skewed_dp_job_pauses_at_one_step_steps_and_resumes_to_the_unpaused_losses(tmp_path):
    steps = 9
    proc, log = _launch(tmp_path / "out", steps)
    ref = None
    try:
        text = _wait_for(log, "the job waits for you", proc)
        # The unpaused reference run starts while every rank of the paused job is held, so
        # its start-up overlaps the operator's commands instead of following the whole run.
        ref = subprocess.Popen(msrun_command(4, tmp_path / "ref_logs", JOB), env=_env(steps),
                               stdout=(tmp_path / "ref.out").open("w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
        [cut] = _held_before(text)
        [inc] = [json.loads(p.read_text()) for p in (tmp_path / "out" / "incidents").glob("*/incident.json")]
        assert inc["cut"]["complete"] and inc["cut"]["step"] == cut and inc["state"] == "written", inc["cut"]
        assert {r["paused_before"] for r in inc["ranks"].values()} == {cut}
        assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == ("replica", 1, 3)
        seen = len(text.splitlines())
        _operator(text, "step 2")
        text = _wait_for(log, "the job waits for you", proc, after=seen)
        assert _held_before(text)[-1] == cut + 2
        _operator(text, "resume")
        assert proc.wait(240) == 0, log.read_text()[-3000:]
        ref.wait(300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        if ref is not None and ref.poll() is None:
            os.killpg(ref.pid, signal.SIGKILL)  # msrun and its workers: a session of their own
            ref.wait(60)
    text = log.read_text(errors="replace")
    assert "resumed: training goes on" in text
    worker_logs = "\n".join(f.read_text(errors="replace") for f in (tmp_path / "out" / "msrun_logs").glob("*.log"))
    # What a collective abandoned by a paused peer prints: "Ring ReduceScatter wait receiving ... failed".
    assert not re.search(r"wait receiving|Ring\w* .*failed", worker_logs), \
        re.findall(r".*(?:wait receiving|Ring\w* .*failed).*", worker_logs)[:5]
    paused = _losses(tmp_path / "out" / "msrun_logs")
    assert len(paused) == 4 * steps
    assert ref.returncode == 0, (tmp_path / "ref.out").read_text(errors="replace")[-2000:]
    assert paused == _losses(tmp_path / "ref_logs")  # bit for bit: the pause changed nothing


def _job_processes(out: Path, launcher: int) -> list[int]:
    """Processes started for this job: their command line or environment names its export dir."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == launcher:
            continue
        try:
            if str(out).encode() in (d / "cmdline").read_bytes() + (d / "environ").read_bytes():
                found.append(int(d.name))
        except OSError:
            pass
    return found


def test_ctrl_c_on_a_paused_launch_leaves_no_process_of_the_job(tmp_path):
    out = tmp_path / "out"
    proc, log = _launch(out, 40)
    try:
        _wait_for(log, "the job waits for you", proc)
        before = _job_processes(out, proc.pid)
        assert len(before) >= 5, before  # msrun, four workers (and the node agent)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in its terminal sends
        while _job_processes(out, proc.pid) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        assert _job_processes(out, proc.pid) == [], "processes of the job left 30 s after Ctrl-C"
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    printed = log.read_text()
    assert f"what was recorded is in {out}" in printed
    assert list((out / "incidents").glob("*/incident.json"))  # the incident written before stays
    # What was found and what it stands on are still said and written, as at a normal end.
    assert "rankscope verdict: rank" in printed and "watched steps 0-" in printed, printed[-3000:]
    assert json.loads((out / "coverage.json").read_text()), printed[-3000:]
