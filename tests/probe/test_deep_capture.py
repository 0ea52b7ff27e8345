"""Where the default watch took the per-Cell hooks off, an anomalous step is re-run with
them on and recorded: the step's records name the Cell, before the step's loss, as a full
watch would have recorded them; the hooks are off again for the next step."""
from __future__ import annotations

import json

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from rankscope import PrecisionDebugger  # noqa: E402
from rankscope.probe.vitals.cell_plan import DROPPED  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
AT = 6


@pytest.fixture(autouse=True)
def _cleanup():
    yield
    if PrecisionDebugger.current is not None:
        PrecisionDebugger.current.close()


def names_of(dbg, step: int) -> list[str]:
    b = dbg.flight_recorder.batches()[step]
    return [dbg.recorder.names.name(int(i)) for i in b.name_ids]


def nan_rows(dbg, step: int) -> list[str]:
    b = dbg.flight_recorder.batches()[step]
    return [dbg.recorder.names.name(int(i)) for i, n in zip(b.name_ids, b.nan_count) if n]


def test_an_anomalous_step_is_re_run_with_the_cell_hooks_and_recorded(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / "dump"),
                               "cluster": {"flight_recorder_steps": 16}}))
    dbg = PrecisionDebugger(config_path=str(cfg), _auto=True)  # as the zero-code probe makes it
    ms.set_seed(2)
    net = nn.SequentialCell([nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 2)])
    opt = nn.Adam(net.trainable_params(), 1e-3)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    dbg.start(net)
    for step in range(AT + 2):
        if step == 2:  # what the cell plan settles on where the hooks cost too much
            dbg.tier.cells.state = DROPPED
            dbg.cells.suspend()
        rs = np.random.RandomState(step)
        x = rs.randn(4, 6).astype(np.float32)
        if step == AT:
            x[1, 2] = np.nan  # a NaN in this step's batch: the step is anomalous
        _, grads = grad_fn(ms.Tensor(x), ms.Tensor(rs.randn(4, 2).astype(np.float32)))
        opt(grads)
        dbg.step()
    assert any(n.startswith("Cell.0.Dense.forward") for n in names_of(dbg, 1))  # hooks on
    assert not any(n.startswith("Cell.") for n in names_of(dbg, AT - 1))  # hooks off
    names = names_of(dbg, AT)
    cells = [n for n in names if n.startswith("Cell.")]
    assert "Cell.0.Dense.forward.0.input.0" in cells and any(".backward." in n for n in cells)
    # recorded where they ran as the step's own forward and backward: before its loss
    assert names.index("Cell.0.Dense.forward.0.input.0") < names.index("Sentinel.loss")
    # the first non-finite record of the step, in the order things ran: the NaN's origin
    assert nan_rows(dbg, AT)[0] == "Cell.0.Dense.forward.0.input.0"
    assert dbg.sentinels.rerun.outcomes[-1]["outcome"] == "reproduced"
    assert dbg.cells.suspended and not any(n.startswith("Cell.") for n in names_of(dbg, AT + 1))
