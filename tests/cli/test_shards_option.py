"""``--shards K`` on the commands that start a coordinator: checked, and which count wins
(the flag, then the config file's cluster.shards, then RANKSCOPE_SHARDS)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rankscope.coordinator.cli import coordinator as coordinator_cli
from rankscope.coordinator.cli.launch import build_parser, check_args
from rankscope.coordinator.launch.preflight import UsageError
from rankscope.coordinator.server.actor import shards_from_env
from rankscope.wire.shards import SHARDS_ENV


def _launch_args(tmp_path, *extra):
    return build_parser().parse_args(["--export-dir", str(tmp_path / "out"), *extra, "--", sys.executable, "-V"])


@pytest.mark.parametrize("flag, file, env, want", [
    (3, 2, "4", 3),       # the flag over everything
    (None, 2, "4", 2),    # the config file over the environment
    (None, None, "4", 4),  # the environment when neither says
    (None, None, None, None),  # nothing: the coordinator's default (1)
])
def test_the_flag_then_the_config_then_the_environment(tmp_path, monkeypatch, flag, file, env, want):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"cluster": {} if file is None else {"shards": file}}))
    if env is None:
        monkeypatch.delenv(SHARDS_ENV, raising=False)
    else:
        monkeypatch.setenv(SHARDS_ENV, env)
    extra = ["--config", str(cfg)] + ([] if flag is None else ["--shards", str(flag)])
    job = check_args(_launch_args(tmp_path, *extra))
    assert shards_from_env(job["cluster"]).get("shards") == want
    coord = coordinator_cli.build_parser().parse_args(extra)
    cluster = coordinator_cli.apply_shards(coordinator_cli.job_settings(coord.config, None), coord.shards)["cluster"]
    assert shards_from_env(cluster).get("shards") == want


@pytest.mark.parametrize("verb", ["launch", "coordinator"])
@pytest.mark.parametrize("bad", ["0", "9", "two"])
def test_a_bad_count_is_a_usage_error_naming_the_option(verb, bad):
    out = subprocess.run([sys.executable, "-m", "rankscope", verb, "--shards", bad, "--", "true"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--shards" in out.stderr and "1 to 8" in out.stderr, out.stderr


def test_launch_with_agent_refuses_shards(tmp_path):
    with pytest.raises(UsageError, match="--shards goes with the coordinator"):
        check_args(_launch_args(tmp_path, "--agent", "ipc:///run/x.sock", "--job", "j", "--shards", "2"))
    out = subprocess.run([sys.executable, "-m", "rankscope", "launch", "--agent", "ipc:///run/x.sock", "--job", "j",
                          "--shards", "2", "--", "true"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "rankscope coordinator --shards K" in out.stderr, out.stderr


def test_status_counts_the_records_the_shards_took():
    from rankscope.coordinator.cli.control import format_status
    st = {"endpoint": "tcp://x:1", "metrics": {"records_ingested": 0}, "ranks": {}}
    assert "records 0 " in format_status(st)
    assert "records 4096 " in format_status({**st, "shards": [{}, {}], "records": 4096})
