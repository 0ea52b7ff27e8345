"""A NaN made inside the forward and swallowed before the loss (ReLU) leaves the loss and
the gradients finite: the step is still re-run, and the re-run tells a NaN made once from
one made every time by watching the Cell it came from. Real MindSpore, one process."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rankscope.probe.rerun import forward_check

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from rankscope import PrecisionDebugger  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
AT = 6


@pytest.fixture(autouse=True)
def _cleanup():
    yield
    if PrecisionDebugger.current is not None:
        PrecisionDebugger.current.close()


class Glitch(nn.Cell):
    """Identity, except at step AT: a NaN (or -inf) in one hidden unit, on the first call
    of the step or on every call."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.step, self.calls = how, -1, 0

    def construct(self, x):
        if self.step == AT and self.how:
            self.calls += 1
            if self.how != "once" or self.calls == 1:
                bad = np.zeros(x.shape, np.float32)
                bad[0, 0] = -np.inf if self.how == "inf" else np.nan
                x = x + ms.Tensor(bad)
        return x


def train(tmp_path, how: str) -> list[dict]:
    cfg = tmp_path / f"cfg-{how}.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / f"dump-{how}")}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    ms.set_seed(3)
    glitch = Glitch(how)
    net = nn.SequentialCell([nn.Dense(6, 12), glitch, nn.ReLU(), nn.Dense(12, 2)])
    opt = nn.SGD(net.trainable_params(), 0.01)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    for step in range(AT + 3):
        glitch.step = step
        dbg.start(net)
        rs = np.random.RandomState(step)
        loss, grads = grad_fn(ms.Tensor(rs.randn(4, 6).astype(np.float32)),
                              ms.Tensor(rs.randn(4, 2).astype(np.float32)))
        assert np.isfinite(loss.asnumpy()).all()  # swallowed: the loss never shows it
        opt(grads)
        dbg.stop()
        dbg.step()
    outcomes = list(dbg.sentinels.rerun.outcomes)
    dbg.close()
    return outcomes


def test_a_forward_nan_made_once_is_re_run_and_transient(tmp_path):
    [o] = train(tmp_path, "once")
    assert (o["step"], o["outcome"]) == (AT, "transient")
    assert o["trigger"] == "a NaN in its forward (Cell.1.Glitch.forward.0.output.0)"


def test_a_forward_nan_made_every_time_reproduces(tmp_path):
    [o] = train(tmp_path, "always")
    assert (o["step"], o["outcome"]) == (AT, "reproduced")


def test_an_inf_in_the_forward_is_no_trigger(tmp_path):
    # Attention masks carry -inf on every step: that alone re-runs nothing.
    assert train(tmp_path, "inf") == []


def test_a_record_name_leads_back_to_its_cell():
    assert forward_check.cell_path("Cell.left.0.Dense.forward.3.output.0") == "left.0"
    assert forward_check.cell_path("Sentinel.loss") is None
    net = nn.SequentialCell([nn.Dense(2, 2), nn.ReLU()])
    assert forward_check.find_cell(net, "1") is net[1]
    assert forward_check.find_cell(net, "7") is None
    t = forward_check.tap(None, [net], "Cell.1.ReLU.forward.0.output.0")
    assert t.placed
    net(ms.Tensor(np.array([[np.nan, 1.0]], np.float32)))
    assert t.close() is True and not t.placed
    assert not forward_check.tap(None, [net], "Cell.9.ReLU.forward.0.output.0").placed
