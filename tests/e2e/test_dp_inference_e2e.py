"""DP inference end to end: ``rankscope launch`` over N independent rank-0 workers.

Two launches, each a real coordinator on a real local Ray, a real node agent and three
real MindSpore worker processes (tiny model, 5 tokens, 3 requests):

- a faulty run: every worker claims rank 0 (the agent remaps them), one worker's
  weight in block 1 is perturbed just before decode iteration 2; incident.json must
  name that worker's assigned rank, token 2 and a block-1 tensor, carry the rank map,
  and every worker must have its own dump folder and bundle;
- a clean run in which each worker passes its own id as ``start(rank_id=...)``: no
  incident, the explicit ids kept as the dump folders.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

ROOT = REPO
EXAMPLE = ROOT / "examples" / "dp_inference"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

from token_index import token_of  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

WORKERS, TOKENS, REQUESTS, TOKEN_RANGE = 3, 5, 3, (1, 3)
FAULTY_WORKER, FAULTY_LAYER, FAULTY_TOKEN = 2, 1, 2
CELLS = 24


def launch(tmp: Path, *serve_args: str, fault: str | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    export = tmp / "export"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_") and k != "INFER_FAULT"}
    if fault:
        env["INFER_FAULT"] = fault
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(export),
           "--config", str(EXAMPLE / "config.json"), "--",
           sys.executable, str(EXAMPLE / "serve.py"), "--workers", str(WORKERS), "--tokens", str(TOKENS),
           "--requests", str(REQUESTS), "--debugger", "--token-range", *map(str, TOKEN_RANGE),
           "--out", str(tmp / "results"), *serve_args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    return proc, export


def worker_results(tmp: Path) -> dict[int, dict]:
    return {i: json.loads((tmp / "results" / f"worker{i}.json").read_text()) for i in range(WORKERS)}


def local_dumps(export: Path) -> dict[str, dict]:
    step0 = export / "local_dump" / "step0"
    return {p.name: json.loads((p / "dump.json").read_text())["data"] for p in sorted(step0.iterdir())}


# ---------------------------------------------------------------- faulty run
@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp_e2e_fault")
    proc, export = launch(tmp, fault=f"perturb_weight:{FAULTY_WORKER}:{FAULTY_LAYER}:{FAULTY_TOKEN}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    incidents = sorted((export / "incidents").glob("*/incident.json"))
    assert len(incidents) == 1, (proc.stdout[-4000:], incidents)
    return {"proc": proc, "export": export, "incident": json.loads(incidents[0].read_text()),
            "dir": incidents[0].parent, "results": worker_results(tmp)}


def rank_of_worker(run: dict, worker: int) -> int:
    pid = run["results"][worker]["pid"]
    rows = [r for r in run["incident"]["rank_map"]["entries"] if r["pid"] == pid]
    assert len(rows) == 1, run["incident"]["rank_map"]
    return int(rows[0]["assigned_rank"])


def test_clashing_rank0_claims_get_distinct_ids_recorded_in_the_export(faulty):
    doc = faulty["incident"]["rank_map"]
    # incident.json's map has the shape of the rank_map.json beside it (rows may be newer there)
    beside = json.loads((faulty["dir"] / "rank_map.json").read_text())
    assert doc["format"] == beside["format"]
    assert {(r["pid"], r["assigned_rank"]) for r in doc["entries"]} == \
        {(r["pid"], r["assigned_rank"]) for r in beside["entries"]}
    rank_map = doc["entries"]
    assert all(r["label"] == f"rank{r['assigned_rank']}" for r in rank_map), rank_map
    pids = {r["pid"] for r in faulty["results"].values()}
    assert {r["pid"] for r in rank_map} == pids
    assert all(r["claimed_rank"] == 0 for r in rank_map)
    assert sorted(r["assigned_rank"] for r in rank_map) == list(range(WORKERS))
    assert sum(r["remapped"] for r in rank_map) == WORKERS - 1


def test_incident_names_the_faulty_worker_and_block(faulty):
    inc = faulty["incident"]
    assert inc["detector"] == "replica"
    assert inc["first_diverging_rank"] == rank_of_worker(faulty, FAULTY_WORKER)
    assert inc["ties"] == []
    assert inc["step"] == 0  # the first request
    assert f"Cell.layers.{FAULTY_LAYER}.attn.qkv." in inc["tensor"]
    assert f"rank {inc['first_diverging_rank']} diverged first" in faulty["proc"].stdout


def test_incident_tensor_is_at_the_token_where_the_worker_departs(faulty):
    # forward.<n> under token_range [a, b] is token a + n on every worker
    tensor = faulty["incident"]["tensor"]
    assert token_of(tensor, TOKEN_RANGE) == FAULTY_TOKEN, tensor


def test_incident_token_field_is_the_departure_token(faulty):
    inc = faulty["incident"]
    assert inc.get("token") == FAULTY_TOKEN, (inc.get("token"), inc["tensor"])


def test_every_worker_has_its_own_dump_folder_and_bundle(faulty):
    dumps = local_dumps(faulty["export"])
    assert sorted(dumps) == [f"rank{r}" for r in range(WORKERS)]
    n_tokens = TOKEN_RANGE[1] - TOKEN_RANGE[0] + 1
    assert all(len(d) == CELLS * n_tokens for d in dumps.values())  # nothing overwritten
    clean = [dumps[f"rank{rank_of_worker(faulty, w)}"] for w in range(WORKERS) if w != FAULTY_WORKER]
    assert clean[0] == clean[1]
    assert dumps[f"rank{rank_of_worker(faulty, FAULTY_WORKER)}"] != clean[0]
    bundles = faulty["incident"]["bundles"]
    assert sorted(int(r) for r in bundles) == list(range(WORKERS))
    for rank in range(WORKERS):  # every worker's bundle arrived whole (its manifest is there)
        assert list((faulty["dir"] / f"rank_{rank}").rglob("manifest.json")), rank


# ----------------------------------------------------------------- clean run
def test_clean_run_with_explicit_worker_ids_has_no_incident(tmp_path):
    proc, export = launch(tmp_path, "--pass-worker-id")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "no divergence found" in proc.stdout
    assert not list((export / "incidents").glob("*/incident.json"))
    dumps = local_dumps(export)
    # each worker's own id names its folder: no remap was needed
    assert sorted(dumps) == [f"rank{i}" for i in range(WORKERS)]
    assert dumps["rank0"] == dumps["rank1"] == dumps["rank2"]
    rank_map = json.loads(next((export / "agent_bundles").glob("*/rank_map.json")).read_text())
    by_pid = {r["pid"]: r for r in rank_map["entries"]}
    for i, res in worker_results(tmp_path).items():
        assert by_pid[res["pid"]]["claimed_rank"] == by_pid[res["pid"]]["assigned_rank"] == i
