"""``rankscope bench ingest`` end to end at a small size: separate sender processes, real
sockets, a real coordinator actor; the injected divergence is found on the right rank
and step, and the last line is the JSON summary. No speed assertions here
(the figures are printed by the bench itself)."""
from __future__ import annotations

import json

import pytest

from rankscope.coordinator.cli import bench as bench_cli

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def local_ray(folder_ray):
    """The folder's shared private Ray (conftest.py)."""


@pytest.mark.parametrize("shards", [1, 2])
def test_bench_ingest_flags_the_injected_rank_and_prints_json_last(capsys, tmp_path, shards):
    rc = bench_cli.main(["ingest", "--ranks", "6", "--tensors", "10", "--steps", "4", "--nodes", "2",
                         "--fault-rank", "5", "--export-dir", str(tmp_path), "--shards", str(shards),
                         "--paced-steps", "2", "--ranks-per-node", "2"])
    lines = capsys.readouterr().out.strip().splitlines()
    out = json.loads(lines[-1])
    assert rc == 0 and out["correct"] is True
    assert (out["flagged_rank"], out["flagged_step"], out["detector"]) == (5, 5, "nan_origin")
    assert out["records"] == 6 * 10 * 6 and out["records_per_s"] > 0 and out["detect_latency_ms"] >= 0
    assert out["rejected"] == {} and out["duplicates"] == 0
    assert out["records_lost"] == 0 and out["records_ingested"] == out["records"]
    assert [s["shard"] for s in out["per_shard"]] == list(range(shards))
    assert sum(s["records"] for s in out["per_shard"]) == 6 * 10 * 6
    if shards > 1:
        # 3 ranks per sender process, node agents of 2: 2 agents each, 4 in all; each agent
        # sends a shard one packed frame per step (6 steps), whatever its share of records.
        assert [s["frames_in"] for s in out["per_shard"]] == [4 * 6] * shards
        assert all(s["rejected"] == {} and s["records_per_cpu_s"] > 0 for s in out["per_shard"])
    assert len(out["judge_latency_ms"]) == 2 and out["judge_latency_ms_p99"] >= out["judge_latency_ms_median"] > 0
    assert list((tmp_path / "incidents").glob("*/incident.json"))


def test_bench_refuses_a_fault_rank_outside_the_job(capsys):
    with pytest.raises(SystemExit):
        bench_cli.main(["ingest", "--ranks", "4", "--fault-rank", "4"])
    assert "--fault-rank 4 is not in [0, 4)" in capsys.readouterr().err
