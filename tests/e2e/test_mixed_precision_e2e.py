"""End to end, 4 real msrun ranks under ``rankscope launch`` with no config: healthy jobs
the watch must leave healthy, and the faults it must still name in them.

- tests/e2e/jobs/fp16_scale_dp.py: float16 under a dynamic loss scale. Its first steps
  overflow on every rank by design, and one later step on one rank at the scale's
  ceiling: no finding, every overflow step counted in coverage.json. A NaN in one rank's
  batch, and one rank's batch out of range so that only its float16 gradients overflow,
  are named; a fault every rank runs that drives the scale down step after step is a
  job-wide finding that names no rank and stops nothing (exit 0).
- tests/e2e/jobs/mint_jit_dp.py: ``@ms.jit`` helpers of the job's own inside the eager
  forward (one with an AllReduce, run by every block) and the loss: exit 0, no incident.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launched import explain

from rankscope.coordinator.cli.demo import msrun_command

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
JOBS = Path(__file__).parent / "jobs"
RANKS = 4


def launch(tmp_path: Path, job: str, env_extra: dict[str, str], action: str = "terminate"):
    out = tmp_path / "out"
    env = dict(os.environ, **env_extra)
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out), "--grace", "3",
           "--on-divergence", action, "--", *msrun_command(RANKS, out / "msrun_logs", JOBS / job)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    incidents = [json.loads(p.read_text()) for p in sorted((out / "incidents").glob("*/incident.json"))] \
        if (out / "incidents").exists() else []
    return proc, out, incidents


def steps_printed(out: Path) -> dict[int, list[str]]:
    """Each rank's LOSS lines, as the job printed them."""
    return {r: re.findall(r"^LOSS .*$", (out / "msrun_logs" / f"worker_{r}.log").read_text(errors="replace"), re.M)
            for r in range(RANKS)}


def loss_scale_coverage(out: Path) -> dict:
    jobs = json.loads((out / "coverage.json").read_text())["jobs"]
    (job,) = jobs.values()
    return job["loss_scale"]


def test_a_float16_job_overflowing_by_design_runs_on_and_a_scale_every_rank_drives_down_stops_nothing(tmp_path):
    """Steps 0-9 are the clean job (the scale's search down from 2**24, then one rank alone
    at its ceiling): counted, no finding. From step 10 every rank's targets are 1e6 too
    large, so the scale falls every step: a job-wide finding naming no rank, and the job
    runs on to its end (one msrun job for both: each costs most of a minute)."""
    proc, out, incidents = launch(tmp_path, "fp16_scale_dp.py", {"FP16_STEPS": "20", "FP16_FAULT": "floor:-1:10"})
    assert proc.returncode == 0, explain(proc, out)  # no culprit: the job ran on to its end
    printed = steps_printed(out)
    assert all(len(lines) == 20 for lines in printed.values()), printed
    skipped = [i for i, ln in enumerate(printed[0]) if "finite=False" in ln]
    assert skipped[:7] == list(range(7)) and 7 not in skipped and skipped[-10:] == list(range(10, 20)), printed[0]
    assert len(skipped) > 17  # the search, one more before step 10, then every step
    shown = loss_scale_coverage(out)
    assert shown["overflow_steps"] == len(skipped)
    assert shown["recent_overflows"][-1]["step"] == 19
    [ceiling] = [o for o in shown["recent_overflows"] if o["step"] == 8]
    assert ceiling["ranks_overflowed"] == 1 and ceiling["ranks"] == RANKS  # one rank alone, no finding
    (inc,) = incidents  # nothing before step 10: the designed overflows are no finding
    assert inc["detector"] == "loss_scale" and inc["step"] == 17, inc["evidence"]  # 8 overflows in a row from 10
    assert inc["decided"] is False and inc["evidence"]["streak_from_step"] == 10
    assert "every rank" in inc["evidence"]["every_rank"]
    assert "JOB-WIDE: loss_scale at step 17" in proc.stdout
    assert f"watched steps 0-19 on {RANKS}/{RANKS} ranks" in proc.stdout
    assert f"{len(skipped)} overflow step(s), the update skipped by the scaler (no finding)" in proc.stdout
    assert "re-run" not in proc.stdout  # an overflow is the scaler's, never re-run


@pytest.mark.parametrize("fault, detector, tensor", [
    # a NaN in rank 2's batch once the scale settled: named where it entered, before any backward
    ("nan:2:11", "nan_origin", "Cell.body.0.Dense.forward.0.input.0"),
    # rank 1's batch 30x too large: only its float16 gradients overflow; its input says why
    ("big:1:11", "outlier", "Cell.body.0.Dense.forward.0.input.0"),
])
def test_a_fault_in_one_ranks_float16_batch_is_named_at_its_rank_and_step(tmp_path, fault, detector, tensor):
    proc, out, incidents = launch(tmp_path, "fp16_scale_dp.py", {"FP16_STEPS": "14", "FP16_FAULT": fault})
    _, rank, step = fault.split(":")
    assert incidents, explain(proc, out)
    inc = incidents[0]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"], inc["tensor"]) == \
           (detector, int(rank), int(step), tensor), inc["evidence"]


def test_jit_helpers_with_a_collective_in_the_forward_run_clean_under_the_watch(tmp_path):
    proc, out, incidents = launch(tmp_path, "mint_jit_dp.py", {"MINT_STEPS": "6"})
    assert proc.returncode == 0, explain(proc, out)
    assert incidents == [], [i["evidence"] for i in incidents]
    assert f"watched steps 0-5 on {RANKS}/{RANKS} ranks" in proc.stdout, explain(proc, out)
    assert f"ranks 0-{RANKS - 1}: PyNative+jit mode, watched through hooks" in proc.stdout
    for r in range(RANKS):
        assert "Unsupported statement" not in (out / "msrun_logs" / f"worker_{r}.log").read_text(errors="replace")
