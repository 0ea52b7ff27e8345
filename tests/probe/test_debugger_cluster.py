"""The probe streaming through a real node agent (subprocess) to a fake coordinator on a
real socket: sentinel records per step, the rank id, and pause/resume at step boundaries."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from repo_paths import REPO

from tests.node_harness import FakeCoordinator, free_port, start_agent, stop

ROOT = REPO

RANK = textwrap.dedent("""
    import time
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(4, 3), nn.ReLU(), nn.Dense(3, 1)])
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    x = ms.Tensor(np.ones((2, 4), np.float32)); y = ms.Tensor(np.zeros((2, 1), np.float32))
    for step in range(STEPS):
        loss, grads = grad_fn(x, y)
        opt(grads)
        time.sleep(0.05)
    print("finished", flush=True)
""")


@pytest.fixture()
def cluster(tmp_path):
    coord = FakeCoordinator(f"tcp://127.0.0.1:{free_port()}")
    agent, listen = start_agent(tmp_path, coord.bound)
    yield coord, listen
    stop(agent)
    coord.close()


def start_rank(tmp_path: Path, listen: str, steps: int) -> subprocess.Popen:
    script = tmp_path / "rank.py"
    script.write_text(RANK.replace("STEPS", str(steps)))
    env = dict(os.environ, RANKSCOPE_ATTACH="1", RANKSCOPE_AGENT=listen, RANKSCOPE_JOB="j", RANK_ID="3",
               RANKSCOPE_DUMP_PATH=str(tmp_path / "dump"), GLOG_v="3",
               PYTHONPATH=os.pathsep.join([str(ROOT / "agent" / "_attach"), str(ROOT)]))
    return subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def steps_seen(coord: FakeCoordinator) -> list[int]:
    coord.pump(0.05)
    return sorted(m.body["step"] for m in coord.of_type("step"))


def test_sentinels_stream_and_pause_resume_at_step_boundaries(tmp_path, cluster):
    coord, listen = cluster
    proc = start_rank(tmp_path, listen, steps=60)
    try:
        coord.wait_for(lambda m: m.type == "step" and m.body["step"] >= 2, timeout=120)
        first = next(m for m in coord.of_type("step"))
        assert first.body["rank"] == 3
        names = set()
        for m in coord.of_type("step"):
            names.update(m.body["new_names"].values())
        assert {"Sentinel.loss", "Sentinel.param.0.weight", "Sentinel.grad_local.0.weight"} <= names
        assert "Cell.0.Dense.forward.0.output.0" in names  # L0 of the model found by autoattach
        assert coord.control("pause", job="j") >= 1
        # paused: the step count settles while the process is still alive
        settled, last = None, -1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(1.0)
            now = steps_seen(coord)[-1]
            if now == last:
                settled = now
                break
            last = now
        assert settled is not None and settled < 59, "the rank did not pause"
        assert proc.poll() is None
        coord.control("resume", job="j")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        assert "finished" in out
        coord.wait_for(lambda m: m.type == "step" and m.body["step"] == 59, timeout=30)
        assert steps_seen(coord)[:60] == list(range(60))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_terminated_rank_ends_with_one_line_that_names_it(tmp_path, cluster):
    coord, listen = cluster
    proc = start_rank(tmp_path, listen, steps=400)
    try:
        coord.wait_for(lambda m: m.type == "step" and m.body["step"] >= 2, timeout=120)
        assert coord.control("terminate", job="j", incident="inc-9") >= 1
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1 and "finished" not in out
    assert err.strip().splitlines()[-1] == "[rankscope] rankscope terminated rank 3 on incident inc-9", err[-2000:]
    assert "Traceback" not in err, err[-2000:]


def test_a_rank_that_dies_between_steps_leaves_the_step_it_began_for_its_agent(tmp_path, cluster):
    """os._exit right after a step: that step's records may die queued in the rank, but the
    position it wrote at the step boundary reaches the coordinator with its death."""
    coord, listen = cluster
    script = tmp_path / "rank.py"
    rank = RANK.replace("STEPS", "50").replace(
        "for step in range(50):\n", "for step in range(50):\n    if step == 4:\n        import os; os._exit(137)\n")
    assert "_exit" in rank
    script.write_text(rank)
    env = dict(os.environ, RANKSCOPE_ATTACH="1", RANKSCOPE_AGENT=listen, RANKSCOPE_JOB="j", RANK_ID="3",
               RANKSCOPE_DUMP_PATH=str(tmp_path / "dump"), GLOG_v="3",
               PYTHONPATH=os.pathsep.join([str(ROOT / "agent" / "_attach"), str(ROOT)]))
    proc = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 137, proc.stderr[-2000:]
    [lost] = coord.wait_for(lambda m: m.type == "rank_lost", timeout=30)
    assert lost.body["position"] == {"step": 4, "token": None}
