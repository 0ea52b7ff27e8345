"""``rankscope launch`` and ``rankscope demo`` through the real command, as a new user
meets them: everything they type is checked before Ray starts (one line, exit 2, no
traceback), and a run in which nothing was watched does not end as if all was well."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankscope.coordinator.launch.watched import UNWATCHED_EXIT

# Refusals come before Ray: a refusal that took this long started something first.
BEFORE_RAY_S = 20.0


def rankscope(*argv: str, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "MS_RDR_"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "rankscope", *argv], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_refusal(out: subprocess.CompletedProcess, *needles: str) -> None:
    err = out.stderr.strip()
    assert out.returncode == 2, (out.returncode, out.stdout, err)
    assert "Traceback" not in err and "\x1b[" not in err, err
    last = err.splitlines()[-1]
    for needle in needles:
        assert needle in last, (needle, err)


@pytest.mark.parametrize("config, needles", [
    # The typo a user makes: misspelt key in the probe's own section.
    ({"task": "statistics", "levle": "L0"}, ["'levle'", "'L0'", "unknown field", "did you mean 'level'?"]),
    ({"task": "statistics", "level": "L9"}, ["'level'", "'L9'", "expected one of"]),
    ({"statistics": {"data_mode": ["sideways"]}}, ["statistics.data_mode", "'sideways'"]),
    ({"cluster": {"detectors": {"outlier": {"z": -1}}}}, ["cluster.detectors.outlier.z", "-1"]),
    ({"rdr": {"mode": 5}}, ["rdr.mode", "5"]),
])
def test_a_bad_config_is_refused_before_anything_starts(tmp_path, config, needles):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    t0 = time.monotonic()
    out = rankscope("launch", "--export-dir", str(tmp_path / "out"), "--config", str(cfg), "--", "true",
                    cwd=tmp_path)
    assert_one_line_refusal(out, "--config", *needles)
    assert time.monotonic() - t0 < BEFORE_RAY_S
    assert not (tmp_path / "out").exists()  # nothing was started, nothing written


def test_bad_options_and_commands_are_one_line_each(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")  # not executable: the user meant `python train.py`
    cases = [
        (["--", "nonexistent-cmd"], ["'nonexistent-cmd'", "not found on PATH"]),
        (["--", str(script)], ["not an executable file", "python"]),
        (["--", str(tmp_path / "missing.sh")], ["no such file"]),
        (["--export-dir", "/proc/x", "--", "true"], ["--export-dir /proc/x", "cannot create"]),
        (["--log", "/proc/x/cmd.log", "--", "true"], ["--log", "cannot create"]),
        (["--grace", "-1", "--", "true"], ["--grace", "expected"]),
        (["--config", str(tmp_path / "nope.json"), "--", "true"], ["--config", "No such file"]),
        (["--agent", "ipc:///tmp/x", "--", "true"], ["--agent needs --job"]),
        ([], ["no command given"]),
    ]
    for argv, needles in cases:
        t0 = time.monotonic()
        out = rankscope("launch", "--export-dir", str(tmp_path / "o"), *argv, cwd=tmp_path)
        assert_one_line_refusal(out, *needles)
        assert time.monotonic() - t0 < BEFORE_RAY_S, argv


def test_an_environment_the_ranks_would_reject_is_refused(tmp_path):
    out = rankscope("launch", "--", "true", cwd=tmp_path, env={"MS_RDR_MODE": "7"})
    assert_one_line_refusal(out, "MS_RDR_MODE", "'7'", "expected 1")


@pytest.mark.parametrize("argv, needle", [
    (["--fault", "nan_batch"], "expected KIND:RANK:STEP"),
    (["--fault", "nan_batch:x:4"], "whole numbers"),
    (["--fault", "nan_batch:9:4"], "rank 9 is not one of the job's ranks 0-3"),
    (["--fault", "nan_batch:2:10", "--steps", "10"], "step 10 is not one of the job's steps 0-9"),
    (["--fault", "flip:1:1"], "unknown kind 'flip'"),
    (["--ranks", "0"], "--ranks: 0 is not >= 1"),
    (["--steps", "zero"], "--steps: 'zero' is not a whole number"),
])
def test_demo_arguments_are_parsed_strictly(tmp_path, argv, needle):
    t0 = time.monotonic()
    out = rankscope("demo", "--export-dir", str(tmp_path / "demo"), *argv, cwd=tmp_path)
    assert_one_line_refusal(out, needle)
    assert time.monotonic() - t0 < BEFORE_RAY_S
    assert not (tmp_path / "demo" / "msrun_logs").exists()


@pytest.mark.ray
def test_a_command_with_no_rank_is_not_called_a_clean_run(tmp_path):
    # A real local Ray, coordinator and node agent; the command never imports MindSpore.
    out = rankscope("launch", "--export-dir", str(tmp_path / "o"), "--", "true", cwd=tmp_path, timeout=240)
    text = out.stdout + out.stderr
    assert out.returncode == UNWATCHED_EXIT, text  # `true` succeeded, but nothing was watched
    assert "no divergence found" not in text, text
    assert "NOTHING WAS WATCHED: no rank attached" in out.stderr, text
    assert "--allow-unwatched" in out.stderr, text
    # Ray's own chatter (start-up notes, the token notice) only with --verbose.
    assert "Token authentication" not in text and "INFO" not in text, text
    assert len(out.stderr.strip().splitlines()) == 2, out.stderr


def test_an_unreachable_ray_cluster_is_one_line_and_quick(tmp_path):
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for argv in (["status", "--address", f"127.0.0.1:{port}"],
                 ["export", "--address", f"127.0.0.1:{port}"],
                 ["launch", "--export-dir", str(tmp_path / "o"), "--address", f"127.0.0.1:{port}", "--", "true"]):
        t0 = time.monotonic()
        out = rankscope(*argv, cwd=tmp_path)
        err = out.stderr.strip()
        assert out.returncode == 1, (argv, out.returncode, err)
        assert err.splitlines() == [f"rankscope {argv[0]}: no Ray cluster at '127.0.0.1:{port}': Connection refused"], err
        assert time.monotonic() - t0 < 60, argv
