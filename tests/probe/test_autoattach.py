"""Zero-code attach in real subprocesses started the way `rankscope launch` starts ranks
(sitecustomize on PYTHONPATH, RANKSCOPE_ATTACH=1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from repo_paths import REPO

ROOT = REPO

PLAIN = textwrap.dedent("""
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")

    class MLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(6, 5)
            self.relu = nn.ReLU()
            self.head = nn.Dense(5, 2)
        def construct(self, x):
            return self.head(self.relu(self.fc1(x)))

    def main():
        ms.set_seed(1)
        net = MLP()
        loss_fn = nn.MSELoss()
        opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
        def forward(x, y):
            return loss_fn(net(x), y)
        grad_fn = ms.value_and_grad(forward, None, opt.parameters)
        {debugger_setup}
        for step in range(3):
            {debugger_start}
            rs = np.random.RandomState(step)
            loss, grads = grad_fn(ms.Tensor(rs.randn(4, 6).astype(np.float32)),
                                  ms.Tensor(rs.randn(4, 2).astype(np.float32)))
            opt(grads)
            {debugger_end}
            print("loss", float(loss.asnumpy()))
    main()
""")

MODEL_TRAIN = textwrap.dedent("""
    import numpy as np
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    net = nn.SequentialCell([nn.Dense(6, 5), nn.ReLU(), nn.Dense(5, 2)])
    rs = np.random.RandomState(0)
    data = ds.NumpySlicesDataset({"x": rs.randn(8, 6).astype(np.float32),
                                  "y": rs.randn(8, 2).astype(np.float32)}, shuffle=False).batch(4)
    Model(net, loss_fn=nn.MSELoss(), optimizer=nn.Adam(net.trainable_params())).train(1, data)
    print("done")
""")


def run(script: str, tmp_path: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "train.py"
    path.write_text(script)
    env = dict(os.environ)
    env.pop("RANKSCOPE_AGENT", None)
    env.update({"RANKSCOPE_ATTACH": "1", "RANKSCOPE_DUMP_PATH": str(tmp_path / "dump"),
                "PYTHONPATH": os.pathsep.join([str(ROOT / "agent" / "_attach"), str(ROOT)]),
                "GLOG_v": "3"})
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, str(path)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def dumps(tmp_path: Path, sub: str = "dump") -> dict[int, dict]:
    out = {}
    for step_dir in sorted((tmp_path / sub).glob("step*")):
        (rank_dir,) = list(step_dir.iterdir())
        assert not (rank_dir / "dump_error_info.log").exists(), (rank_dir / "dump_error_info.log").read_text()
        out[int(step_dir.name[4:])] = json.loads((rank_dir / "dump.json").read_text())["data"]
    return out


def test_plain_script_is_probed_without_code_changes(tmp_path):
    script = PLAIN.format(debugger_setup="", debugger_start="pass", debugger_end="pass")
    proc = run(script, tmp_path)
    assert proc.stdout.count("loss") == 3
    got = dumps(tmp_path)
    assert sorted(got) == [0, 1, 2]  # one step per optimizer call
    for data in got.values():
        assert {"Cell.fc1.Dense.forward.0", "Cell.head.Dense.backward.0"} <= set(data)
        # The default watch leaves weights and their gradients to the sentinels' rows.
        assert not any(".parameters_grad." in k for k in data)
        assert "parameters" not in data["Cell.fc1.Dense.forward.0"]
        assert not any(k.endswith("forward.1") for k in data)


def test_the_full_watch_keeps_msprobes_whole_l0_dump(tmp_path):
    config = tmp_path / "full.json"
    config.write_text(json.dumps({"task": "statistics", "level": "L0", "cluster": {"watch": "full"}}))
    script = PLAIN.format(debugger_setup="", debugger_start="pass", debugger_end="pass")
    proc = run(script, tmp_path, {"RANKSCOPE_CONFIG": str(config)})
    assert "full watch: every parameter" in proc.stderr
    for data in dumps(tmp_path).values():
        assert "Cell.fc1.Dense.parameters_grad.0" in data
        assert "weight" in data["Cell.fc1.Dense.forward.0"]["parameters"]


def test_explicit_debugger_under_launch_is_not_hooked_twice(tmp_path):
    script = PLAIN.format(
        debugger_setup="from agent import PrecisionDebugger\n    dbg = PrecisionDebugger(level='L0')",
        debugger_start="dbg.start(net)", debugger_end="dbg.stop(); dbg.step()")
    run(script, tmp_path)
    # No dump_path given: under launch the debugger dumps where launch says, not in
    # msProbe's ./dump_path (the session stood down: one set of hooks, checked below).
    assert not (tmp_path / "dump_path").exists()
    got = dumps(tmp_path, "dump")
    assert sorted(got) == [0, 1, 2]
    for data in got.values():
        assert "Cell.fc1.Dense.forward.0" in data
        assert "Cell.fc1.Dense.forward.1" not in data  # no second set of hooks
        assert "Cell.fc1.Dense.parameters_grad.1" not in data


def test_model_train_is_probed_through_the_callback(tmp_path):
    run(MODEL_TRAIN, tmp_path)
    got = dumps(tmp_path)
    assert sorted(got) == [0, 1]
    assert "Cell.0.Dense.forward.0" in got[1] and "Cell.2.Dense.backward.0" in got[1]


def test_processes_without_mindspore_pay_nothing(tmp_path):
    env = dict(os.environ, RANKSCOPE_ATTACH="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "agent" / "_attach"), str(ROOT)]))
    code = ("import sys; import rankscope.probe.attach.autoattach as a; "
            "print('mindspore' in sys.modules, 'rankscope.probe.debugger' in sys.modules, a._finder is not None)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False", "True"], out.stderr


def test_rankscope_config_is_honoured(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L0", "step": [1],
                               "statistics": {"data_mode": ["forward"]}}))
    script = PLAIN.format(debugger_setup="", debugger_start="pass", debugger_end="pass")
    run(script, tmp_path, {"RANKSCOPE_CONFIG": str(cfg)})
    got = dumps(tmp_path)
    assert sorted(got) == [1]
    assert got[1] and all(".forward." in k for k in got[1])


def test_import_agent_stays_light():
    code = ("import sys, agent, rankscope.wire.protocol, rankscope.wire.records; "
            "print(sorted(m for m in ('mindspore', 'rankscope.probe.debugger', 'rankscope.probe.hooks.cell', 'ray') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "RANKSCOPE_ATTACH"})
    assert out.stdout.strip() == "[]", out.stderr


TRAIN_CELL = textwrap.dedent("""
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    net = nn.SequentialCell([nn.Dense(6, 5), nn.ReLU(), nn.Dense(5, 2)])
    train_net = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params()))
    rs = np.random.RandomState(0)
    for step in range(3):
        loss = train_net(ms.Tensor(rs.randn(4, 6).astype(np.float32)), ms.Tensor(rs.randn(4, 2).astype(np.float32)))
        print("loss", float(loss.asnumpy()))
""")


def test_train_one_step_cell_loop_is_probed(tmp_path):
    run(TRAIN_CELL, tmp_path)
    got = dumps(tmp_path)
    assert sorted(got) == [0, 1, 2]  # one step per TrainOneStepCell call
    assert "Cell.0.Dense.forward.0" in got[2] and "Cell.2.Dense.backward.0" in got[2]
    assert "Cell.0.Dense.forward.1" not in got[2]


def test_a_shape_check_forward_before_the_optimizer_is_not_left_as_serving(tmp_path):
    # A stranger's script calls net(x) once before building the optimizer: the serving
    # finder takes it for a server, then must say plainly that it trains after all,
    # and the warm-up call must not land in step 0's record.
    warmup = "net(ms.Tensor(np.zeros((2, 6), np.float32)))\n    loss_fn = nn.MSELoss()"
    script = PLAIN.format(debugger_setup="", debugger_start="pass", debugger_end="pass")
    script = script.replace("loss_fn = nn.MSELoss()", warmup, 1)
    proc = run(script, tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[rankscope]")]
    assert sum("serving model MLP found" in ln for ln in lines) == 1, lines
    assert sum(ln.endswith("left out of the training steps") and "MLP is trained after all" in ln
               for ln in lines) == 1, lines
    got = dumps(tmp_path)
    assert sorted(got) == [0, 1, 2]
    for data in got.values():
        assert "Cell.fc1.Dense.forward.0" in data and "Cell.fc1.Dense.backward.0" in data
        assert not any(k.endswith("forward.1") for k in data)
