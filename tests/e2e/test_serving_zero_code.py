"""A DP inference server with no rankscope code in it, run under ``rankscope launch``.

jobs/queue_server.py: a router process and three spawned worker processes behind
queues, each worker ``RANK_ID=0``/``LOCAL_RANK=0``/``WORLD_SIZE=1`` with a vLLM-style
``VLLM_DP_RANK``; prefill + greedy decode with a KV cache, four request batches of
different shapes. One launch (real coordinator on a real local Ray, real node agent,
real MindSpore workers) proves, batch by batch:

- batch 0 is clean: no verdict about it, and the three workers' dumps of it are
  identical (zero-code found the same root and cut the same tokens everywhere);
- batch 1: worker 1's weight drifts by 1e-3 before forward call 2 -> replica names
  worker 1, request batch (step) 1, token 2, the perturbed layer;
- batch 2: worker 2 gets a NaN weight before call 3 -> nan_origin names worker 2 at
  step 2, token 3 (filed under the open incident or as its own);
- batch 3: worker 0 is SIGKILLed inside forward call 1 -> progress names worker 0 at
  step 3, token 1, and says where the two other workers were.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.wire.rank_map import rank_map_entries

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.timeout(600)]

SERVER = Path(__file__).parent / "jobs" / "queue_server.py"
WORKERS, BATCHES, NEW_TOKENS = 3, 4, 4
DRIFT, NAN, KILL = (1, 2, 1), (2, 3, 2), (0, 1, 3)  # (worker, forward call, request batch)
CONFIG = {"task": "statistics", "level": "L0", "statistics": {"summary_mode": "md5"},
          "cluster": {"groups": "replicas", "on_divergence": "export", "token_range": [0, NEW_TOKENS - 1]}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serving")
    (tmp / "config.json").write_text(json.dumps(CONFIG))
    export = tmp / "export"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "VLLM_", "SERVE_"))}
    env["SERVE_FAULT"] = ",".join(f"{kind}:{w}:{t}:{b}" for kind, (w, t, b) in
                                  (("drift", DRIFT), ("nan", NAN), ("kill", KILL)))
    cmd = [sys.executable, "-m", "rankscope", "launch", "--config", str(tmp / "config.json"),
           "--export-dir", str(export), "--",
           sys.executable, str(SERVER), "--workers", str(WORKERS), "--batches", str(BATCHES),
           "--new-tokens", str(NEW_TOKENS), "--out", str(tmp / "results.json")]
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=540)
    explain = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    incidents = [json.loads(p.read_text()) for p in sorted((export / "incidents").glob("*/incident.json"))] \
        if (export / "incidents").exists() else []
    results = json.loads((tmp / "results.json").read_text()) if (tmp / "results.json").exists() else {}
    return {"proc": proc, "export": export, "incidents": incidents, "results": results, "explain": explain}


def rank_of(run: dict, worker: int) -> int:
    pid = run["results"]["pids"][str(worker)]
    rows = [r for inc in run["incidents"] for r in rank_map_entries(inc["rank_map"]) if r["pid"] == pid]
    assert rows, (worker, pid, run["explain"])
    return int(rows[0]["assigned_rank"])


def verdicts(run: dict) -> list[dict]:
    """Every verdict: each incident's own and the ones filed under it."""
    out = []
    for inc in run["incidents"]:
        out.append({"detector": inc["detector"], "rank": inc["first_diverging_rank"], "step": inc["step"],
                    "token": inc["token"], "tensor": inc["tensor"], "evidence": inc["evidence"]})
        out += inc.get("related_verdicts") or []
    return out


def the(run: dict, detector: str) -> dict:
    found = [v for v in verdicts(run) if v["detector"] == detector]
    assert len(found) == 1, ([(v["detector"], v["rank"], v["step"]) for v in verdicts(run)], run["explain"])
    return found[0]


def _ranks_saying(text: str, what: str) -> set[int]:
    """The ranks launch's watch lines give ``what`` for: ``rank 4: what``, ``ranks 0-2, 5: what``."""
    out: set[int] = set()
    for m in re.finditer(rf"ranks? ([0-9, -]+): {re.escape(what)}", text):
        for part in m.group(1).split(","):
            lo, _, hi = part.strip().partition("-")
            out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def test_each_worker_says_its_serving_model_was_found_and_launch_shows_it(run):
    proc = run["proc"]
    assert proc.returncode == 0, run["explain"]
    assert proc.stderr.count("serving model GQADecoder found, watched forward-only, one step per request batch") \
        == WORKERS, run["explain"]
    # One line per worker, or one for the workers that said alike at once (``ranks 0-2: ...``).
    said = _ranks_saying(proc.stdout, "PyNative mode, watched through hooks on serving model GQADecoder")
    assert said == set(range(WORKERS)), run["explain"]
    assert "router: 2 of 3 workers served every batch" in proc.stdout  # the server itself was not disturbed


def test_the_clean_batch_has_no_verdict_and_identical_dumps_under_the_export_folder(run):
    assert all(v["step"] >= 1 for v in verdicts(run)), run["explain"]
    step0 = run["export"] / "local_dump" / "step0"
    dumps = {p.name: json.loads((p / "dump.json").read_text())["data"] for p in sorted(step0.iterdir())}
    assert sorted(dumps) == [f"rank{r}" for r in range(WORKERS)]
    first = dumps["rank0"]
    assert all(d == first for d in dumps.values())
    # every forward call 0..NEW_TOKENS-1 of the root is recorded: prefill + decode
    assert {k.rsplit(".", 1)[-1] for k in first if k.startswith("Cell.norm.RMSNorm.forward.")} == \
        {str(t) for t in range(NEW_TOKENS)}


def test_weight_drift_names_the_worker_its_request_batch_and_the_first_token(run):
    w, token, batch = DRIFT
    v = the(run, "replica")
    assert (v["rank"], v["step"], v["token"]) == (rank_of(run, w), batch, token), v
    assert v["tensor"].startswith("Cell.blocks.1.attn.q."), v


def test_a_nan_at_decode_token_t_names_the_worker_at_t(run):
    w, token, batch = NAN
    v = the(run, "nan_origin")
    assert (v["rank"], v["step"], v["token"]) == (rank_of(run, w), batch, token), v
    assert "blocks.1.attn.q" in v["tensor"], v


def test_a_killed_worker_is_named_with_its_token_and_the_others_state(run):
    w, token, batch = KILL
    v = the(run, "progress")
    assert (v["rank"], v["step"], v["token"]) == (rank_of(run, w), batch, token), v
    ev = v["evidence"]
    assert ev["signal"] == "SIGKILL" and f"token {token}" in ev["manner"], ev
    others = {o["rank"]: o for o in ev["others"]}
    assert sorted(others) == sorted(rank_of(run, o) for o in range(WORKERS) if o != w)
    # The workers decode in lockstep, and what the coordinator last heard of the others may
    # be a batch behind or (the server leaving) the batch finished; never a batch after it.
    # "paused": the earlier incidents' exports hold the job at a step boundary, and a worker
    # may still be held (or its "resumed" not yet heard) when worker 0 dies.
    assert all(o["state"] in ("running", "finished", "paused") and o["started"] in (batch - 1, batch)
               and o["last_step"] in (o["started"] - 1, o["started"]) and o["heard_s"] >= 0
               for o in others.values()), others
    # The death opens its own incident, or (an earlier incident still exporting) is filed
    # under that one; launch's verdict says so either way, with the token and how it died.
    out, r = run["proc"].stdout, rank_of(run, w)
    if any(inc["detector"] == "progress" for inc in run["incidents"]):
        assert f"rank {r} failed first" in out and f"token    : {token}" in out, out
    else:
        assert f"also     : progress names rank {r} at step {batch}, token {token} (killed by SIGKILL" in out, out


def test_ids_follow_the_servers_worker_order(run):
    assert [rank_of(run, w) for w in range(WORKERS)] == list(range(WORKERS))
