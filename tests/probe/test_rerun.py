"""Re-running an anomalous step in the rank, with real MindSpore: a fault corrupted once is
told from one that reproduces, the re-run leaves nothing behind (records, RNG, BatchNorm's
moving statistics), and under ``on_transient: skip`` the step goes on with the re-run's
result, so the weights come out bit for bit as in a run that never saw the corruption."""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from rankscope import PrecisionDebugger  # noqa: E402
from rankscope.probe.comm import layout_probe

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
STEPS, AT = 14, 10


@pytest.fixture(autouse=True)
def _cleanup():
    yield
    if PrecisionDebugger.current is not None:
        PrecisionDebugger.current.close()


def train(tmp_path, fault: str = "", dropout: float = 0.0, **cluster) -> tuple[str, list[dict], list[int]]:
    """(checksum of every parameter and buffer at the end, re-run outcomes, records per step)."""
    cfg = tmp_path / f"cfg-{fault}-{len(list(tmp_path.iterdir()))}.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / "dump"),
                               "cluster": cluster}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    ms.set_seed(1)
    cells = [nn.Dense(8, 16), nn.BatchNorm1d(16), nn.ReLU()]
    if dropout:
        cells.append(nn.Dropout(p=dropout))
    net = nn.SequentialCell(cells + [nn.Dense(16, 2)])
    net.set_train()  # BatchNorm updates its moving statistics, Dropout drops
    opt = nn.SGD(net.trainable_params(), 0.01)
    loss_fn = nn.MSELoss()
    calls: dict[int, int] = {}
    bad = np.zeros((4, 2), np.float32)
    bad[0, 0] = np.nan

    inner = np.zeros((4, 16), np.float32)
    inner[1, 3] = np.nan

    def forward(x, y):
        calls[step] = calls.get(step, 0) + 1
        hit = step == AT and (fault in ("always", "before_bn") or (fault == "once" and calls[step] == 1))
        if fault == "before_bn" and hit and calls[step] == 1:
            h = net[0](x) + ms.Tensor(inner)  # miscomputed once before BatchNorm: its statistics see it
            for cell in list(net.cell_list)[1:]:
                h = cell(h)
            return loss_fn(h, y)
        out = net(x)
        if hit and fault != "before_bn":
            out = out + ms.Tensor(bad)  # a device that miscomputes one value
        return loss_fn(out, y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    rows = []
    for step in range(STEPS):
        dbg.start(net)
        rs = np.random.RandomState(step)
        x = rs.randn(4, 8).astype(np.float32)
        if fault == "batch" and step == AT:
            x[0, 0] = np.nan
        _, grads = grad_fn(ms.Tensor(x), ms.Tensor(rs.randn(4, 2).astype(np.float32)))
        opt(grads)
        dbg.stop()
        dbg.step()
        rows.append(len(dbg.flight_recorder.batches()[-1].name_ids))
    crc = zlib.crc32(b"".join(p.asnumpy().tobytes() for p in net.get_parameters()))
    outcomes = list(dbg.sentinels.rerun.outcomes)
    dbg.close()
    return f"{crc:08x}", outcomes, rows


def test_corrupted_once_is_transient_and_skip_trains_as_if_it_never_happened(tmp_path):
    clean, none, rows = train(tmp_path)
    assert none == []
    skipped, [out], rows_skip = train(tmp_path, "once", on_transient="skip")
    assert (out["outcome"], out["step"], out["used_rerun"], out["differs_at"]) == ("transient", AT, True, "loss")
    assert "not finite" in out["trigger"]
    assert skipped == clean
    assert rows_skip == rows  # the re-run recorded nothing of its own


def test_skip_starts_the_re_run_from_the_step_s_buffers(tmp_path):
    """A value miscomputed once before BatchNorm reaches its moving statistics; under
    skip the re-run starts from the buffers as the step began and its update is the one
    kept, so they end bit for bit as in a clean run too."""
    clean, _, _ = train(tmp_path)
    skipped, [out], _ = train(tmp_path, "before_bn", on_transient="skip")
    assert out["outcome"] == "transient" and out["used_rerun"] is True
    assert skipped == clean


def test_continue_changes_nothing_in_the_training(tmp_path):
    unwatched, none, _ = train(tmp_path, "once", rerun=False)
    assert none == []
    kept, [out], _ = train(tmp_path, "once")
    assert out["outcome"] == "transient" and out["used_rerun"] is False
    assert kept == unwatched  # weights and BatchNorm's moving statistics, bit for bit


def test_a_fault_on_every_execution_or_in_the_batch_reproduces(tmp_path):
    _, [always], _ = train(tmp_path, "always", on_transient="skip")
    assert (always["outcome"], always["bitwise"], always["used_rerun"]) == ("reproduced", True, False)
    _, [batch], _ = train(tmp_path, "batch")
    assert batch["outcome"] == "reproduced" and batch["step"] == AT
    # A forward that draws random numbers rankscope cannot rewind (nn.Dropout's kernel
    # state): not bit for bit, but still anomalous on the re-run.
    _, [drop], _ = train(tmp_path, "batch", dropout=0.5)
    assert drop["outcome"] == "reproduced"


def test_a_job_with_collectives_of_its_own_is_not_re_run(tmp_path, monkeypatch):
    monkeypatch.setattr(layout_probe, "_collectives", {("AllReduce", "tp_0")})
    _, [out], _ = train(tmp_path, "once", on_transient="skip")
    assert out["outcome"] == "not_possible" and "groups of its own" in out["why"]


def test_a_step_that_starts_from_poisoned_weights_is_not_re_run():
    from rankscope.probe.rerun.rerun import _poisoned
    w = ms.Parameter(ms.Tensor(np.ones((2, 2), np.float32)), name="w")
    assert not _poisoned([w]) and not _poisoned(w)
    w.set_data(ms.Tensor(np.array([[1, np.nan], [0, 0]], np.float32)))
    assert _poisoned([w]) and _poisoned(w)
