"""The published msProbe's compare reads two dumps written by our DumpWriter.

The dumps hold real MindSpore values (a 2-layer MLP's forward, backward and
parameter gradients, L0 naming from seeds/001); the "npu" run has one weight
perturbed, so msProbe must report equal rows as equal and the affected ones as
different, with the numbers we wrote.
"""
from __future__ import annotations

import importlib.util
import math
import zlib

import numpy as np
import pytest
from repo_paths import REPO

from rankscope.dump.writer import MAX_FILE_NAME, DumpWriter
from rankscope.wire.records import StepBatch, StepOutput
from tests.msprobe_compat import (
    expected_rows,
    msprobe_available,
    read_compare_result,
    run_msprobe_compare,
    run_msprobe_compare_ranks,
)

pytestmark = pytest.mark.skipif(not msprobe_available(), reason="mindstudio-probe is not installed")

STACK = ["File \"train.py\", line 42, in train_step", "loss = net(x)"]
LONG_PREFIX = "Cell." + "encoder_block_with_a_long_name." * 9  # > 255 chars with the suffix


def mlp_tensors(perturb: float) -> dict[str, dict[str, np.ndarray]]:
    """Real MindSpore forward/backward values of fc1 -> relu -> fc2 under an MSE loss."""
    import mindspore as ms
    from mindspore import nn, ops

    rng = np.random.default_rng(1)
    fc1, fc2 = nn.Dense(6, 5), nn.Dense(5, 3)
    fc1.weight.set_data(ms.Tensor(rng.standard_normal((5, 6)).astype(np.float32)))
    fc1.bias.set_data(ms.Tensor(rng.standard_normal(5).astype(np.float32)))
    w2 = rng.standard_normal((3, 5)).astype(np.float32)
    w2[0, 0] += perturb
    fc2.weight.set_data(ms.Tensor(w2))
    fc2.bias.set_data(ms.Tensor(rng.standard_normal(3).astype(np.float32)))
    x = ms.Tensor(rng.standard_normal((4, 6)).astype(np.float32))
    target = ms.Tensor(rng.standard_normal((4, 3)).astype(np.float32))
    h = fc1(x)
    r = ops.relu(h)
    y = fc2(r)
    loss = lambda out: ops.mean((out - target) ** 2)  # noqa: E731
    gy = ms.grad(loss)(y)
    gr = ms.grad(lambda a: loss(fc2(a)))(r)
    g1 = ms.grad(lambda a: loss(fc2(ops.relu(fc1(a)))), grad_position=None, weights=fc1.trainable_params())(x)
    g2 = ms.grad(lambda a: loss(fc2(a)), grad_position=None, weights=fc2.trainable_params())(r)
    n = lambda t: t.asnumpy()  # noqa: E731
    return {
        "fc1.forward": {"in": n(x), "out": n(h), "weight": n(fc1.weight), "bias": n(fc1.bias)},
        "fc2.forward": {"in": n(r), "out": n(y), "weight": n(fc2.weight), "bias": n(fc2.bias)},
        "fc2.backward": {"in": n(gy), "out": n(gr)},
        "fc1.grad": {"weight": n(g1[0]), "bias": n(g1[1])},
        "fc2.grad": {"weight": n(g2[0]), "bias": n(g2[1])},
    }


def write_dump(root, tensors, task: str, summary_mode: str = "statistics", label: str = "rank0",
               long_names: bool = False) -> dict:
    """Write one step in msProbe's L0 shape with the real DumpWriter; return the entries."""
    w = DumpWriter(root, task, "L0", summary_mode)

    def leaf(arr: np.ndarray, data_name: str) -> dict:
        d = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": list(arr.shape),
             "Max": float(arr.max()), "Min": float(arr.min()), "Mean": float(arr.mean()),
             "Norm": float(np.linalg.norm(arr))}
        if summary_mode == "md5":
            d["md5"] = f"{zlib.crc32(np.ascontiguousarray(arr).tobytes()):08x}"
        if task == "tensor":
            d["data_name"] = w.write_tensor(0, label, data_name + ".npy", arr)
        return d

    p = LONG_PREFIX if long_names else "Cell."
    fc1, fc2 = f"{p}fc1.Dense", "Cell.fc2.Dense"
    t = tensors
    entries = {}
    for cell, key in ((fc1, "fc1"), (fc2, "fc2")):
        fwd = f"{cell}.forward.0"
        f = t[f"{key}.forward"]
        entries[fwd] = {
            "input_args": [leaf(f["in"], f"{fwd}.input.0")], "input_kwargs": {},
            "output": [leaf(f["out"], f"{fwd}.output.0")],
            "parameters": {pn: leaf(f[pn], f"{fwd}.parameters.{pn}") for pn in ("weight", "bias")},
        }
    bwd = f"{fc2}.backward.0"
    entries[bwd] = {"input": [leaf(t["fc2.backward"]["in"], f"{bwd}.input.0")],
                    "output": [leaf(t["fc2.backward"]["out"], f"{bwd}.output.0")]}
    for cell, key in ((fc2, "fc2"), (fc1, "fc1")):
        pg = f"{cell}.parameters_grad.0"
        entries[pg] = {pn: [leaf(t[f"{key}.grad"][pn], f"{pg}.{pn}")] for pn in ("weight", "bias")}
    w.emit(StepOutput(StepBatch.empty("job", 0, 0), label, entries=entries,
                      stacks={name: STACK for name in entries},
                      construct={name: None for name in entries}))
    assert w.errors == 0
    return entries


@pytest.fixture(scope="module")
def tensors():
    return {"npu": mlp_tensors(perturb=0.5), "bench": mlp_tensors(perturb=0.0)}


def close(a, b) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)


def by_name(rows):
    out = {r["NPU Name"]: r for r in rows}
    assert len(out) == len(rows), "duplicate row names"
    return out


def unchanged(npu: dict, bench: dict) -> set[str]:
    return {k for k in npu if all(npu[k][s] == bench[k][s] for s in ("Max", "Min", "Mean", "Norm"))}


def test_statistics_dumps_compare_row_for_row(tmp_path, tensors):
    npu = write_dump(tmp_path / "npu", tensors["npu"], "statistics")
    bench = write_dump(tmp_path / "bench", tensors["bench"], "statistics")
    result = run_msprobe_compare(tmp_path / "npu" / "step0" / "rank0", tmp_path / "bench", tmp_path / "out")
    rows = by_name(read_compare_result(result))
    exp_npu, exp_bench = expected_rows(npu), expected_rows(bench)
    assert set(rows) == set(exp_npu) and len(rows) == 14
    for name, row in rows.items():
        n, b = exp_npu[name], exp_bench[name]
        assert row["Bench Name"] == name
        assert row["NPU Dtype"] == n["dtype"] and row["NPU Tensor Shape"] == str(n["shape"])
        for stat, col in (("Max", "max"), ("Min", "min"), ("Mean", "mean"), ("Norm", "l2norm")):
            assert close(row[f"NPU {col}"], n[stat]), (name, stat)
            assert close(row[f"Bench {col}"], b[stat]), (name, stat)
        assert close(row["Max diff"], n["Max"] - b["Max"])
        assert close(row["L2norm diff"], n["Norm"] - b["Norm"])
    same = unchanged(exp_npu, exp_bench)
    # fc1's forward is upstream of the perturbed fc2 weight: identical and passing; the
    # rest differs and msProbe reports a relative error for it.
    assert "Cell.fc1.Dense.forward.0.output.0" in same
    assert "Cell.fc2.Dense.forward.0.output.0" not in same
    rel_cols = ("MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr")
    for name, row in rows.items():
        rel = [float(row[c].rstrip("%")) for c in rel_cols]
        if name in same:
            assert rel == [0.0] * 4 and row["Result"] == "pass", name
        else:
            assert max(rel) > 0, name
    # msProbe puts an entry's stack (from our grouped stack.json) on the entry's first row.
    for entry in npu:
        first = next(r for n, r in rows.items() if n.startswith(entry + "."))
        assert STACK[1] in first["NPU_Stack_Info"], entry


@pytest.fixture(scope="module")
def statistics_step(tmp_path_factory, tensors):
    """One msProbe multi-rank run over a statistics step: rank0 in md5 summary mode,
    rank1 written as proc{pid} and renamed once its rank was known (identical data)."""
    root = tmp_path_factory.mktemp("stats")
    entries = {}
    for side in ("npu", "bench"):
        entries[side, "rank0"] = write_dump(root / side, tensors[side], "statistics", summary_mode="md5")
        entries[side, "rank1"] = write_dump(root / side, tensors["bench"], "statistics", label="proc4242")
        assert DumpWriter(root / side).rename_rank_folder("proc4242", "rank1") == []
    results = run_msprobe_compare_ranks(root / "npu" / "step0", root / "bench" / "step0", root / "out")
    return entries, results


def test_md5_dumps_compare_crc32_per_row(statistics_step):
    entries, results = statistics_step
    rows = by_name(read_compare_result(results["rank0"]))
    exp_npu, exp_bench = expected_rows(entries["npu", "rank0"]), expected_rows(entries["bench", "rank0"])
    assert set(rows) == set(exp_npu)
    for name, row in rows.items():
        assert row["NPU MD5"] == exp_npu[name]["md5"] and row["BENCH MD5"] == exp_bench[name]["md5"]
        equal = exp_npu[name]["md5"] == exp_bench[name]["md5"]
        assert (row["Result"] == "pass") == equal, name
    assert sum(r["Result"] == "pass" for r in rows.values()) not in (0, len(rows))


def test_multi_rank_step_with_renamed_proc_folder(statistics_step):
    entries, results = statistics_step
    assert sorted(results) == ["rank0", "rank1"]
    rows = by_name(read_compare_result(results["rank1"]))
    exp_npu, exp_bench = expected_rows(entries["npu", "rank1"]), expected_rows(entries["bench", "rank1"])
    assert set(rows) == set(exp_npu)
    for name, row in rows.items():
        assert close(row["NPU max"], exp_npu[name]["Max"]) and close(row["Bench max"], exp_bench[name]["Max"])
        assert float(row["Max diff"]) == 0 and row["Result"] == "pass"


# A real training script under rankscope's PrecisionDebugger (the msProbe loop of seeds/001).
_DEBUGGER_RUN = r"""
import sys
import numpy as np
import mindspore as ms
from mindspore import nn, Tensor
from rankscope import PrecisionDebugger, seed_all

seed_all(int(sys.argv[3]))
debugger = PrecisionDebugger(dump_path=sys.argv[1], task=sys.argv[2], level="L0")
net = nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4)])
opt = nn.Adam(net.trainable_params(), 1e-2)
loss_fn = nn.MSELoss()
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
for _ in range(2):
    debugger.start(net)
    x = Tensor(np.random.standard_normal((8, 16)).astype(np.float32))
    y = Tensor(np.random.standard_normal((8, 4)).astype(np.float32))
    loss, grads = grad_fn(x, y)
    opt(grads)
    debugger.stop()
    debugger.step()
assert debugger.hook_errors == 0 and debugger.writer.errors == 0
"""



@pytest.fixture(scope="module")
def tensor_step(tmp_path_factory, tensors):
    """One msProbe multi-rank run over a tensor step: rank0 synthetic with >255-char names,
    rank1 two real training runs (different seeds) under rankscope's PrecisionDebugger."""
    import os
    import subprocess
    import sys
    root = tmp_path_factory.mktemp("tensor")
    entries = {side: write_dump(root / side, tensors[side], "tensor", long_names=True) for side in ("npu", "bench")}
    debugger = importlib.util.find_spec("rankscope.probe.debugger") is not None
    if debugger:
        repo = str(REPO)
        for side, seed in (("npu", "1"), ("bench", "2")):
            subprocess.run([sys.executable, "-c", _DEBUGGER_RUN, str(root / side), "tensor", seed],
                           cwd=repo, check=True, capture_output=True,
                           env={**os.environ, "RANK_ID": "1", "GLOG_v": "3"})
    results = run_msprobe_compare_ranks(root / "npu" / "step0", root / "bench" / "step0", root / "out")
    return root, entries, results, debugger


def check_tensor_rows(rows: dict, expected: dict, ndir, bdir) -> int:
    """Every row is one of our leaves; numbers match our stats and our .npy files."""
    assert set(rows) == set(expected)
    compared = 0
    for name, leaf in expected.items():
        row = rows[name]
        if leaf is None:
            assert row["MaxAbsErr"] == "unsupported"
            continue
        assert row["Data_name"].strip("[]'\" ").split("'")[0] == leaf["data_name"]
        assert close(row["NPU max"], leaf["Max"]) and close(row["NPU l2norm"], leaf["Norm"]), name
        a = np.load(ndir / leaf["data_name"]).astype(np.float64)
        b = np.load(bdir / leaf["data_name"]).astype(np.float64)
        assert close(row["MaxAbsErr"], np.abs(a - b).max()), name
        assert close(row["EucDist"], np.linalg.norm(a - b)), name
        if np.array_equal(a, b):
            assert float(row["Cosine"]) == pytest.approx(1.0) and row["Result"] == "pass", name
        compared += 1
    return compared


def test_tensor_dumps_compare_real_data_including_mapped_long_names(tensor_step):
    root, entries, results, _ = tensor_step
    npu = entries["npu"]
    exp_npu = expected_rows(npu, tensor_names=True)
    mapped = [k for k in exp_npu if k.isdigit()]
    assert mapped and all(len(k) == 32 for k in mapped)  # fc1's names were too long for a file
    assert any(len(k) + 4 > MAX_FILE_NAME for k in expected_rows(npu))
    rows = by_name(read_compare_result(results["rank0"]))
    rdir = ("step0", "rank0", "dump_tensor_data")
    assert check_tensor_rows(rows, exp_npu, root.joinpath("npu", *rdir), root.joinpath("bench", *rdir)) == 14
    # fc1's forward (long, mapped names) is upstream of the change: identical data, read
    # through the mapped file names; its gradients are downstream and differ.
    fc1_fwd = [leaf["data_name"][:-4] for name, leaf in expected_rows(npu).items()
               if name.startswith(LONG_PREFIX + "fc1.Dense.forward.")]
    assert len(fc1_fwd) == 4 and set(fc1_fwd) <= set(mapped)
    assert all(float(rows[k]["MaxAbsErr"]) == 0.0 and rows[k]["Result"] == "pass" for k in fc1_fwd)
    assert any(float(rows[k]["MaxAbsErr"]) > 0 for k in set(mapped) - set(fc1_fwd))
    assert float(rows["Cell.fc2.Dense.forward.0.output.0"]["MaxAbsErr"]) > 0


def test_precision_debugger_tensor_dumps_compare(tensor_step):
    """Real runs under rankscope's PrecisionDebugger (different seeds), compared by msProbe."""
    import json
    root, _, results, debugger = tensor_step
    if not debugger:
        pytest.skip("rankscope.probe.debugger is not in this build")
    assert sorted(results) == ["rank0", "rank1"]
    rows = by_name(read_compare_result(results["rank1"]))
    rdir = ("step0", "rank1")
    entries = json.loads(root.joinpath("npu", *rdir, "dump.json").read_text())["data"]
    expected = expected_rows(entries, tensor_names=True)
    assert any(name.startswith("Cell.0.Dense.forward.0") for name in rows)
    assert any(".parameters_grad." in name for name in rows)
    compared = check_tensor_rows(rows, expected, root.joinpath("npu", *rdir, "dump_tensor_data"),
                                 root.joinpath("bench", *rdir, "dump_tensor_data"))
    assert compared >= 12


def test_debug_level_save_dumps_in_proc_folders_compare(tmp_path):
    """PrecisionDebugger.save at level "debug" goes to debug.json; a single process without
    a rank dumps to proc{pid}. msProbe's step-folder compare handles both."""
    entries = {}
    for side, scale, pid in (("npu", 2.0, 111), ("bench", 1.0, 222)):
        w = DumpWriter(tmp_path / side, "statistics", "debug")
        a = np.arange(6, dtype=np.float32) * scale
        leaf = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [6], "Max": float(a.max()),
                "Min": float(a.min()), "Mean": float(a.mean()), "Norm": float(np.linalg.norm(a))}
        entries[side] = {"act.0.debug": {"data": leaf},
                         "mixed.0.debug": {"data": {"t": leaf, "n": {"type": "int", "value": 3}}}}
        w.emit(StepOutput(StepBatch.empty("job", 0, 0), f"proc{pid}", entries=entries[side],
                          stacks={k: STACK for k in entries[side]}, construct={}))
    results = run_msprobe_compare_ranks(tmp_path / "npu" / "step0", tmp_path / "bench" / "step0", tmp_path / "o")
    assert list(results) == ["proc111"]
    assert results["proc111"].name.startswith("debug_compare_result")
    rows = by_name(read_compare_result(results["proc111"]))
    exp_npu = expected_rows(entries["npu"])
    assert set(rows) == set(exp_npu) == {"act.0.debug.data", "mixed.0.debug.data.t", "mixed.0.debug.data.n"}
    for name in ("act.0.debug.data", "mixed.0.debug.data.t"):
        assert close(rows[name]["NPU max"], exp_npu[name]["Max"]) and close(rows[name]["Bench max"], 5.0)
        assert close(rows[name]["Max diff"], 5.0)
    assert close(rows["mixed.0.debug.data.n"]["NPU max"], 3) and close(rows["mixed.0.debug.data.n"]["Max diff"], 0)


def test_expected_rows_naming():
    leaf = {"type": "mindspore.Tensor", "Max": 1}
    entries = {
        "Functional.add.0.forward": {"input_args": [leaf, [leaf, leaf]], "input_kwargs": {"alpha": leaf},
                                     "output": [leaf]},
        "Cell.a.A.parameters_grad.0": {"weight": [leaf]},
        "Cell.a.A.backward.0": {"input": [leaf], "output": [None]},
    }
    assert list(expected_rows(entries)) == [
        "Functional.add.0.forward.input.0", "Functional.add.0.forward.input.1.0",
        "Functional.add.0.forward.input.1.1", "Functional.add.0.forward.input.alpha",
        "Functional.add.0.forward.output.0", "Cell.a.A.parameters_grad.0.weight", "Cell.a.A.backward.0.input.0",
        "Cell.a.A.backward.0.output.0",
    ]


