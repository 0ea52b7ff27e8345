"""A healthy job must run under the watch exactly as without it: ``@ms.jit`` helpers of the
user's inside an eager forward (a hooked activation handed to them must not carry a hook
of ours into their graph), and float16 with a dynamic loss scale, eager, jit and GRAPH.
Real MindSpore in a subprocess started the way ``rankscope launch`` starts ranks."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from attached import run_script

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import mindspore as ms
    from mindspore import amp, mint, nn, ops
    STYLE = sys.argv[1]
    ms.set_context(mode=ms.GRAPH_MODE if STYLE == "graph_scale" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.set_seed(4)


    @ms.jit
    def swiglu(gate, up):
        return mint.nn.functional.silu(gate) * up


    @ms.jit
    def mse(pred, target):
        return mint.mean((pred - target) ** 2)


    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.gate, self.up = mint.nn.Linear(6, 12), mint.nn.Linear(6, 12)
            self.down = mint.nn.Linear(12, 2)

        def construct(self, x):
            return self.down(swiglu(self.gate(x), self.up(x)))


    class Fp16(nn.Cell):
        def __init__(self):
            super().__init__()
            self.body = nn.SequentialCell(nn.Dense(6, 16), nn.ReLU(), nn.Dense(16, 2))

        def construct(self, x):
            return self.body(x)


    scaled = STYLE != "jit_helpers"
    net = Fp16() if scaled else Net()
    if scaled:
        net.to_float(ms.float16)
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-2)
    scaler = amp.DynamicLossScaler(2 ** 17, 2, 50) if scaled else None


    def forward(x, y):
        loss = mse(net(x).astype(ms.float32), y)
        return (scaler.scale(loss), loss) if scaled else (loss, loss)


    grad_fn = ms.value_and_grad(forward, None, opt.parameters, has_aux=True)


    def update(x, y):
        (_, loss), grads = grad_fn(x, y)
        if not scaled:
            opt(grads)
            return loss, True
        grads = scaler.unscale(grads)
        finite = amp.all_finite(grads)
        if finite:
            opt(grads)
        return loss, finite


    def train_step(x, y):
        loss, finite = update(x, y)
        if scaled:
            scaler.adjust(finite)
        return loss, finite


    if STYLE in ("jit_scale", "graph_scale"):
        train_step = ms.jit(train_step)
    if STYLE == "jit_update":  # the scaler adjusted outside the jit function
        update = ms.jit(update)

    losses, finite = [], []
    for i in range(8):
        rs = np.random.RandomState(i)
        x, y = ms.Tensor(rs.randn(4, 6).astype(np.float32)), ms.Tensor(rs.randn(4, 2).astype(np.float32) * 3)
        loss, ok = train_step(x, y)
        losses.append(float(loss.asnumpy()))
        finite.append(bool(ok))
    print("RESULT", json.dumps({"losses": losses, "finite": finite}))
    if sys.argv[2] == "1":  # what the watch recorded: steps ended, the loss scale of each
        from rankscope.probe.attach import autoattach
        dbg = autoattach.session().debugger
        dbg.graph._settle()  # a compiled step's end is settled at the next step, or at exit
        scales = []
        for b in dbg.flight_recorder.batches():
            names = [dbg.recorder.names.name(int(k)) for k in b.name_ids]
            scales.append([float(b.stats[i][0]) for i, n in enumerate(names) if n == "Sentinel.loss_scale"])
        print("SEEN", json.dumps({"steps": dbg.current_step, "scales": scales}))
""")


def run(tmp_path: Path, style: str, attach: bool) -> tuple[dict, dict | None, str]:
    proc = run_script(tmp_path, SCRIPT, [style, "1" if attach else "0"], attach)
    out = {ln.split(" ", 1)[0]: json.loads(ln.split(" ", 1)[1]) for ln in proc.stdout.splitlines()
           if ln.startswith(("RESULT ", "SEEN "))}
    return out["RESULT"], out.get("SEEN"), proc.stderr


def test_jit_helpers_called_from_an_eager_forward_run_as_unwatched(tmp_path):
    plain, _, _ = run(tmp_path, "jit_helpers", attach=False)
    watched, seen, stderr = run(tmp_path, "jit_helpers", attach=True)
    assert watched == plain
    assert "Unsupported statement" not in stderr
    assert seen["steps"] == 8
    lines = [ln for ln in stderr.splitlines() if ln.startswith("[rankscope] ")]
    assert any("PyNative+jit mode, watched through hooks" in ln for ln in lines), lines
    assert not any("optimizer runs inside an @ms.jit" in ln for ln in lines), lines


@pytest.mark.parametrize("style", ["loss_scale", "jit_scale", "graph_scale", "jit_update"])
def test_a_float16_job_under_a_dynamic_loss_scale_runs_as_unwatched_one_step_per_iteration(tmp_path, style):
    plain, _, _ = run(tmp_path, style, attach=False)
    watched, seen, stderr = run(tmp_path, style, attach=True)
    assert watched == plain
    assert not all(plain["finite"]) and any(plain["finite"])  # overflow steps, and updates
    assert "Unsupported statement" not in stderr
    # A step whose update was skipped calls no optimizer: it is a step all the same.
    assert seen["steps"] == 8
    # The scale each step multiplied its loss by: halved after each overflow.
    want, scale = [], 2.0 ** 17
    for ok in plain["finite"]:
        want.append([scale])
        scale = scale if ok else scale / 2
    assert seen["scales"] == want
