"""End to end: a real 4-rank msrun MindSpore job on CPU under ``rankscope launch``.

Each case injects one real fault of one kind on one rank at one step (the training
script is plain MindSpore; see examples/train_dp.py) and checks the verdict on disk:
the detector, the first diverging rank and the step, plus that every rank's bundle and
the report were exported. A clean run must exit 0 and raise nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from report_dom import CHROMIUM, NO_CHROMIUM, cells, check_verdict_marks, dom, section

from rankscope.coordinator.cli.demo import msrun_command
from rankscope.coordinator.launch.runner import INCIDENT_EXIT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
RANKS = 4


def run_launch(tmp_path: Path, fault: str | None, steps: int = 8, action: str = "terminate", join: bool = True,
               config: dict | None = None):
    out = tmp_path / "out"
    env = dict(os.environ)
    env["TRAIN_STEPS"] = str(steps)
    env.pop("TRAIN_FAULT", None)
    if fault:
        env["TRAIN_FAULT"] = fault
    # --grace 3: after a terminate the ranks are gone within a second (at their step
    # boundary, or taken down by msrun after a dead peer), but msrun lingers on its
    # scheduler; the default 10 s grace was waited out on every terminated run.
    msrun = msrun_command(RANKS, out / "msrun_logs")
    if not join:
        msrun.remove("--join=True")
    given = []
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        given = ["--config", str(tmp_path / "config.json")]
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out), "--grace", "3", *given,
           "--on-divergence", action, "--", *msrun]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    incidents = sorted((out / "incidents").glob("*/incident.json")) if (out / "incidents").exists() else []
    return proc, out, [json.loads(p.read_text()) | {"_dir": p.parent} for p in incidents]


def _explain(proc, out: Path) -> str:
    logs = ""
    for log in sorted((out / "msrun_logs").glob("worker_*.log"))[:4]:
        logs += f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    agent_log = out / "node_agent.log"
    if agent_log.exists():
        logs += "\n--- node_agent.log\n" + "\n".join(agent_log.read_text(errors="replace").splitlines()[-20:])
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}{logs}"


def test_clean_run_exits_zero_with_no_incident(tmp_path):
    # msrun as typed without --join: its default (False) returns at once, with the
    # workers still starting; launch runs it joined and says so.
    # A local dump kept to the newest 3 steps of each rank, as a long run keeps its newest 100.
    proc, out, incidents = run_launch(tmp_path, None, steps=6, join=False,
                                      config={"level": "L0", "cluster": {"dump_keep_steps": 3}})
    assert proc.returncode == 0, _explain(proc, out)
    assert incidents == [], incidents
    assert "no divergence found" in proc.stdout
    assert "running it with --join=True" in proc.stdout and "watched steps 0-5 on 4/4 ranks" in proc.stdout
    # The local dump is msProbe's layout, one folder per rank, the newest steps only.
    ranks = sorted(p.name for p in (out / "local_dump").glob("step5/rank*"))
    assert ranks == [f"rank{r}" for r in range(RANKS)], ranks
    assert sorted(p.name for p in (out / "local_dump").glob("step*")) == ["step3", "step4", "step5"]
    assert ("local dump: ranks 0-3 keep steps 3-5 on disk, 3 earlier step(s) removed (keeps the newest 3 steps, "
            "at most 1024 MB, at most 20000 files; older steps removed by the rolling window)") in proc.stdout


@pytest.mark.parametrize("fault, detector, rank, step", [
    # ReLU hides this NaN from the loss; AllReduce then spreads it to every rank's
    # reduced gradient. The origin, not a receiver, must be named.
    ("nan_batch:2:3", "nan_origin", 2, 3),
    ("scale_grad:1:4", "outlier", 1, 4),
    ("perturb_weight:3:3", "replica", 3, 3),
    ("seed:1:0", "replica", 1, 0),
    # A SIGKILLed rank: tests/e2e/test_two_nodes.py (kill:2:4, the rank on the second
    # node) and test_crashes.py (a rank exiting 137, with the report's failure marks).
])
def test_injected_fault_is_named(tmp_path, fault, detector, rank, step):
    proc, out, incidents = run_launch(tmp_path, fault)
    assert incidents, "no incident written\n" + _explain(proc, out)
    inc = incidents[0]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == (detector, rank, step), \
        json.dumps({k: v for k, v in inc.items() if k != "_dir"}, indent=1, default=str)[:3000]
    for key in ("incident_id", "tensor", "detected_at", "evidence", "ranks", "bundles"):
        assert key in inc, key
    assert (inc["_dir"] / "report.html").is_file()
    # Every rank's bundle was exported over the wire.
    for r in range(RANKS):
        assert any((inc["_dir"] / f"rank_{r}" / "rdr").iterdir()), f"rank {r} has no bundle"
    assert proc.returncode == INCIDENT_EXIT, _explain(proc, out)
    assert f"rank {rank} diverged first" in proc.stdout
    # The report of this real run, as a browser lays it out: the verdict outlined on the
    # heatmap and marked on the curves at the named step; the NaN marked.
    if CHROMIUM is None:
        pytest.skip(f"the verdict was checked; report.html was not: {NO_CHROMIUM}")
    page = dom(inc["_dir"] / "report.html")
    check_verdict_marks(page, rank, step)
    if detector == "nan_origin":
        assert f'id="nonfinite-r{rank}-s{step}"' in section(page, "curve-grad_norm")
        assert cells(page, "stats", rank)[4] == str(inc["evidence"]["nan_count"])
