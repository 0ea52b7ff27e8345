"""End to end: a real 4-rank msrun GRAPH-mode job (a hand-written TrainOneStep Cell with
GradOperation and DistributedGradReducer, compiled whole) under ``rankscope launch``.

The clean run must exit 0 with no incident and every rank saying it was watched through
the kernel dump; a NaN in one rank's batch must be traced to that rank, that step and
the first kernel that met it, and ``rankscope collect`` must gather that step's kernel
tensors from every rank in msProbe's static-graph L2 layout. The job
(tests/e2e/jobs/graph_dp.py) knows nothing about rankscope; its other styles
(nn.TrainOneStepCell, Model.train) are run by hand (see docs/reference/watch.md, compiled code)
to keep CI short. One more job (tests/e2e/jobs/jit_dp.py) trains the way MindSpore 2.x's
tutorials do: PyNative with an @ms.jit train step.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from launched import explain

from rankscope.coordinator.cli.demo import msrun_command

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
JOB = Path(__file__).parent / "jobs" / "graph_dp.py"
JIT_JOB = Path(__file__).parent / "jobs" / "jit_dp.py"
RANKS = 4


def launch(tmp_path: Path, fault: str | None, steps: int = 6, action: str = "terminate"):
    out = tmp_path / "out"
    env = dict(os.environ, GRAPH_STYLE="custom", GRAPH_STEPS=str(steps))
    env.pop("GRAPH_FAULT", None)
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    if fault:
        env["GRAPH_FAULT"] = fault
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out), "--on-divergence", action,
           "--", *msrun_command(RANKS, out / "msrun_logs", JOB)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    incidents = [json.loads(p.read_text()) for p in sorted((out / "incidents").glob("*/incident.json"))] \
        if (out / "incidents").exists() else []
    return proc, out, incidents


def test_clean_graph_job_runs_untouched_and_every_rank_says_it_is_watched(tmp_path):
    proc, out, incidents = launch(tmp_path, None)
    assert proc.returncode == 0, explain(proc, out)
    assert incidents == []
    assert "no divergence found" in proc.stdout
    # Every step, the last one too (a compiled step ends when the next begins, or at exit).
    assert f"watched steps 0-5 on {RANKS}/{RANKS} ranks" in proc.stdout, explain(proc, out)
    tail = proc.stdout[proc.stdout.index("no divergence found"):]
    # the end-of-run line: every rank watched alike, said once for all of them
    assert tail.count(f"ranks 0-{RANKS - 1}: GRAPH mode, watched through the kernel dump") == 1, tail
    for log in sorted((out / "msrun_logs").glob("worker_*.log")):
        text = log.read_text(errors="replace")
        assert "Unsupported statement" not in text and "finished" in text, log.name
    # The kernel files were read and deleted as the run went, and the scratch folder at exit.
    left = [p for p in (out / "local_dump").rglob("*.npy")]
    assert left == [], left[:5]
    assert list((out / "local_dump").glob("kernels_*")) == []


def test_a_jit_compiled_tutorial_step_is_watched_every_step_and_a_nan_batch_named(tmp_path):
    """PyNative + an @ms.jit train step (tests/e2e/jobs/jit_dp.py): MindSpore runs the
    compiled step asynchronously, so its kernel dump is read only once the step ran; each
    call ends a step, the last one at exit. The job runs on to its end (continue)."""
    out = tmp_path / "out"
    env = dict(os.environ, JIT_STEPS="8", JIT_FAULT="nan_batch:1:5")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out), "--on-divergence", "continue",
           "--", *msrun_command(RANKS, out / "msrun_logs", JIT_JOB)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, explain(proc, out)
    for r in range(RANKS):
        text = (out / "msrun_logs" / f"worker_{r}.log").read_text(errors="replace")
        assert f"rank {r} finished 8 steps" in text and "Open file" not in text, text[-3000:]
    (inc,) = [json.loads(p.read_text()) for p in (out / "incidents").glob("*/incident.json")]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == ("nan_origin", 1, 5), inc["evidence"]
    assert inc["tensor"].startswith("Conv2D.") and inc["tensor"].endswith(".input.0"), inc["tensor"]
    assert f"watched steps 0-7 on {RANKS}/{RANKS} ranks" in proc.stdout, explain(proc, out)
    assert f"ranks 0-{RANKS - 1}: PyNative+jit mode, watched through the kernel dump" in proc.stdout


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float = 300) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        printed = log.read_text(errors="replace")
        if text in printed:
            return printed
        assert proc.poll() is None, f"launch exited {proc.returncode} before {text!r}:\n{printed[-4000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {text!r} within {timeout} s:\n{log.read_text(errors='replace')[-4000:]}")


def _control(printed: str, *verb: str) -> subprocess.CompletedProcess:
    address = re.search(r"--address (\S+) --job (\S+)", printed)
    assert address, printed[-2000:]
    cmd = [sys.executable, "-m", "rankscope", *verb, "--address", address.group(1), "--job", address.group(2)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def test_nan_in_one_ranks_batch_is_traced_to_its_first_kernel_and_its_kernels_are_collected(tmp_path):
    """Pause on the verdict, ``rankscope collect`` the kept kernel tensors of the NaN step
    from every rank (msProbe's static-graph L2 layout), then terminate."""
    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "config.json"  # a user asking for the tensors of steps 2-3
    config.write_text(json.dumps({"task": "tensor", "step": [2, 3], "level": "L0"}))
    env = dict(os.environ, GRAPH_STYLE="custom", GRAPH_STEPS="60", GRAPH_FAULT="nan_batch:2:3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    log = tmp_path / "launch.out"
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out), "--on-divergence", "pause",
           "--config", str(config), "--log", str(out / "command.log"), "--grace", "3",
           "--", *msrun_command(RANKS, out / "msrun_logs", JOB)]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        printed = _wait_for(log, "the job waits for you", proc)
        got = _control(printed, "collect", "--steps", "3")
        assert got.returncode == 0 and "4/4 ranks done" in got.stdout, (got.stdout, got.stderr)
        assert _control(printed, "terminate").returncode == 0
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    printed = log.read_text(errors="replace")
    incidents = [json.loads(p.read_text()) for p in sorted((out / "incidents").glob("*/incident.json"))]
    assert incidents, "no incident\n" + printed[-4000:]
    inc = incidents[0]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == ("nan_origin", 2, 3), inc["evidence"]
    # The batch meets the first layer's MatMul first: that kernel's input is named.
    assert inc["tensor"].startswith("MatMul.Default_loss_net-WeightedLoss_net-Tower_l1-Dense_MatMul"), inc["tensor"]
    assert inc["tensor"].endswith(".input.0")
    assert inc["ranks"]["2"]["watch"]["mode"] == "GRAPH"
    inc_dir = next((out / "incidents").glob("*/incident.json")).parent
    for r in range(RANKS):
        assert any((inc_dir / f"rank_{r}" / "rdr").rglob("*")), f"rank {r} has no bundle"
    # Collected: dumps/rank_{ID}/{timestamp}/step_3/<msProbe L2 kernel file>, every rank,
    # only the step asked for; the NaN is in rank 2's file of the named kernel and no other.
    dumps = out / "dumps"
    for r in range(RANKS):
        steps = sorted(p.name for p in dumps.glob(f"rank_{r}/*/step_*"))
        assert steps == ["step_3"], (r, steps)
        (first,) = dumps.glob(f"rank_{r}/*/step_3/{inc['tensor'].rsplit('.', 4)[0]}.*.input.0.*.npy")
        assert np.isnan(np.load(first)).any() == (r == 2), first
    kept = sorted(p.name for p in dumps.glob("rank_1/*/step_3/*.npy"))
    assert kept == sorted(p.name for p in (out / "local_dump").glob("rank_1/*/step_3/*.npy")) and kept
    # The collected tree read offline gives the live verdict's rank, step and kernel.
    offline = subprocess.run([sys.executable, "-m", "rankscope", "analyze", str(dumps), "--out",
                              str(tmp_path / "analysis")], capture_output=True, text=True, timeout=300)
    assert offline.returncode == 86 and "level L2" in offline.stdout, offline.stdout + offline.stderr
    assert f"DIVERGENCE: nan_origin names rank 2 at step 3 ({inc['tensor']})" in offline.stdout, offline.stdout
