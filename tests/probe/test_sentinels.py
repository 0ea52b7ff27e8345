"""DP sentinels with real MindSpore: loss, local vs reduced grads, param/opt-state CRC."""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from rankscope import PrecisionDebugger  # noqa: E402
from rankscope.probe.vitals import fingerprint
from rankscope.wire.records import Kind  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


@pytest.fixture(autouse=True)
def _cleanup():
    yield
    if PrecisionDebugger.current is not None:
        PrecisionDebugger.current.close()


def rows(dbg, step=-1) -> dict[str, tuple]:
    b = dbg.flight_recorder.batches()[step]
    names = [dbg.recorder.names.name(int(i)) for i in b.name_ids]
    return {n: (int(k), b.stats[i], int(b.crc32[i]), int(b.nan_count[i])) for i, (n, k) in
            enumerate(zip(names, b.kinds))}


def setup(reducer_scale: float | None = None):
    ms.set_seed(3)
    net = nn.SequentialCell([nn.Dense(5, 4), nn.ReLU(), nn.Dense(4, 2)])
    opt = nn.Adam(net.trainable_params(), learning_rate=0.05)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    reducer = None
    if reducer_scale is not None:
        # A real DistributedGradReducer (constructed, so found by the sentinels); its
        # AllReduce needs init(), so its construct is replaced by a local "mean".
        reducer = nn.DistributedGradReducer(opt.parameters)
        reducer.construct = lambda grads: tuple(g * reducer_scale for g in grads)
    return net, opt, grad_fn, reducer


def data(step):
    rs = np.random.RandomState(step)
    return ms.Tensor(rs.randn(6, 5).astype(np.float32)), ms.Tensor(rs.randn(6, 2).astype(np.float32))


def debugger(tmp_path, tier: str) -> PrecisionDebugger:
    cfg = tmp_path.parent / f"{tmp_path.name}-{tier}.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L0", "cluster": {"watch": tier}}))
    return PrecisionDebugger(config_path=str(cfg), dump_path=str(tmp_path))


def checksum(tier: str, arr: np.ndarray) -> int:
    """What a row's checksum field holds: CRC-32 under the full watch, the default watch's
    fingerprint otherwise."""
    return zlib.crc32(arr.tobytes()) if tier == "full" else fingerprint.host_fingerprint(arr)


@pytest.mark.parametrize("tier", ["full", "default"])
def test_param_and_opt_state_crc_are_the_values_the_step_started_from(tmp_path, tier):
    dbg = debugger(tmp_path, tier)  # sentinels only: no model
    net, opt, grad_fn, _ = setup()
    before = []
    for step in range(3):
        dbg.start()
        before.append({p.name: p.asnumpy().copy() for p in opt.get_parameters()})
        loss, grads = grad_fn(*data(step))
        opt(grads)
        dbg.stop()
        dbg.step()
    assert not any(tmp_path.iterdir())  # sentinels stream; nothing is dumped without hooks
    for step in range(3):
        r = rows(dbg, step)
        w = before[step]["0.weight"]
        kind, stats, crc, _ = r["Sentinel.param.0.weight"]
        assert kind == Kind.PARAM and crc == checksum(tier, w)
        if tier == "full":
            assert stats[0] == pytest.approx(float(w.max()))
        else:  # one read of the weight: its fingerprint, no statistics
            assert np.isnan(stats).all()
        m = before[step]["moment1.0.weight"]
        kind, _, crc, _ = r["Sentinel.opt_state.moment1.0.weight"]
        assert kind == Kind.OPT_STATE and crc == checksum(tier, m)
    assert rows(dbg, 1)["Sentinel.param.0.weight"][2] != rows(dbg, 2)["Sentinel.param.0.weight"][2]


def test_loss_and_grads_handed_to_the_optimizer_without_a_reducer(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    net, opt, grad_fn, _ = setup()
    dbg.start()
    loss, grads = grad_fn(*data(0))
    scaled = tuple(g * 50 for g in grads)  # a faulty rank's gradient, after the grad fn
    opt(scaled)
    dbg.stop()
    dbg.step()
    r = rows(dbg)
    assert r["Sentinel.loss"][0] == Kind.LOSS
    assert r["Sentinel.loss"][1][2] == pytest.approx(float(loss.asnumpy()))
    g = scaled[0].asnumpy()
    kind, stats, _, _ = r["Sentinel.grad_local.0.weight"]
    assert kind == Kind.GRAD_LOCAL and stats[3] == pytest.approx(float(np.linalg.norm(g)), rel=1e-5)
    assert not any(n.startswith("Sentinel.grad_reduced") for n in r)
    assert dbg.sentinels.unreduced_steps == 1  # what makes a multi-rank run say local grads are unseen


@pytest.mark.parametrize("tier", ["full", "default"])
def test_reducer_input_is_local_and_output_is_reduced(tmp_path, tier):
    dbg = debugger(tmp_path, tier)
    net, opt, grad_fn, reducer = setup(reducer_scale=0.25)
    x, y = data(1)
    x_np = x.asnumpy()
    x_np[2, 3] = np.nan  # a NaN in this rank's batch
    dbg.start()
    loss, grads = grad_fn(ms.Tensor(x_np), y)
    reduced = reducer(grads)
    opt(reduced)
    dbg.stop()
    dbg.step()
    r = rows(dbg)
    local = grads[2].asnumpy()  # names come from the reducer's own parameter list
    kind, stats, _, nan = r["Sentinel.grad_local.2.weight"]
    assert kind == Kind.GRAD_LOCAL
    k2, stats2, crc2, _ = r["Sentinel.grad_reduced.2.weight"]
    assert k2 == Kind.GRAD_REDUCED and crc2 == checksum(tier, (local * 0.25).astype(np.float32))
    assert stats2[3] == pytest.approx(float(np.linalg.norm(local * 0.25)), rel=1e-5)
    assert r["Sentinel.grad_local.0.weight"][3] > 0  # the NaN reaches fc1's weight gradient
    # local grads are recorded once per step (at the reducer, not again at the optimizer)
    names = [dbg.recorder.names.name(int(i)) for i in dbg.flight_recorder.batches()[-1].name_ids]
    assert names.count("Sentinel.grad_local.0.weight") == 1
    assert dbg.sentinels.unreduced_steps == 0


def test_sentinels_can_be_switched_off(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L0", "cluster": {"sentinels": False}}))
    dbg = PrecisionDebugger(config_path=str(cfg), dump_path=str(tmp_path / "d"))
    net, opt, grad_fn, _ = setup()
    dbg.start(net)
    loss, grads = grad_fn(*data(0))
    w = net[0].weight.asnumpy().copy()
    opt(grads)
    dbg.stop()
    dbg.step()
    names = rows(dbg)
    # the forward's parameter entry holds the weight the forward used, not the updated one
    kind, stats, _, _ = names["Cell.0.Dense.forward.0.parameters.weight"]
    assert kind == Kind.PARAM and stats[0] == float(w.max()) and stats[0] != float(net[0].weight.asnumpy().max())
    assert not any(n.startswith("Sentinel.") for n in names)
    assert "0.Dense.forward.0.output.0" not in names and "Cell.0.Dense.forward.0.output.0" in names
