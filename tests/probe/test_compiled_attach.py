"""Zero-code attach on compiled code: GRAPH-mode training steps in the styles people
write them (a jit step function among them), and @ms.jit inside PyNative. Real MindSpore in a subprocess started the way
``rankscope launch`` starts ranks. The job must run exactly as it does unprobed (same
losses, a user's own hook kept), and the rank must say how it is watched."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from attached import run_script
from repo_paths import REPO

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops
    STYLE = sys.argv[1]
    ms.set_context(mode=ms.PYNATIVE_MODE if STYLE in ("pijit", "jit_fn", "jit_cell") else ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(3)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(6, 8, activation="relu")
            self.b = nn.Dense(8, 1)
        def construct(self, x):
            return self.b(self.a(x))

    class JitNet(Net):
        @ms.jit
        def construct(self, x):
            return self.b(self.a(x))

    net = JitNet() if STYLE == "jit_cell" else Net()
    seen = []
    def user_hook(cell, inputs, output):
        return output * 1.0
    net.a.register_forward_hook(user_hook)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    opt = (nn.Adam(net.trainable_params(), learning_rate=0.01) if STYLE == "pijit"
           else nn.SGD(net.trainable_params(), learning_rate=0.05))

    class GradOpStep(nn.Cell):
        def __init__(self):
            super().__init__()
            self.loss_net, self.opt = loss_net, opt
            self.grad = ops.GradOperation(get_by_list=True)
        def construct(self, x, y):
            loss = self.loss_net(x, y)
            self.opt(self.grad(self.loss_net, self.opt.parameters)(x, y))
            return loss

    class FunctionalStep(nn.Cell):
        def __init__(self):
            super().__init__()
            self.loss_net, self.opt = loss_net, opt
        def construct(self, x, y):
            loss, grads = ms.value_and_grad(self.loss_net, None, self.opt.parameters)(x, y)
            self.opt(grads)
            return loss

    grad_fn = ms.value_and_grad(loss_net, None, opt.parameters)

    @ms.jit
    def jit_step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    def pijit_step(x, y):  # bytecode capture: PIJit compiles what it can of the frame
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss
    pijit_step = ms.jit(pijit_step, capture_mode="bytecode")

    step = {"gradop": GradOpStep, "functional": FunctionalStep,
            "cell": lambda: nn.TrainOneStepCell(loss_net, opt)}.get(STYLE)
    step = step() if step else None
    losses = []
    for i in range(5 if STYLE == "pijit" else 3):
        rs = np.random.RandomState(i)
        x, y = ms.Tensor(rs.randn(4, 6).astype(np.float32)), ms.Tensor(rs.randn(4, 1).astype(np.float32))
        if step is not None:
            loss = step(x, y)
        elif STYLE == "pijit":
            loss = pijit_step(x, y)
        elif STYLE in ("jit_fn", "graph_jit_fn"):
            loss = jit_step(x, y)
        else:  # jit_cell: compiled forward, eager backward and optimizer
            loss, grads = grad_fn(x, y)
            opt(grads)
        losses.append(float(loss.asnumpy()))
    print("RESULT", json.dumps({"losses": losses, "user_hook_kept": sum(h is user_hook for h in net.a._forward_hook.values())}))
""")


def run(tmp_path: Path, style: str, attach: bool) -> tuple[dict, str]:
    proc = run_script(tmp_path, SCRIPT, [style], attach)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[7:]), proc.stderr


@pytest.mark.parametrize("style, says", [
    ("gradop", "GRAPH mode, watched through"),
    ("functional", "GRAPH mode, watched through"),
    ("cell", "GRAPH mode, watched through"),
    ("jit_fn", "PyNative+jit mode, watched through the kernel dump"),
    # GRAPH mode set, the step still a jit function: compiled the same way, and a step.
    ("graph_jit_fn", "GRAPH mode, watched through the kernel dump"),
    ("jit_cell", "PyNative+jit mode, watched through hooks"),
    # PIJit: rankscope stays out of the captured frames (bit-identical losses), the step
    # is watched from outside the call and the line says what that leaves unseen.
    ("pijit", "PyNative+jit mode, watched through step sentinels only (parameters, loss) (nothing inside"),
])
def test_compiled_code_runs_as_unprobed_and_says_how_it_is_watched(tmp_path, style, says):
    plain, _ = run(tmp_path, style, attach=False)
    probed, stderr = run(tmp_path, style, attach=True)
    assert probed == plain  # same losses, the user's hook still in place
    lines = [ln for ln in stderr.splitlines() if ln.startswith("[rankscope] ")]
    assert len([ln for ln in lines if "watched" in ln]) == 1, lines
    assert any(says in ln for ln in lines), lines
    assert "Unsupported statement" not in stderr


OWN_DEBUGGER = textwrap.dedent("""
    import sys
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    from rankscope import PrecisionDebugger
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    dbg = PrecisionDebugger(dump_path=sys.argv[2], level="L0", task=sys.argv[1])
    net = nn.Dense(6, 1)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
    for i in range(2):
        dbg.start(net)
        step(ms.Tensor(np.ones((4, 6), np.float32)), ms.Tensor(np.zeros((4, 1), np.float32)))
        dbg.stop()
        dbg.step()
""")


@pytest.mark.parametrize("task, holds", [("statistics", "holds no files"), ("tensor", "kernels' tensor files")])
def test_a_scripts_own_l0_debugger_on_a_compiled_step_is_told_what_its_dump_holds(tmp_path, task, holds):
    path = tmp_path / "train.py"
    path.write_text(OWN_DEBUGGER)
    env = dict(os.environ, PYTHONPATH=str(REPO), GLOG_v="3")
    env.pop("RANKSCOPE_AGENT", None)
    proc = subprocess.run([sys.executable, str(path), task, str(tmp_path / "dump")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [ln for ln in proc.stderr.splitlines() if "this step runs compiled" in ln]
    assert len(said) == 1 and "level L0 dumps Cells" in said[0] and holds in said[0], proc.stderr[-2000:]


FAILS_WHILE_PAUSED = textwrap.dedent("""
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    from rankscope.probe.debugger import PrecisionDebugger
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    net = nn.Dense(6, 1)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, nn.MSELoss()), None, opt.parameters)

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    for i in range(3):
        step(ms.Tensor(np.ones((4, 6), np.float32)), ms.Tensor(np.zeros((4, 1), np.float32)))
    # The coordinator pauses the job (every boundary from now on holds), then this rank
    # fails before its next step, as one whose collective timed out does.
    PrecisionDebugger.current.gate.pause("incident-1")
    raise RuntimeError("collective timed out")
""")


def test_a_paused_compiled_rank_that_fails_exits_as_it_would_unprobed(tmp_path):
    # Its last step ends in an exit handler; held there by the pause, the process would
    # never exit and its launcher would never take the job down.
    path = tmp_path / "train.py"
    path.write_text(FAILS_WHILE_PAUSED)
    env = dict(os.environ)
    env.pop("RANKSCOPE_AGENT", None)
    env.update({"RANKSCOPE_ATTACH": "1", "RANKSCOPE_DUMP_PATH": str(tmp_path / "dump"),
                "PYTHONPATH": os.pathsep.join([str(REPO / "agent" / "_attach"), str(REPO)]), "GLOG_v": "3"})
    proc = subprocess.run([sys.executable, str(path)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "RuntimeError: collective timed out" in proc.stderr, proc.stderr[-3000:]
    assert "GRAPH mode, watched through the kernel dump" in proc.stderr, proc.stderr[-3000:]
