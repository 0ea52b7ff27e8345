"""Ingest shards on two real Ray nodes (a head and a worker node started on this machine)
name the diverging rank: two_ray_nodes_run.py does it, in a process of its own (see its
docstring for why), and this test reads its result."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.repo_paths import REPO

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]


def test_two_shards_on_two_ray_nodes_name_the_diverging_rank():
    # Nothing of this process's own Ray: a private Ray started earlier in it left
    # RAY_AUTH_MODE=token in its environment, and a child that inherits it cannot run
    # actors on the auth-less cluster (Ray cancels them before they start).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_AUTH_MODE"] = "disabled"
    proc = subprocess.run([sys.executable, "-m", "tests.coordinator.server.two_ray_nodes_run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("VERDICT")), None)
    assert line is not None, out[-6000:]
    assert line.startswith("VERDICT rank 1 step 4 nan_origin;"), line
    print(line)
