"""msrun returns before its workers end unless joined: launch runs an msrun line joined."""
from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.coordinator.launch.msrun_args import JOIN_NOTE, joined, log_dir


@pytest.mark.parametrize("cmd, want", [
    # msrun's default is --join=False: nothing said is not joined
    (["msrun", "--worker_num=4", "--local_worker_num", "4", "train.py", "--join=False"],
     ["msrun", "--worker_num=4", "--local_worker_num", "4", "--join=True", "train.py", "--join=False"]),
    (["msrun", "--join=False", "--worker_num=4", "train.py"], ["msrun", "--worker_num=4", "--join=True", "train.py"]),
    (["msrun", "--join", "False", "--log_dir", "/l", "t.py", "-x"], ["msrun", "--log_dir", "/l", "--join=True", "t.py", "-x"]),
    (["/opt/bin/python3.11", "-m", "mindspore.parallel.cluster.run", "--worker_num=2", "t.py"],
     ["/opt/bin/python3.11", "-m", "mindspore.parallel.cluster.run", "--worker_num=2", "--join=True", "t.py"]),
])
def test_an_unjoined_msrun_line_is_joined_and_said(cmd, want):
    assert joined(cmd) == (want, JOIN_NOTE)


@pytest.mark.parametrize("cmd", [
    ["msrun", "--worker_num=4", "--join=True", "train.py", "--lr", "1"],  # joined already: untouched
    ["/x/bin/msrun", "--join", "True", "t.py"],
    ["python", "train.py", "--join=False"],  # not msrun: a script's own flag
    ["bash", "run_msrun.sh"],
    ["msrun", "--help"],
    ["msrun"],
])
def test_anything_else_is_left_as_typed(cmd):
    assert joined(cmd) == (cmd, None)


@pytest.mark.parametrize("cmd, want", [
    (["msrun", "--worker_num=4", "--log_dir=logs/run1", "t.py"], "/w/logs/run1"),
    (["msrun", "--log_dir", "/abs/l", "--join=True", "t.py", "--log_dir=not-msruns"], "/abs/l"),
    (["msrun", "--worker_num=4", "t.py"], "/w"),  # msrun's default: the directory it runs in
    (["python", "t.py", "--log_dir=x"], None),
])
def test_msruns_worker_logs_are_where_its_log_dir_says(cmd, want):
    got = log_dir(cmd, Path("/w"))
    assert (str(got) if got else None) == want
