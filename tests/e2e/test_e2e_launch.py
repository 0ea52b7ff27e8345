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
from rankscope.coordinator.launch.watched import INCIDENT_EXIT

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
    # The full watch: it dumps every step's Cells, where the default dumps them only while
    # its per-Cell hooks run (they come off in blocks from step 3 to measure their cost).
    proc, out, incidents = run_launch(tmp_path, None, steps=6, join=False,
                                      config={"level": "L0", "cluster": {"dump_keep_steps": 3, "watch": "full"}})
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


def _weights(log_dir: Path) -> dict[str, str]:
    """Each rank's closing ``weights crc32`` from its msrun log."""
    out = {}
    for log in log_dir.glob("worker_*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if " weights crc32 " in line:
                out[line.split("/")[0]] = line.rsplit(" ", 1)[1]
    return out


def test_a_value_corrupted_once_is_transient_and_skip_trains_as_a_clean_run(tmp_path):
    """Silent data corruption: rank 2 miscomputes one value of step 5's forward, once.
    Its re-run does not reproduce it; with on_transient skip the step goes on with the
    re-run's result, the job is not stopped (--on-divergence terminate notwithstanding),
    and every rank's weights end bit for bit as in an unwatched run that never saw it."""
    proc, out, incidents = run_launch(tmp_path, "sdc_once:2:5", config={"cluster": {"on_transient": "skip"}})
    assert incidents, "no incident written\n" + _explain(proc, out)
    inc = incidents[0]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == ("nan_origin", 2, 5), _explain(proc, out)
    rerun = inc["evidence"]["rerun"]
    assert (rerun["outcome"], rerun["used_rerun"], inc["policy"]) == ("transient", True, "continue"), rerun
    assert "re-run   : transient on rank 2: rank 2 saw a loss that is not finite at step 5" in proc.stdout
    assert "re-runs of anomalous steps: rank 2: 1 transient (step 5)" in proc.stdout
    assert "replayed :" not in proc.stdout  # a one-off is settled by the rank's own re-run
    # The record rides in rank 2's exported bundle: the offline replay works from the
    # incident folder alone once the rank's own copy is gone.
    assert list((Path(inc["_dir"]) / "rank_2").glob("rdr*/replay/step5/meta.json")), _explain(proc, out)
    local = Path(rerun["replay"])
    local.rename(local.with_name("moved-away"))
    offline = _rerun(inc["_dir"])
    assert offline.returncode == 0 and offline.stdout.startswith("transient on rank 2: step 5 reproduces neither"), \
        offline.stdout + offline.stderr
    watched = _weights(out / "msrun_logs")
    env = {k: v for k, v in os.environ.items() if k != "TRAIN_FAULT"}
    env.update(TRAIN_STEPS="8", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    plain = subprocess.run(msrun_command(RANKS, tmp_path / "plain"), env=env, capture_output=True, text=True,
                           timeout=300)
    assert plain.returncode == 0, plain.stdout[-2000:]
    clean = _weights(tmp_path / "plain")
    assert len(clean) == RANKS and len(set(clean.values())) == 1, clean
    assert watched == clean, (watched, clean)


def _rerun(incident: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([sys.executable, "-m", "rankscope", "rerun", str(incident)], env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_rank_wrong_on_every_execution_is_named_alone_by_a_replay_elsewhere(tmp_path):
    """Rank 2 computes one value of step 5 wrong every time it runs it: its own re-run
    gives the fault again, a replay of the same call in another process (the job's own
    script, attached by rankscope) does not, so the device is suspected, at the end of the
    run and again offline with rankscope rerun."""
    proc, out, incidents = run_launch(tmp_path, "sdc_always:2:5")
    assert incidents, "no incident written\n" + _explain(proc, out)
    inc = incidents[0]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == ("nan_origin", 2, 5), _explain(proc, out)
    assert inc["evidence"]["rerun"]["outcome"] == "reproduced"
    assert "replayed : rank 2 only: step 5 reproduces on rank 2, not on a replay here" in proc.stdout, \
        _explain(proc, out)
    assert json.loads((inc["_dir"] / "rerun.json").read_text())["class"] == "rank_only"
    (inc["_dir"] / "rerun.json").unlink()
    offline = _rerun(inc["_dir"])
    assert offline.returncode == 0 and offline.stdout.startswith("rank 2 only: "), offline.stdout + offline.stderr
    assert json.loads((inc["_dir"] / "rerun.json").read_text())["class"] == "rank_only"


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
    if fault.startswith("nan_batch"):
        # The rank saw its gradients go non-finite before the reduction and re-ran the
        # step: the NaN is in its batch, so it came back.
        assert inc["evidence"]["rerun"]["outcome"] == "reproduced", inc["evidence"]
        assert f"re-run   : reproduces: rank {rank} saw gradients that are not finite" in proc.stdout
        # Replayed in another process at the end of the run: the NaN is in the inputs.
        assert (f"replayed : deterministic: step {step} reproduces on rank {rank}'s re-run and on a replay here "
                "(bit for bit)") in proc.stdout, _explain(proc, out)
        assert json.loads((inc["_dir"] / "rerun.json").read_text())["class"] == "deterministic"
    # The report of this real run, as a browser lays it out: the verdict outlined on the
    # heatmap and marked on the curves at the named step; the NaN marked.
    if CHROMIUM is None:
        pytest.skip(f"the verdict was checked; report.html was not: {NO_CHROMIUM}")
    page = dom(inc["_dir"] / "report.html")
    check_verdict_marks(page, rank, step)
    if detector == "nan_origin":
        assert f'id="nonfinite-r{rank}-s{step}"' in section(page, "curve-grad_norm")
        assert cells(page, "stats", rank)[4] == str(inc["evidence"]["nan_count"])
