"""Rank identity: explicit > get_rank (only when initialised) > RANK_ID/RANK > proc{pid}."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from repo_paths import REPO

from rankscope.probe.identity import resolve_rank
from rankscope.wire.layout import dump_label as rank_label


def test_explicit_wins_over_everything():
    assert resolve_rank(7, env={"RANK_ID": "3"}) == (7, "explicit")
    assert resolve_rank(0, env={"RANK_ID": "3"}) == (0, "explicit")  # 0 is a rank, not "unset"


@pytest.mark.parametrize("bad", [-1, True, "3", 1.0])
def test_bad_explicit_rank_is_rejected_naming_value(bad):
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(").replace(")", r"\)")):
        resolve_rank(bad)


@pytest.mark.parametrize("env, expected", [
    ({"RANK_ID": "3"}, (3, "env")),
    ({"RANK": "5"}, (5, "env")),
    ({"RANK_ID": "2", "RANK": "9"}, (2, "env")),  # RANK_ID (msrun's) first
    ({"RANK_ID": "junk", "RANK": "4"}, (4, "env")),  # garbage is skipped, not trusted
    ({"RANK_ID": " 6 "}, (6, "env")),
    ({"RANK_ID": "-1"}, (None, "none")),
    ({"RANK_ID": ""}, (None, "none")),
    ({}, (None, "none")),
])
def test_env_fallback(env, expected):
    assert resolve_rank(None, env=env) == expected


def test_get_rank_before_init_is_not_trusted():
    # Real MindSpore, communication not initialised: get_rank() would say 0 for every
    # process; the env rank must win.
    import mindspore  # noqa: F401 - the lookup only consults MindSpore once it is imported
    from mindspore.communication._comm_helper import GlobalComm
    assert not GlobalComm.INITED
    assert resolve_rank(None, env={"RANK_ID": "3"}) == (3, "env")


def test_get_rank_used_once_initialised(monkeypatch):
    # Initialising communication needs a launched cluster; this checks the ordering
    # logic with the two MindSpore attributes it reads set as after init().
    import mindspore.communication as comm
    from mindspore.communication._comm_helper import GlobalComm
    monkeypatch.setattr(GlobalComm, "INITED", True)
    monkeypatch.setattr(comm, "get_rank", lambda *a, **k: 5)
    assert resolve_rank(None, env={"RANK_ID": "3"}) == (5, "get_rank")
    assert resolve_rank(1, env={}) == (1, "explicit")

    def broken(*a, **k):
        raise RuntimeError("backend gone")
    monkeypatch.setattr(comm, "get_rank", broken)
    assert resolve_rank(None, env={"RANK": "2"}) == (2, "env")


def test_lookup_never_imports_mindspore():
    # A process that never imported MindSpore (e.g. msrun's launcher) must not pay for it.
    code = ("import sys; from rankscope.probe.identity import resolve_rank; "
            "print(resolve_rank(None), 'mindspore' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK_ID", "RANK")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(REPO), check=True)
    assert out.stdout.strip() == "(None, 'none') False"


def test_rank_label():
    assert rank_label(3) == "rank3"
    assert rank_label(0) == "rank0"
    assert rank_label(None, 1234) == "proc1234"
    assert rank_label(None) == f"proc{os.getpid()}"


def test_dp_index_comes_from_the_first_framework_variable_set():
    from rankscope.probe.rank_env import DP_INDEX_VARS, dp_index_from_env
    assert [name for name, _ in DP_INDEX_VARS][0] == "RANKSCOPE_DP_INDEX"
    assert dp_index_from_env({}) == (None, None, [])
    assert dp_index_from_env({"VLLM_DP_RANK": "2", "VLLM_DP_RANK_LOCAL": "0"}) == (2, "VLLM_DP_RANK", [])
    assert dp_index_from_env({"SGLANG_DP_RANK": "1"}) == (1, "SGLANG_DP_RANK", [])
    assert dp_index_from_env({"RANKSCOPE_DP_INDEX": "0", "VLLM_DP_RANK": "3"}) == (0, "RANKSCOPE_DP_INDEX", [])
    index, var, problems = dp_index_from_env({"RANKSCOPE_DP_INDEX": "two", "VLLM_DP_RANK": "-1",
                                              "SGLANG_DP_RANK": "4"})
    assert (index, var) == (4, "SGLANG_DP_RANK")
    assert problems == ["RANKSCOPE_DP_INDEX='two' is not an integer >= 0",
                        "VLLM_DP_RANK='-1' is not an integer >= 0"]


def test_dp_size_comes_from_rankscope_or_vllm_and_bad_values_are_skipped():
    from rankscope.probe.rank_env import dp_size_from_env
    assert dp_size_from_env({}) is None
    assert dp_size_from_env({"VLLM_DP_SIZE": "4"}) == 4
    assert dp_size_from_env({"RANKSCOPE_DP_SIZE": "2", "VLLM_DP_SIZE": "4"}) == 2
    assert dp_size_from_env({"RANKSCOPE_DP_SIZE": "x", "VLLM_DP_SIZE": "0"}) is None


def test_configured_dp_index_wins_and_the_source_is_said(monkeypatch, capsys):
    from rankscope.probe.rank_env import resolve_dp_index
    monkeypatch.setenv("VLLM_DP_RANK", "5")
    assert resolve_dp_index(1) == (1, "cluster.dp_index")
    assert resolve_dp_index(None) == (5, "VLLM_DP_RANK")
    assert "DP index 5 from VLLM_DP_RANK" in capsys.readouterr().err
