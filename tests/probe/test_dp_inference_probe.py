"""The DP inference example under rankscope's probe, without the cluster side.

Three real worker processes, all claiming rank 0, each passing its own worker id as
``start(rank_id=...)`` (msProbe's SGLang advice) and capturing ``token_range=[1, 3]``
of a 5-token greedy decode. Checked on the local dumps: one folder per worker, only
decode iterations 1..3 recorded (prefill excluded, told apart by its shape), records
aligned by token index, clean replicas bit-identical and the faulty worker departing
at the token and layer its fault names.
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

from token_index import call_index, token_of  # noqa: E402

WORKERS, TOKENS, TOKEN_RANGE, PROMPT_LEN = 3, 5, (1, 3), 4
FAULT = "perturb_weight:1:1:2"  # worker 1, block 1, just before decode iteration 2
CELLS = 24  # recorded cells of the tiny decoder (every Cell below the root)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp_probe")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    env["INFER_FAULT"] = FAULT
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "serve.py"), "--workers", str(WORKERS), "--tokens", str(TOKENS),
         "--debugger", "--pass-worker-id", "--token-range", *map(str, TOKEN_RANGE),
         "--dump-path", str(tmp / "dump"), "--out", str(tmp / "results")],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp


def dump(tmp: Path, rank: int) -> dict:
    return json.loads((tmp / "dump" / "step0" / f"rank{rank}" / "dump.json").read_text())["data"]


def test_each_worker_gets_its_own_rank_folder_from_its_explicit_id(run):
    step0 = run / "dump" / "step0"
    assert sorted(p.name for p in step0.iterdir()) == [f"rank{i}" for i in range(WORKERS)]
    for i in range(WORKERS):
        assert len(dump(run, i)) == CELLS * (TOKEN_RANGE[1] - TOKEN_RANGE[0] + 1)


def test_only_decode_iterations_in_range_are_recorded_and_prefill_is_not(run):
    data = dump(run, 0)
    calls = {call_index(name) for name in data}
    assert calls == {0, 1, 2}  # three recorded calls per cell: tokens 1, 2, 3
    for name, entry in data.items():
        if not name.startswith("Cell.tok_emb."):
            continue
        # The embedding sees every id so far: prompt + one per earlier call. Prefill
        # (token 0) would be PROMPT_LEN long; token t is PROMPT_LEN + t.
        length = entry["input_args"][0]["shape"][1]
        assert length == PROMPT_LEN + token_of(name, TOKEN_RANGE)
        assert length != PROMPT_LEN


def test_clean_replicas_dump_identical_statistics(run):
    assert dump(run, 0) == dump(run, 2)


def test_faulty_worker_departs_at_the_faulted_token_in_the_faulted_block(run):
    clean, faulty = dump(run, 0), dump(run, 1)
    assert list(clean) == list(faulty)  # same records, same execution order
    first = next(name for name in clean if clean[name] != faulty[name])
    assert first.startswith("Cell.layers.1.attn.qkv."), first
    assert token_of(first, TOKEN_RANGE) == 2, (
        f"{first}: the weight changed before decode iteration 2, so iteration 1's record "
        "(parameters included) must still match the clean replicas")


def test_parameter_records_show_the_weight_each_token_ran_with(run):
    """The weight changed between decode iterations 1 and 2 of one request: each
    call's parameter record must show the value that call used."""
    clean, faulty = dump(run, 0), dump(run, 1)

    def weight_max(data, n):
        return data[f"Cell.layers.1.attn.qkv.Dense.forward.{n}"]["parameters"]["weight"]["Max"]
    assert weight_max(faulty, 0) == weight_max(clean, 0)  # token 1: before the fault
    for n in (1, 2):  # tokens 2 and 3: after it, +1e-3 everywhere
        assert weight_max(faulty, n) == pytest.approx(weight_max(clean, n) + 1e-3, abs=1e-6)


def test_without_agent_or_rank_id_clashing_workers_lose_no_dump(tmp_path):
    """msProbe's SGLang failure mode: every worker is rank 0 and nobody remaps. With no
    node agent and no explicit rank_id, the probe must still keep every worker's dump
    (DESIGN: nothing is ever overwritten), wherever it puts the second one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_") and k != "INFER_FAULT"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "serve.py"), "--workers", "2", "--tokens", "2",
         "--debugger", "--token-range", "1", "1", "--dump-path", str(tmp_path / "dump"),
         "--out", str(tmp_path / "results")],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dumps = sorted((tmp_path / "dump" / "step0").glob("*/dump.json"))
    entries = sum(len(json.loads(p.read_text())["data"]) for p in dumps)
    assert entries == 2 * CELLS, f"{[str(p) for p in dumps]}: {entries} entries, expected {2 * CELLS}"


@pytest.fixture()
def node_agent(tmp_path):
    """A real node agent (no coordinator: it answers registrations and keeps the rank map)."""
    sock = tmp_path / "agent.sock"
    log = open(tmp_path / "agent.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "agent", "--listen", f"ipc://{sock}", "--job", "dp-remap",
         "--spool", str(tmp_path / "spool"), "--bundle-dir", str(tmp_path / "bundles")],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        import time
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert proc.poll() is None, "the node agent exited"
            assert time.monotonic() < deadline, "the node agent did not listen within 60 s"
            time.sleep(0.05)
        yield f"ipc://{sock}", tmp_path / "bundles"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_node_agent_remaps_rank0_workers_to_distinct_dump_folders(tmp_path, node_agent):
    """Three workers, all rank 0, no rank_id, one node agent: three rankN folders (the
    assigned ids, not proc{pid} fallbacks) and a rank map naming every pid."""
    endpoint, bundles = node_agent
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_") and k != "INFER_FAULT"}
    env.update(RANKSCOPE_AGENT=endpoint, RANKSCOPE_JOB="dp-remap")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "serve.py"), "--workers", str(WORKERS), "--tokens", "2",
         "--debugger", "--token-range", "1", "1", "--dump-path", str(tmp_path / "dump"),
         "--out", str(tmp_path / "results")],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rank_map = json.loads((bundles / "dp-remap" / "rank_map.json").read_text())["entries"]
    folders = sorted(p.name for p in (tmp_path / "dump" / "step0").iterdir())
    assert folders == [f"rank{i}" for i in range(WORKERS)], (
        folders, [(r["pid"], r["assigned_rank"]) for r in rank_map], (tmp_path / "agent.log").read_text()[-3000:])
    pids = {json.loads((tmp_path / "results" / f"worker{i}.json").read_text())["pid"] for i in range(WORKERS)}
    assert {r["pid"] for r in rank_map} == pids
    assert sorted(r["assigned_rank"] for r in rank_map) == list(range(WORKERS))
    assert all(r["claimed_rank"] == 0 for r in rank_map)
