"""``rankscope analyze`` on msProbe's static-graph (L2) layout, as ``rankscope collect``
gathers a compiled job's kernel tensors: no dump.json, one .npy per kernel input/output."""
from __future__ import annotations

import numpy as np

from rankscope.coordinator.offline.kernel_rows import read_kernel_step
from rankscope.coordinator.offline.run import Analyzer
from rankscope.coordinator.offline.tree import find_dumps
from rankscope.wire.records import Kind

KERNELS = [  # (op type, scope, io, shape) in execution order
    ("MatMul", "Default_network-Dense_MatMul-op0", "input", (8, 12)),
    ("MatMul", "Default_network-Dense_MatMul-op0", "output", (8, 16)),
    ("ReLU", "Default_network-ReLU-op1", "output", (8, 16)),
    ("MatMul", "Gradients_Default_network-gradMatMul-op7", "output", (16, 12)),
    ("AllReduce", "Default_network-AllReduce-op9", "input", (16, 12)),
    ("AllReduce", "Default_network-AllReduce-op9", "output", (16, 12)),
]


def write_rank_step(folder, rank, step, nan=False):
    folder.mkdir(parents=True, exist_ok=True)
    shared = np.random.RandomState(step)
    mine = np.random.RandomState(100 * rank + step)
    reduced = shared.randn(16, 12).astype(np.float32)
    for ts, (op, scope, io, shape) in enumerate(KERNELS):
        arr = reduced if op == "AllReduce" and io == "output" else mine.randn(*shape).astype(np.float32)
        if nan and ts == 0:
            arr[1, 2] = np.nan
        if nan and op == "AllReduce" and io == "output":
            arr[0, 0] = np.nan
        np.save(folder / f"{op}.{scope}.0.0.{1000 + ts}.{io}.0.DefaultFormat.Float32.npy", arr)


def collect_tree(root, ranks=4, steps=4, nan_at=None):
    for r in range(ranks):
        for s in range(steps):
            write_rank_step(root / f"rank_{r}" / "20261127101010" / f"step_{s}", r, s,
                            nan=nan_at is not None and (s == nan_at[1] and r == nan_at[0]))
    # The other ranks received the NaN through the AllReduce.
    if nan_at is not None:
        for r in range(ranks):
            folder = root / f"rank_{r}" / "20261127101010" / f"step_{nan_at[1]}"
            out = next(folder.glob("AllReduce.*.output.0.*.npy"))
            arr = np.load(out)
            arr[0, 0] = np.nan
            np.save(out, arr)
    return root


def test_a_kernel_folder_reads_in_execution_order_with_exact_counts(tmp_path):
    folder = tmp_path / "rank_0" / "1" / "step_2"
    write_rank_step(folder, 0, 2, nan=True)
    rs = read_kernel_step(folder)
    assert rs.names[0] == "MatMul.Default_network-Dense_MatMul-op0.0.0.input.0"
    assert rs.names[-1] == "AllReduce.Default_network-AllReduce-op9.0.0.output.0"
    assert rs.kinds[3] == Kind.BACKWARD and rs.kinds[0] == Kind.FORWARD
    assert rs.nan[0] == 1 and rs.numel[0] == 96 and rs.crc[0] >= 0 and rs.level == "L2"


def test_a_collect_tree_names_the_rank_whose_kernel_went_nan_first(tmp_path):
    root = collect_tree(tmp_path / "dumps", nan_at=(1, 2))
    tree = find_dumps([root])
    assert tree.steps == [0, 1, 2, 3] and tree.ranks == [0, 1, 2, 3]
    got = Analyzer(tree, tmp_path / "out", None, jobs=1, say=lambda m: None).run()
    inc = got.incidents[0]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"], inc["tensor"]) == \
        ("nan_origin", 1, 2, "MatMul.Default_network-Dense_MatMul-op0.0.0.input.0")


def test_a_clean_collect_tree_gives_no_incident(tmp_path):
    got = Analyzer(find_dumps([collect_tree(tmp_path / "dumps")]), tmp_path / "out", None, jobs=1,
                   say=lambda m: None).run()
    assert got.incidents == [] and got.replicated == 1  # the AllReduce's output
