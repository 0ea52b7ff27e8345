"""End to end: hybrid-parallel 4-rank msrun jobs under ``rankscope launch`` with no config.

Two jobs that know nothing about rankscope: ``jobs/hybrid_tp.py`` (2 data-parallel
replicas x 2 tensor-parallel shards, groups made with ``create_group``, a row-parallel
layer's ``ops.AllReduce(group=tp)``, gradients averaged by
``DistributedGradReducer(group=dp)``; a PyNative loop or a compiled GRAPH step) and
``jobs/hybrid_pp.py`` (2 replicas x 2 pipeline stages handing activations on with
AllReduce in stage-pair groups). The shards of a weight differ by design: the clean runs
must train exactly as unwatched, with the layout said right; each injected fault must name
its rank and step though no majority exists among two replicas. The tensor-parallel job
keeps a LayerNorm whole on both shards and the pipeline job a word embedding tied between
its stages: kept in step they are clean; with the gradient sum between the copies
forgotten (a bug every rank runs) the verdict names the weight and no rank.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.coordinator.cli.demo import msrun_command

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
JOBS = Path(__file__).parent / "jobs"
TP_LAYOUT = ("layout: 2 data-parallel replicas x 2 tensor-parallel shards; replicas {0,2} {1,3} "
             "(from gradient reducer groups)")


def launch(tmp_path: Path, job: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, Path, list[dict]]:
    out = tmp_path / "out"
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HYBRID_", "PP_"))}
    full.pop("MINDSPORE_DUMP_CONFIG", None)
    full.update(env)
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out), "--on-divergence", "terminate",
           "--", *msrun_command(4, out / "msrun_logs", JOBS / job)]
    proc = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=400)
    incidents = [json.loads(p.read_text()) for p in sorted((out / "incidents").glob("*/incident.json"))] \
        if (out / "incidents").exists() else []
    return proc, out, incidents


def explain(proc: subprocess.CompletedProcess, out: Path) -> str:
    logs = ""
    for log in sorted((out / "msrun_logs").glob("worker_*.log"))[:4]:
        logs += f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-12:])
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-1500:]}{logs}"


def losses(log_dir: Path) -> list[str]:
    return sorted(line for log in log_dir.glob("worker_*.log") for line in log.read_text(errors="replace").splitlines()
                  if line.startswith("rank ") and " step " in line)


def first(incidents: list[dict]) -> tuple:
    inc = incidents[0]
    return inc["detector"], inc["first_diverging_rank"], inc["step"]


def test_a_clean_tensor_parallel_job_trains_as_unwatched_and_its_layout_is_said(tmp_path):
    proc, out, incidents = launch(tmp_path, "hybrid_tp.py", {"HYBRID_STEPS": "8", "HYBRID_NORM": "1"})
    assert proc.returncode == 0 and incidents == [], explain(proc, out)
    assert f"[rankscope] {TP_LAYOUT}" in proc.stdout
    assert "no divergence found in 4 of 4 rank(s) watched" in proc.stdout
    plain_logs = tmp_path / "plain"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYBRID_")}
    env["HYBRID_NORM"] = "1"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # msrun, and its workers' python
    plain = subprocess.run(msrun_command(4, plain_logs, JOBS / "hybrid_tp.py"), capture_output=True, text=True,
                           timeout=300, env=env)
    assert plain.returncode == 0, plain.stdout[-2000:]
    watched = losses(out / "msrun_logs")
    assert len(watched) == 32 and watched == losses(plain_logs)


def test_local_gradients_x50_on_one_of_two_replicas_name_that_rank(tmp_path):
    proc, out, incidents = launch(tmp_path, "hybrid_tp.py", {"HYBRID_FAULT": "scale_grad:3:5"})
    assert incidents, explain(proc, out)
    assert first(incidents) == ("outlier", 3, 5), explain(proc, out)
    assert incidents[0]["tensor"].startswith("Sentinel.grad_local.")
    assert incidents[0]["evidence"]["other_replica"] == 1
    assert proc.returncode == 86, explain(proc, out)


def test_a_weight_nudged_on_one_of_two_replicas_names_that_rank_at_the_next_step(tmp_path):
    proc, out, incidents = launch(tmp_path, "hybrid_tp.py", {"HYBRID_FAULT": "nudge:3:4"})
    assert incidents and first(incidents) == ("replica", 3, 4), explain(proc, out)
    assert "outside the optimizer" in incidents[0]["evidence"]["rule"]
    assert incidents[0]["decided"] is True


def test_a_compiled_tensor_parallel_step_runs_clean(tmp_path):
    proc, out, incidents = launch(tmp_path, "hybrid_tp.py", {"HYBRID_MODE": "graph", "HYBRID_STEPS": "6",
                                                             "HYBRID_NORM": "1"})
    assert proc.returncode == 0 and incidents == [], explain(proc, out)
    assert f"[rankscope] {TP_LAYOUT}" in proc.stdout
    assert "ranks 0-3: GRAPH mode, watched through the kernel dump" in proc.stdout


def test_a_nan_in_one_tensor_parallel_ranks_batch_names_it_not_its_peer_in_graph_mode(tmp_path):
    """Both shards of replica 0 read the batch; only rank 1's copy has the NaN. Rank 0 gets
    it through the row-parallel AllReduce, compiled, seen through the kernel dump."""
    proc, out, incidents = launch(tmp_path, "hybrid_tp.py", {"HYBRID_MODE": "graph", "HYBRID_FAULT": "nan_batch:1:4"})
    assert incidents and first(incidents) == ("nan_origin", 1, 4), explain(proc, out)


def test_a_nan_made_in_pipeline_stage_0_names_that_stage_not_the_one_it_reached(tmp_path):
    """With the embedding tied and kept in step: steps 0-3 are clean, and the NaN stage 1's
    gradient of the table carries back into stage 0 through the tied sum does not hide
    where it was made."""
    proc, out, incidents = launch(tmp_path, "hybrid_pp.py", {"PP_FAULT": "nan_batch:1:4", "PP_TIED": "1"})
    assert incidents and first(incidents) == ("nan_origin", 1, 4), explain(proc, out)
    assert incidents[0]["evidence"]["received_through_a_collective"] == [3]
    assert ("layout: 2 data-parallel replicas x 2 pipeline stages; replicas {0,1} {2,3}" in proc.stdout)


def test_a_rank_that_exits_is_named_in_a_compiled_tensor_parallel_job(tmp_path):
    proc, out, incidents = launch(tmp_path, "hybrid_tp.py", {"HYBRID_MODE": "graph", "HYBRID_FAULT": "exit:2:4"})
    assert incidents and first(incidents) == ("progress", 2, 4), explain(proc, out)


def _job_wide(proc: subprocess.CompletedProcess, out: Path, incidents: list[dict], tensor: str, agree: list,
              group: str) -> None:
    assert proc.returncode == 0 and len(incidents) == 1, explain(proc, out)
    inc = incidents[0]
    ev = inc["evidence"]
    assert (inc["detector"], inc["tensor"], inc["decided"]) == ("replica", tensor, False), inc
    assert inc["step"] in (0, 1) and ev["systematic"] is True
    assert sorted(ev["agreeing_sets"]) == agree  # the replicas of a shard or stage agree
    assert f"not summed across {group}" in ev["probable_cause"]
    assert "no rank named: every rank runs this split" in proc.stdout and "diverged first" not in proc.stdout


def test_a_norm_whose_gradient_is_not_summed_over_the_tensor_parallel_group_is_named_with_no_rank_compiled(tmp_path):
    proc, out, incidents = launch(tmp_path, "hybrid_tp.py", {"HYBRID_MODE": "graph", "HYBRID_NORM": "unsynced",
                                                             "HYBRID_STEPS": "5"})
    _job_wide(proc, out, incidents, "Sentinel.param.norm.gamma", [[0, 2], [1, 3]],
              "the tensor-parallel group (ranks 0, 1; ranks 2, 3)")


def test_a_tied_embedding_whose_stages_are_not_summed_is_named_with_no_rank(tmp_path):
    proc, out, incidents = launch(tmp_path, "hybrid_pp.py", {"PP_TIED": "unsynced", "PP_STEPS": "5"})
    _job_wide(proc, out, incidents, "Sentinel.param.word_embeddings", [[0, 1], [2, 3]],
              "the embedding group (ranks 0, 2; ranks 1, 3)")
