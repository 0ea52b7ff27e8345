"""seed_all: seeded runs give bit-identical dumps, unseeded runs do not; rm_dropout; mode."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from repo_paths import REPO

# One training run of a small MLP with dropout (active: train mode) under rankscope's
# PrecisionDebugger, L0 tensor dump of 2 steps (the msProbe loop of seeds/001).
_RUN_DEBUGGER = r"""
import sys
import numpy as np
import mindspore as ms
from mindspore import nn, Tensor
from rankscope import PrecisionDebugger, seed_all

if sys.argv[2] == "seed":
    seed_all(1234, mode=True)
debugger = PrecisionDebugger(dump_path=sys.argv[1], task="tensor", level="L0")
net = nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dropout(p=0.5), nn.Dense(32, 4)])
net.set_train(True)
opt = nn.Adam(net.trainable_params(), 1e-2)
loss_fn = nn.MSELoss()
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
for step in range(2):
    debugger.start(net)
    x = Tensor(np.random.standard_normal((8, 16)).astype(np.float32))
    y = Tensor(np.random.standard_normal((8, 4)).astype(np.float32))
    loss, grads = grad_fn(x, y)
    opt(grads)
    debugger.stop()
    debugger.step()
assert debugger.hook_errors == 0 and debugger.writer.errors == 0
import os
print("deterministic", ms.get_context("deterministic"), os.environ.get("HCCL_DETERMINISTIC"))
"""

# The same without the debugger (builds where rankscope.probe.debugger is absent): params, grads
# and the loss written through the real DumpWriter in tensor mode.
_RUN_WRITER = r"""
import sys
import numpy as np
import mindspore as ms
from mindspore import nn, Tensor
from rankscope.dump.writer import DumpWriter
from rankscope.wire.records import StepBatch, StepOutput
from rankscope.probe.seed import seed_all

if sys.argv[2] == "seed":
    seed_all(1234, mode=True)
net = nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dropout(p=0.5), nn.Dense(32, 4)])
net.set_train(True)
opt = nn.Adam(net.trainable_params(), 1e-2)
loss_fn = nn.MSELoss()
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
w = DumpWriter(sys.argv[1], "tensor", "L0")
for step in range(2):
    x = Tensor(np.random.standard_normal((8, 16)).astype(np.float32))
    y = Tensor(np.random.standard_normal((8, 4)).astype(np.float32))
    loss, grads = grad_fn(x, y)
    opt(grads)
    entries = {}
    named = [("loss", loss)] + [("grad." + p.name, g) for p, g in zip(opt.parameters, grads)] \
        + [("param." + p.name, p) for p in net.trainable_params()]
    for name, t in named:
        a = t.asnumpy()
        entries[name] = {"type": "mindspore.Tensor", "dtype": str(a.dtype), "shape": list(a.shape),
                         "Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
                         "Norm": float(np.linalg.norm(a)),
                         "data_name": w.write_tensor(step, "rank0", name + ".npy", a)}
    w.emit(StepOutput(StepBatch.empty("j", 0, step), "rank0", entries=entries))
import os
print("deterministic", ms.get_context("deterministic"), os.environ.get("HCCL_DETERMINISTIC"))
"""


def run_dump(tmp_path, tag: str, mode: str) -> dict[str, str]:
    """Run one training process; return {file of its dump: sha256 of its content}."""
    root = tmp_path / tag
    script = _RUN_DEBUGGER if importlib.util.find_spec("rankscope.probe.debugger") else _RUN_WRITER
    env = {k: v for k, v in os.environ.items() if k != "HCCL_DETERMINISTIC"}
    proc = subprocess.run([sys.executable, "-c", script, str(root), mode], cwd=REPO,
                          capture_output=True, text=True, env={**env, "GLOG_v": "3", "RANK_ID": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # seed_all(mode=True) in the seeded runs: deterministic kernels + HCCL reductions on.
    expect = "deterministic ON true" if mode == "seed" else "deterministic OFF None"
    assert proc.stdout.strip().splitlines()[-1] == expect, proc.stdout[-2000:]
    digests = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "dump.json":  # dump_data_dir is the (different) absolute folder
            dump = json.loads(data)
            dump["dump_data_dir"] = None
            data = json.dumps(dump, sort_keys=True).encode()
        digests[str(path.relative_to(root))] = hashlib.sha256(data).hexdigest()
    assert len(digests) >= 2 * (3 + 8)  # dump.json etc. + npy files per step
    return digests


def test_seeded_runs_bit_identical_unseeded_runs_differ(tmp_path):
    s0, s1 = run_dump(tmp_path, "s0", "seed"), run_dump(tmp_path, "s1", "seed")
    u0, u1 = run_dump(tmp_path, "u0", "none"), run_dump(tmp_path, "u1", "none")
    assert s0 == s1, sorted(k for k in s0.keys() | s1.keys() if s0.get(k) != s1.get(k))
    assert u0 != u1 and u0 != s0
    # Not just a detail: the parameters the runs start from differ.
    init = "step0/rank0/dump_tensor_data/Cell.0.Dense.forward.0.parameters.weight.npy"
    if init in u0:
        assert u0[init] != u1[init]


def test_reseeding_in_process_repeats_random_streams(monkeypatch):
    monkeypatch.setitem(os.environ, "PYTHONHASHSEED", "0")  # restored after the test
    import random

    import mindspore as ms
    from mindspore import nn, ops

    from rankscope.probe.seed import seed_all

    def draw():
        net = nn.Dense(4, 4)
        x = ms.Tensor(np.ones((2, 4), np.float32))
        return (random.random(), np.random.rand(), net.weight.asnumpy().tobytes(),
                ops.dropout(x, p=0.5).asnumpy().tobytes(), os.environ["PYTHONHASHSEED"])

    import mindspore.dataset as ds
    seed_all(77)
    first = draw()
    seed_all(77)
    assert draw() == first
    assert first[-1] == "77" and ds.config.get_seed() == 77
    seed_all(78)
    assert draw()[:4] != first[:4]


def test_rm_dropout_disables_layers_created_afterwards_and_functionals(monkeypatch):
    monkeypatch.setitem(os.environ, "PYTHONHASHSEED", "0")
    import mindspore as ms
    from mindspore import mint, nn, ops
    from mindspore.nn import Dropout as DropoutBoundEarly  # bound before seed_all

    from rankscope.probe.seed import restore_dropout, seed_all

    x4 = ms.Tensor(np.ones((4, 8, 4, 4), np.float32))
    before = nn.Dropout(p=0.5)
    before.set_train(True)
    try:
        seed_all(5, rm_dropout=True)
        layers = [nn.Dropout(p=0.5), nn.Dropout(keep_prob=0.3), DropoutBoundEarly(p=0.9),
                  nn.Dropout2d(p=0.5), mint.nn.Dropout(p=0.5)]
        for layer in layers:
            layer.set_train(True)
            assert np.array_equal(layer(x4).asnumpy(), x4.asnumpy()), type(layer).__name__
        prim_out = ops.Dropout(keep_prob=0.2)(x4)[0]
        assert np.array_equal(prim_out.asnumpy(), x4.asnumpy())
        assert np.array_equal(ops.dropout(x4, p=0.7).asnumpy(), x4.asnumpy())
        assert np.array_equal(mint.nn.functional.dropout(x4, p=0.7).asnumpy(), x4.asnumpy())
        # Calling it twice does not stack wrappers.
        seed_all(5, rm_dropout=True)
        assert np.array_equal(nn.Dropout(p=0.5)(x4).asnumpy(), x4.asnumpy())
    finally:
        restore_dropout()
    # A layer created before seed_all keeps dropping, and restore brings dropout back.
    assert (before(x4).asnumpy() == 0).any()
    after = nn.Dropout(p=0.5)
    after.set_train(True)
    assert (after(x4).asnumpy() == 0).any()
    assert (ops.dropout(x4, p=0.5).asnumpy() == 0).any()


def test_seed_all_without_mode_leaves_determinism_alone():
    # mode=True is checked in the seeded subprocess runs above (MindSpore allows one
    # configuration per process); without mode nothing may lock it OFF.
    import mindspore as ms
    from mindspore.device_manager import DeviceManagerConf

    from rankscope.probe.seed import seed_all
    conf = DeviceManagerConf.get_instance()
    before = (conf.is_deterministic_configured(), ms.get_context("deterministic"))
    seed_all(3)
    assert (conf.is_deterministic_configured(), ms.get_context("deterministic")) == before


@pytest.mark.parametrize("kwargs, bad", [
    ({"seed": -1}, "seed"), ({"seed": 2**32}, "seed"), ({"seed": "1"}, "seed"), ({"seed": True}, "seed"),
    ({"mode": "yes"}, "mode"), ({"rm_dropout": 1}, "rm_dropout"),
])
def test_bad_arguments_name_the_parameter(kwargs, bad):
    from rankscope.probe.seed import seed_all
    with pytest.raises(ValueError, match=f"^{bad} = "):
        seed_all(**kwargs)
