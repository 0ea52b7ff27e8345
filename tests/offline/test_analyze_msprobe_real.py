"""``rankscope analyze`` on dump trees written by the published msProbe (mindstudio-probe),
not by rankscope: MindSpore trees made here by a real 4-rank msrun job, PyTorch trees from
the checked-in fixture (``make_torch_fixture.py`` says how it was made). Each fault is named
at its rank, step and first tensor; a clean tree gives no incident; the report is written."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from rankscope.coordinator.cli.demo import msrun_command

HERE = Path(__file__).parent
TORCH_FIXTURE = HERE / "fixtures" / "msprobe_torch.tar.gz"


def analyze(root: Path, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    proc = subprocess.run([sys.executable, "-m", "rankscope", "analyze", str(root), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    incidents = [json.loads(p.read_text()) for p in sorted((out / "incidents").glob("*/incident.json"))] \
        if (out / "incidents").exists() else []
    return proc, incidents


def named(incidents: list[dict]) -> tuple:
    v = incidents[0]
    return v["detector"], v["first_diverging_rank"], v["step"], v["tensor"]


def report_opens(out: Path, rank: int) -> None:
    (page,) = list((out / "incidents").glob("*/report.html"))
    html = page.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and f"rank {rank}" in html


# --- PyTorch, from the fixture --------------------------------------------------------------
@pytest.fixture(scope="module")
def torch_trees(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("torch")
    with tarfile.open(TORCH_FIXTURE) as tar:
        tar.extractall(root, filter="data")
    return root


@pytest.mark.parametrize("tree, expect", [
    ("nan_batch", ("nan_origin", 2, 3, "Functional.linear.0.forward.input.0")),
    ("md5_nan", ("nan_origin", 2, 3, "Functional.linear.0.forward.input.0")),
    ("scale_grad", ("outlier", 1, 3, "Tensor.mul_.0.forward.output.0")),
    ("drift_weight", ("replica", 3, 3, "Functional.linear.1.forward.input.1")),
])
def test_pytorch_msprobe_trees_name_the_faulty_rank_step_and_tensor(torch_trees, tmp_path, tree, expect):
    proc, incidents = analyze(torch_trees / tree, tmp_path / "out")
    assert proc.returncode == 86 and incidents, proc.stdout + proc.stderr
    assert named(incidents) == expect, proc.stdout
    assert "framework pytorch" in proc.stdout
    report_opens(tmp_path / "out", expect[1])


def test_a_clean_pytorch_msprobe_tree_gives_no_incident(torch_trees, tmp_path):
    proc, incidents = analyze(torch_trees / "clean", tmp_path / "out")
    assert proc.returncode == 0 and not incidents, proc.stdout
    assert "no divergence found in 4 rank(s) (ranks 0-3), steps 0-4" in proc.stdout


# --- MindSpore, made here -------------------------------------------------------------------
def msprobe_job(out: Path, fault: str, **env: str) -> Path:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MSP_")}
    full.pop("MINDSPORE_DUMP_CONFIG", None)
    full.update({"MSP_FAULT": fault, "MSP_DUMP": str(out / "dump"), "MSP_CFG_DIR": str(out / "cfg"),
                 "MSP_STEPS": "4", **env})
    full["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{full.get('PATH', '')}"  # msrun
    proc = subprocess.run(msrun_command(4, out / "logs", HERE / "jobs" / "msprobe_ms_dp.py"), env=full,
                          capture_output=True, text=True, timeout=400)
    logs = "".join(p.read_text(errors="replace")[-1500:] for p in sorted((out / "logs").glob("worker_*.log")))
    assert proc.returncode == 0, proc.stdout[-2000:] + logs
    return out / "dump"


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault, env, expect", [
    ("nan_batch:2:3", {"MSP_SUMMARY": "md5"}, ("nan_origin", 2, 3, "Primitive.shape_op.Shape.0.forward.input.0")),
    ("scale_grad:1:3", {"MSP_TASK": "tensor"}, ("outlier", 1, 3, "Tensor.__mul__.1.forward.output.0")),
    ("drift_weight:3:3", {}, ("replica", 3, 3, "Primitive.matmul.MatMul.1.forward.input.1")),
])
def test_mindspore_msprobe_trees_made_here_name_the_fault_and_before_it_are_clean(tmp_path, fault, env, expect):
    dump = msprobe_job(tmp_path, fault, **env)
    proc, incidents = analyze(dump, tmp_path / "out")
    assert proc.returncode == 86 and incidents, proc.stdout + proc.stderr
    assert named(incidents) == expect, proc.stdout
    assert "framework mindspore" in proc.stdout
    report_opens(tmp_path / "out", expect[1])
    # The steps before the fault are a clean msProbe tree of the same job.
    clean = tmp_path / "clean"
    for step in (0, 1, 2):
        shutil.copytree(dump / f"step{step}", clean / f"step{step}")
    proc, incidents = analyze(clean, tmp_path / "out_clean")
    assert proc.returncode == 0 and not incidents, proc.stdout


def test_the_report_shows_the_module_and_the_code_from_msprobes_own_construct_and_stack(torch_trees, tmp_path):
    analyze(torch_trees / "drift_weight", tmp_path / "out")
    (page,) = list((tmp_path / "out" / "incidents").glob("*/report.html"))
    html = page.read_text()
    where = html[html.index('id="where"'):]
    assert "Module.3.Linear.forward.0" in where  # model[3], the layer whose weight drifted
    assert "make_torch_fixture.py" in where and "mse_loss(model(x), y)" in where
