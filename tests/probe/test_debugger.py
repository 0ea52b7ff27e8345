"""PrecisionDebugger with real MindSpore (PyNative CPU): the seed's loop, the layout,
the numbers, bit-identical outputs, errors that never stop training, token_range,
Model.train with MsprobeStep, and msProbe's own compare reading our dumps."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from rankscope import MsprobeStep, PrecisionDebugger  # noqa: E402
from rankscope.wire.records import Kind  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


class Net(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(8, 6)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(6, 3)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def make(seed: int = 7):
    ms.set_seed(seed)
    net = Net()
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    return net, opt, grad_fn


def batch(step: int):
    rs = np.random.RandomState(100 + step)
    return ms.Tensor(rs.randn(4, 8).astype(np.float32)), ms.Tensor(rs.randn(4, 3).astype(np.float32))


def train(steps: int, dbg=None, seed: int = 7, close_after: int | None = None):
    """The seed's loop (start / grad / stop / step); returns losses and final params."""
    net, opt, grad_fn = make(seed)
    losses = []
    for i in range(steps):
        if dbg is not None and (close_after is None or i < close_after):
            dbg.start(net)
        x, y = batch(i)
        loss, grads = grad_fn(x, y)
        opt(grads)
        if dbg is not None and (close_after is None or i < close_after):
            dbg.stop()
            dbg.step()
        if dbg is not None and close_after is not None and i == close_after - 1:
            dbg.close()
        losses.append(loss.asnumpy().copy())
    return losses, [p.asnumpy().copy() for p in net.trainable_params()], net


def load(dump: Path, step: int, label: str, name: str = "dump.json") -> dict:
    return json.loads((dump / f"step{step}" / label / name).read_text())


@pytest.fixture(autouse=True)
def _cleanup():
    yield
    if PrecisionDebugger.current is not None:
        PrecisionDebugger.current.close()


def test_seed_loop_writes_msprobe_layout_with_correct_numbers(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L0")
    _, _, net = train(2, dbg)
    label = f"proc{os.getpid()}"
    for step in (0, 1):
        rdir = tmp_path / "d" / f"step{step}" / label
        assert {"dump.json", "stack.json", "construct.json"} <= {p.name for p in rdir.iterdir()}
    dump = load(tmp_path / "d", 1, label)
    assert dump["framework"] == "mindspore" and dump["level"] == "L0"
    data = dump["data"]
    for name in ("Cell.fc1.Dense.forward.0", "Cell.relu.ReLU.forward.0", "Cell.fc2.Dense.forward.0",
                 "Cell.fc2.Dense.backward.0", "Cell.relu.ReLU.backward.0", "Cell.fc1.Dense.backward.0",
                 "Cell.fc1.Dense.parameters_grad.0", "Cell.fc2.Dense.parameters_grad.0"):
        assert name in data, name
    fwd = data["Cell.fc1.Dense.forward.0"]
    x, _ = batch(1)
    xa = x.asnumpy()
    assert fwd["input_args"][0]["Max"] == pytest.approx(float(xa.max()))
    assert fwd["input_args"][0]["Norm"] == pytest.approx(float(np.linalg.norm(xa)), rel=1e-5)
    assert fwd["input_args"][0]["dtype"] == "Float32" and fwd["input_args"][0]["shape"] == [4, 8]
    assert set(fwd["parameters"]) == {"weight", "bias"}
    assert fwd["output"][0]["shape"] == [4, 6]
    bwd = data["Cell.fc2.Dense.backward.0"]
    assert bwd["input"][0]["shape"] == [4, 3] and bwd["output"][0]["shape"] == [4, 6]
    # x needs no gradient: fc1's backward has the grad of its output only
    assert data["Cell.fc1.Dense.backward.0"]["output"] == []
    assert data["Cell.fc1.Dense.backward.0"]["input"][0]["shape"] == [4, 6]
    assert data["Cell.fc2.Dense.parameters_grad.0"]["weight"][0]["shape"] == [3, 6]
    stack = json.loads((tmp_path / "d" / "step1" / label / "stack.json").read_text())
    assert any("Cell.fc1.Dense.forward.0" in names for names, _ in stack.values())
    construct = load(tmp_path / "d", 1, label, "construct.json")
    assert "Cell.fc1.Dense.forward.0" in construct
    assert dbg.hook_errors == 0


def test_a_parameter_an_api_takes_is_recorded_before_the_optimizer_updates_it(tmp_path):
    # At mix level fc1's weight is recorded twice a step: as the cell's parameter and as
    # MatMul's input. Both must be its value in that step's forward, not the next step's.
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    train(3, dbg)
    label = f"proc{os.getpid()}"
    for step in (1, 2):
        data = load(tmp_path / "d", step, label)["data"]
        [matmul] = [v for k, v in data.items() if k.endswith("MatMul.0.forward")]
        weight = train(step)[2].fc1.weight.asnumpy()  # after `step` updates: what step `step` used
        for got in (matmul["input_args"][1], data["Cell.fc1.Dense.forward.0"]["parameters"]["weight"]):
            assert got["shape"] == [6, 8]
            assert (got["Max"], got["Min"]) == (pytest.approx(float(weight.max())), pytest.approx(float(weight.min())))


def test_an_unwritable_dump_path_is_said_once_and_training_goes_on(tmp_path, capsys):
    dump = tmp_path / "file-not-dir"
    dump.write_text("")  # a file where the dump folder should be: nothing under it can be made
    dbg = PrecisionDebugger(dump_path=str(dump), level="L0")
    losses, _, _ = train(3, dbg)
    said = [line for line in capsys.readouterr().err.splitlines() if "could not be written" in line]
    assert len(said) == 1 and str(dump) in said[0], said
    assert [float(x) for x in losses] == [float(x) for x in train(3)[0]]


def test_start_without_a_model_at_l0_says_the_dump_has_no_cell_data(tmp_path, capsys, monkeypatch):
    from rankscope.wire import attach_report
    monkeypatch.setattr(attach_report, "_said", set())  # said once per process: an earlier test may have
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    net, opt, grad_fn = make()
    for i in range(2):
        dbg.start()
        loss, grads = grad_fn(*batch(i))
        opt(grads)
        dbg.stop()
        dbg.step()
    said = [line for line in capsys.readouterr().err.splitlines() if "start() got none" in line]
    assert len(said) == 1, said
    dumps = [json.loads(p.read_text())["data"] for p in (tmp_path / "d").glob("step*/*/dump.json")]
    assert not any(k.startswith("Cell.") for data in dumps for k in data)


def test_a_bad_config_raises_into_the_script_and_tells_launch_why_the_rank_never_attached(tmp_path, monkeypatch):
    from rankscope.config.errors import ConfigError
    from rankscope.wire.attach_report import ENV_VAR, read_failures
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistic", "level": "L0"}))
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    monkeypatch.setenv("RANK_ID", "2")
    with pytest.raises(ConfigError, match="task"):
        PrecisionDebugger(config_path=str(cfg))
    [note] = read_failures(tmp_path).values()
    assert note["rank"] == 2 and note["raised"] and note["reason"].startswith("PrecisionDebugger: ")
    assert "'statistic'" in note["reason"]


def test_forward_output_stats_equal_the_real_activation(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    net, opt, grad_fn = make()
    x, y = batch(0)
    dbg.start(net)
    out = net(x)
    dbg.stop()
    dbg.step()
    data = load(tmp_path / "d", 0, f"proc{os.getpid()}")["data"]
    o = out.asnumpy()
    got = data["Cell.fc2.Dense.forward.0"]["output"][0]
    assert got["Max"] == pytest.approx(float(o.max())) and got["Min"] == pytest.approx(float(o.min()))
    assert got["Mean"] == pytest.approx(float(o.mean()), abs=1e-6)
    assert got["Norm"] == pytest.approx(float(np.linalg.norm(o)), rel=1e-5)
    w = net.fc2.weight.asnumpy()
    assert data["Cell.fc2.Dense.forward.0"]["parameters"]["weight"]["Max"] == pytest.approx(float(w.max()))


def test_probed_run_is_bit_identical_to_unprobed_and_after_detach(tmp_path):
    base_losses, base_params, _ = train(4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", task="tensor")
    losses, params, _ = train(4, dbg, close_after=2)  # probed for 2 steps, detached for 2
    for a, b in zip(base_losses, losses):
        assert a.tobytes() == b.tobytes()
    for a, b in zip(base_params, params):
        assert a.tobytes() == b.tobytes()
    assert (tmp_path / "d" / "step1").exists() and not (tmp_path / "d" / "step2").exists()
    assert dbg.hook_errors == 0


def test_batches_carry_kinds_sentinels_and_exec_order(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    losses, _, _ = train(2, dbg)
    batches = dbg.flight_recorder.batches()
    assert [b.step for b in batches] == [0, 1]
    b = batches[1]
    names = [dbg.recorder.names.name(int(i)) for i in b.name_ids]
    kinds = dict(zip(names, b.kinds.tolist()))
    assert kinds["Sentinel.loss"] == Kind.LOSS
    assert kinds["Cell.fc1.Dense.forward.0.output.0"] == Kind.FORWARD
    assert kinds["Cell.fc1.Dense.forward.0.parameters.weight"] == Kind.PARAM
    assert kinds["Cell.fc1.Dense.backward.0.input.0"] == Kind.BACKWARD
    assert kinds["Cell.fc1.Dense.parameters_grad.0.weight"] == Kind.GRAD_LOCAL
    assert kinds["Sentinel.grad_local.fc1.weight"] == Kind.GRAD_LOCAL
    assert kinds["Sentinel.param.fc1.weight"] == Kind.PARAM
    assert kinds["Sentinel.opt_state.moment1.fc1.weight"] == Kind.OPT_STATE
    assert b.exec_index.tolist() == list(range(len(b)))
    assert names.index("Cell.fc1.Dense.forward.0.output.0") < names.index("Cell.fc1.Dense.backward.0.input.0")
    loss_row = names.index("Sentinel.loss")
    assert b.stats[loss_row, 0] == pytest.approx(float(losses[1]))
    assert b.rank == -1  # no rank known (proc folder): -1 on the wire


def test_hook_error_is_logged_counted_and_training_goes_on(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", task="tensor")
    label = f"proc{os.getpid()}"
    # A real fault: a plain file where the tensor directory must be created.
    rdir = tmp_path / "d" / "step0" / label
    rdir.mkdir(parents=True)
    (rdir / "dump_tensor_data").write_text("in the way")
    base_losses, _, _ = train(2)
    losses, _, _ = train(2, dbg)
    assert [a.tobytes() for a in losses] == [a.tobytes() for a in base_losses]
    assert dbg.hook_errors > 0
    log = (rdir / "dump_error_info.log").read_text()
    assert "saving tensor" in log
    # the next step is unaffected: its tensors are on disk
    assert any((tmp_path / "d" / "step1" / label / "dump_tensor_data").glob("Cell.fc1.Dense.forward.0.*.npy"))


def test_step_selection_rank_id_md5_and_tensor_files(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", task="tensor", step=[1])
    dbg.config.summary_mode = "md5"
    dbg.recorder.crc = True
    net, opt, grad_fn = make()
    for i in range(3):
        dbg.start(net, rank_id=5)
        x, y = batch(i)
        loss, grads = grad_fn(x, y)
        opt(grads)
        dbg.stop()
        dbg.step()
    steps = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert steps == ["step1"]
    dump = load(tmp_path / "d", 1, "rank5")
    leaf = dump["data"]["Cell.fc1.Dense.forward.0"]["input_args"][0]
    arr = np.load(tmp_path / "d" / "step1" / "rank5" / "dump_tensor_data" / leaf["data_name"])
    np.testing.assert_array_equal(arr, batch(1)[0].asnumpy())
    import zlib
    assert leaf["md5"] == f"{zlib.crc32(arr.tobytes()):08x}"
    assert dbg.flight_recorder.batches()[0].rank == 5


def test_token_range_records_only_calls_a_to_b(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    net, _, _ = make()
    with pytest.raises(ValueError, match="token_range"):
        dbg.start(token_range=[1, 2])
    dbg.start(model=net, token_range=[1, 2])
    x, _ = batch(0)
    outs = [net(x * (i + 1)) for i in range(5)]  # 5 decode steps
    dbg.stop()
    dbg.step()
    data = load(tmp_path / "d", 0, f"proc{os.getpid()}")["data"]
    fwd = sorted(k for k in data if k.startswith("Cell.fc2.Dense.forward."))
    assert fwd == ["Cell.fc2.Dense.forward.0", "Cell.fc2.Dense.forward.1"]
    # they are tokens 1 and 2: compare with the outputs of those calls
    assert data["Cell.fc2.Dense.forward.0"]["output"][0]["Max"] == pytest.approx(float(outs[1].asnumpy().max()))
    assert data["Cell.fc2.Dense.forward.1"]["output"][0]["Max"] == pytest.approx(float(outs[2].asnumpy().max()))
    # the next request (step) counts its tokens from 0 again, as msProbe does at start()
    dbg.start(model=net, token_range=[0, 0])
    outs = [net(x * (i + 1)) for i in range(3)]
    dbg.stop()
    dbg.step()
    data = load(tmp_path / "d", 1, f"proc{os.getpid()}")["data"]
    assert sorted(k for k in data if k.startswith("Cell.fc2.Dense.forward.")) == ["Cell.fc2.Dense.forward.0"]
    assert data["Cell.fc2.Dense.forward.0"]["output"][0]["Max"] == pytest.approx(float(outs[0].asnumpy().max()))


def test_l1_api_wrapping_and_custom_api(tmp_path):
    from mindspore import ops
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    x = ms.Tensor(np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32))
    dbg.start()
    y = ops.relu(x)
    z = ops.matmul(y, y)
    dbg.register_custom_api(ops, "abs", "Functional")
    w = ops.abs(x)
    dbg.restore_custom_api(ops, "abs")
    ops.abs(x)  # restored: not recorded
    dbg.stop()
    dbg.step()
    data = load(tmp_path / "d", 0, f"proc{os.getpid()}")["data"]
    assert data["Functional.relu.0.forward"]["output"][0]["Max"] == 3.0
    assert data["Functional.matmul.0.forward"]["output"][0]["Max"] == float(z.asnumpy().max())
    assert data["Functional.abs.0.forward"]["output"][0]["Min"] == float(w.asnumpy().min())
    assert "Functional.abs.1.forward" not in data
    dbg.close()
    assert not hasattr(ops.relu, "_rankscope_orig")


def test_model_train_with_msprobe_step(tmp_path):
    import mindspore.dataset as ds
    from mindspore.train import Model
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    net, opt, _ = make()
    rs = np.random.RandomState(0)
    data = ds.NumpySlicesDataset({"x": rs.randn(12, 8).astype(np.float32),
                                  "y": rs.randn(12, 3).astype(np.float32)}, shuffle=False).batch(4)
    dbg.start(net)
    Model(net, loss_fn=nn.MSELoss(), optimizer=opt).train(1, data, callbacks=[MsprobeStep(dbg)])
    label = f"proc{os.getpid()}"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["step0", "step1", "step2"]
    assert "Cell.fc1.Dense.backward.0" in load(tmp_path / "d", 2, label)["data"]
    names = [dbg.recorder.names.name(int(i)) for i in dbg.flight_recorder.batches()[-1].name_ids]
    assert "Sentinel.loss" in names and "Sentinel.param.fc1.weight" in names


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_msprobe_compare_reads_our_dumps(tmp_path, task):
    compat = pytest.importorskip("tests.msprobe_compat")
    if not compat.msprobe_available():
        pytest.skip("mindstudio-probe not installed")
    for side, seed in (("npu", 7), ("bench", 8)):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / side), level="L0", task=task)
        net, opt, grad_fn = make(seed)
        dbg.start(net, rank_id=0)
        x, y = batch(0)
        loss, grads = grad_fn(x, y)
        opt(grads)
        dbg.stop()
        dbg.step()
        dbg.close()
    result = compat.run_msprobe_compare(tmp_path / "npu" / "step0" / "rank0",
                                        tmp_path / "bench" / "step0" / "rank0", tmp_path / "out")
    rows = {r["NPU Name"]: r for r in compat.read_compare_result(result)}
    ours = compat.expected_rows(load(tmp_path / "npu", 0, "rank0")["data"], tensor_names=task == "tensor")
    assert set(rows) == set(ours)
    bwd = "Cell.fc1.Dense.backward.0.input.0"
    name = "Cell.fc2.Dense.forward.0.output.0"
    assert bwd in rows and name in rows  # backward entries are compared too
    assert float(rows[name]["NPU max"]) == pytest.approx(ours[name]["Max"], rel=1e-6)
    if task == "tensor":  # real data compared: different seeds give a cosine below 1
        assert float(rows[name]["Cosine"]) < 0.9999


def test_save_writes_debug_json_with_value_and_gradient(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="debug")
    net, opt, _ = make()
    x, y = batch(0)

    def fwd(x):
        h = net.fc1(x)
        dbg.save(h, "hidden")
        return net.fc2(net.relu(h)).sum()

    ms.value_and_grad(fwd, None, net.trainable_params())(x)
    dbg.save({"lr": 0.01, "t": x}, "misc", save_backward=False)
    dbg.step()
    data = load(tmp_path / "d", 0, f"proc{os.getpid()}", "debug.json")["data"]
    h = net.fc1(x).asnumpy()
    assert data["hidden.0.debug"]["Max"] == pytest.approx(float(h.max()))
    assert data["hidden_grad.0.debug"]["shape"] == [4, 6]
    assert data["misc.0.debug"]["lr"] == {"type": "float", "value": 0.01}
    assert data["misc.0.debug"]["t"]["Norm"] == pytest.approx(float(np.linalg.norm(x.asnumpy())), rel=1e-5)


def test_seed_examples_run_unchanged(tmp_path):
    """The two PyNative loops of seeds/001, verbatim apart from the import line."""
    model = Net()
    data_loader = [batch(i) for i in range(2)]
    # "High-Level Model APIs Not Used", L0: start(model) ... ms.grad(model)(data) ... step()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "l0"), level="L0")
    for data, label in data_loader:
        debugger.start(model)
        grad_net = ms.grad(model)(data)  # noqa: F841
        debugger.step()
    debugger.close()
    # the L1 variant: start() / ms.grad / stop() / step(); without a model only
    # non-primitive APIs are collected, so this network calls mindspore.ops functions
    from mindspore import ops

    class FNet(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(np.full((8, 3), 0.1, np.float32)), name="w")

        def construct(self, x):
            return ops.relu(ops.matmul(x, self.w))

    model = FNet()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "l1"), level="L1")
    for data, label in data_loader:
        debugger.start()
        grad_net = ms.grad(model)(data)  # noqa: F841
        debugger.stop()
        debugger.step()
    label = f"proc{os.getpid()}"
    l0 = load(tmp_path / "l0", 1, label)["data"]
    assert {"Cell.fc1.Dense.forward.0", "Cell.fc2.Dense.backward.0", "Cell.fc1.Dense.backward.0"} <= set(l0)
    # ms.grad(model) differentiates w.r.t. the input: fc1's backward has the input's grad
    assert l0["Cell.fc1.Dense.backward.0"]["output"][0]["shape"] == [4, 8]
    l1 = load(tmp_path / "l1", 1, label)["data"]
    assert {"Functional.matmul.0.forward", "Functional.relu.0.forward", "Functional.relu.0.backward"} <= set(l1)
    assert l1["Functional.relu.0.backward"]["input"][0]["shape"] == [4, 3]
    assert l1["Functional.matmul.0.backward"]["output"][0]["shape"] == [4, 8]  # grad of x
    # ms.grad(model) differentiates w.r.t. the input only: no gradient for w
    assert l1["Functional.matmul.0.backward"]["output"][1:] in ([], [None])


def test_batchnorm_moving_statistics_are_not_recorded_as_replicated_weights(tmp_path):
    # Each data-parallel rank updates BatchNorm's moving mean/variance from its own batch:
    # as PARAM (replicated) records, every CNN was a replica split at step 0.
    class BnNet(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.bn = nn.Dense(8, 4), nn.BatchNorm1d(4)

        def construct(self, x):
            return self.bn(self.fc(x)).sum()

    ms.set_seed(3)
    net = BnNet()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    for step in range(2):
        dbg.start(net)
        _, grads = grad_fn(ms.Tensor(np.random.default_rng(step).standard_normal((4, 8)).astype(np.float32)))
        opt(grads)
        dbg.stop()
        dbg.step()
    b = dbg.flight_recorder.batches()[1]
    kinds = dict(zip((dbg.recorder.names.name(int(i)) for i in b.name_ids), b.kinds.tolist()))
    dbg.close()
    bn = "Cell.bn.BatchNorm1d.forward.0.parameters"
    assert kinds[f"{bn}.moving_mean"] == kinds[f"{bn}.moving_variance"] == Kind.FORWARD
    assert kinds[f"{bn}.gamma"] == kinds["Cell.fc.Dense.forward.0.parameters.weight"] == Kind.PARAM
    data = load(tmp_path / "d", 1, f"proc{os.getpid()}")["data"]
    assert set(data["Cell.bn.BatchNorm1d.forward.0"]["parameters"]) >= {"moving_mean", "moving_variance", "gamma"}


def test_a_rank_folder_held_by_another_live_process_is_not_overwritten(tmp_path):
    import signal
    import subprocess
    import sys
    dump = tmp_path / "d"
    holder = subprocess.Popen(  # a live process that is not us holds rank 0
        [sys.executable, "-c", "import sys; from rankscope.dump.folder_claim import claim_rank_label; "
         "print(claim_rank_label(sys.argv[1], 0)[0], flush=True); sys.stdin.read()", str(dump)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "rank0"
    dbg = PrecisionDebugger(dump_path=str(dump), level="L0")
    net, opt, grad_fn = make()
    dbg.start(net, rank_id=0)
    loss, grads = grad_fn(*batch(0))
    opt(grads)
    dbg.stop()
    dbg.step()
    assert not (dump / "step0" / "rank0").exists()
    assert (dump / "step0" / f"proc{os.getpid()}" / "dump.json").exists()
    holder.send_signal(signal.SIGKILL)  # a holder that died without letting go
    holder.wait(timeout=30)
    dbg2 = PrecisionDebugger(dump_path=str(dump), level="L0")
    dbg2.start(net, rank_id=0)
    net(batch(0)[0])
    dbg2.stop()
    dbg2.step()
    assert (dump / "step0" / "rank0" / "dump.json").exists()


def test_device_side_stats_give_the_same_dump(tmp_path, monkeypatch):
    """The accelerator path (stats as device ops, one readback per step), forced on CPU."""
    results = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("RANKSCOPE_DEVICE_STATS", mode)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / mode), level="L0")
        assert dbg.recorder.device_side is (mode == "1")
        train(1, dbg)
        dbg.close()
        results[mode] = load(tmp_path / mode, 0, f"proc{os.getpid()}")["data"]
    assert set(results["0"]) == set(results["1"])
    for name in ("Cell.fc2.Dense.forward.0", "Cell.fc1.Dense.backward.0"):
        host, dev = results["0"][name], results["1"][name]
        leaf_h = (host.get("output") or host.get("input"))[0]
        leaf_d = (dev.get("output") or dev.get("input"))[0]
        for key in ("Max", "Min"):
            assert leaf_d[key] == pytest.approx(leaf_h[key], rel=1e-6)
        assert leaf_d["Norm"] == pytest.approx(leaf_h["Norm"], rel=1e-4)


def test_level_l2_in_pynative_records_no_eager_data_and_says_so(tmp_path):
    """L2 is the kernel level: an eager step has no kernels to read, so no Cell/API hook
    runs, training is bit-identical, the Python-API path refuses plainly and the watch
    line says what was not seen."""
    plain, _, _ = train(3)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L2")
    losses, _, net = train(3, dbg)
    assert [a.tobytes() for a in losses] == [a.tobytes() for a in plain]
    assert not any(c._forward_hook or c._forward_pre_hook for _, c in net.cells_and_names())
    with pytest.raises(ValueError, match="level L2 records kernels of compiled code only"):
        dbg.register_custom_api(ms.ops, "relu", "Functional")
    w = dbg.graph.report.current()
    assert "sentinels only" in w.how and "level L2" in w.reason


def test_an_input_fed_every_step_gathers_no_grad_hooks(tmp_path, monkeypatch):
    """A tensor built once and fed each step (a mask, fixed positions) gets its backward
    hook for one step only: kept, one more would be called by every later backward (and
    MindSpore holds memory for each for the life of the process)."""
    from rankscope.probe.hooks.recorder import Recorder
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0")
    net, opt, _ = make()
    loss_fn = nn.MSELoss()
    # gradients for the input too, so a hook kept on it would fire again each step
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), 0, opt.parameters)
    x, y = batch(0)
    calls: list[str] = []
    orig = Recorder.tensor
    monkeypatch.setattr(Recorder, "tensor", lambda self, name, *a, **k: (calls.append(name), orig(self, name, *a, **k))[1])
    per_step = []
    for _ in range(4):
        calls.clear()
        dbg.start(net)
        _, (_, grads) = grad_fn(x, y)
        opt(grads)
        dbg.stop()
        dbg.step()
        per_step.append(sum(".backward." in n for n in calls))
    assert per_step[0] > 0 and per_step == [per_step[0]] * 4, per_step
    assert dbg.recorder._step_hooks == []  # noqa: SLF001
