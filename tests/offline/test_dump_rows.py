"""Reading one msProbe dump.json into rows, and finding the dumps of a tree."""
from __future__ import annotations

import json
import math

import pytest

from rankscope.coordinator.offline.dump_rows import DumpReadError, entry_kind, read_rank_step
from rankscope.coordinator.offline.tree import TreeError, find_dumps
from rankscope.wire.collective_names import parse_collective
from rankscope.wire.records import NO_CRC, Kind


def leaf(mx, mn, mean, norm, shape=(4, 2), **extra):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(shape),
            "Max": mx, "Min": mn, "Mean": mean, "Norm": norm, "requires_grad": True, **extra}


DATA = {
    "Functional.linear.0.forward": {"input_args": [leaf(1, -1, 0, 2), leaf(0.5, -0.5, 0, 1, (2, 4))],
                                    "input_kwargs": {"bias": leaf(0.1, 0, 0.05, 0.1, (2,))},
                                    "output": [leaf(3, -3, 0.1, 5)]},
    "Tensor.view.0.forward": {"input_args": [leaf(3, -3, 0.1, 5), {"type": "int", "value": 8}],
                              "input_kwargs": {}, "output": [leaf(3, -3, 0.1, 5, (8,))]},
    "Distributed.all_reduce.0.forward": {"input_args": [leaf(1, 0, 0.5, 1)], "input_kwargs": {},
                                         "output": [[leaf(4, 0, 2, 4), leaf(1, 1, 1, 1, ())]]},
    "Module.fc.Linear.backward.0": {"input": [leaf(0.2, -0.2, 0, 0.3)], "output": [None]},
    "Cell.fc.Dense.forward.0": {"input_args": [], "output": [],
                                "parameters": {"weight": leaf(0.4, -0.4, 0, 1, (2, 4))}},
    "Module.fc.Linear.parameters_grad.0": {"weight": [leaf(0.1, -0.1, 0, 0.2, (2, 4))],
                                           "bias": [leaf(0.1, -0.1, 0, 0.2, (2,))]},
    "probe.0.debug": leaf(float("nan"), float("nan"), float("nan"), float("nan")),
    "Tensor.add.0.forward": {"input_args": [leaf("inf", -1, "inf", "inf", md5="0000002a")],
                             "input_kwargs": {}, "output": [leaf(True, False, None, None)]},
}


def write_dump(folder, data=DATA, **head):
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, **head, "data": data}
    (folder / "dump.json").write_text(json.dumps(doc))
    return folder


def test_rows_are_named_as_msprobe_compare_names_them_in_file_order(tmp_path):
    rs = read_rank_step(write_dump(tmp_path / "rank0"))
    assert rs.names == [
        "Functional.linear.0.forward.input.0", "Functional.linear.0.forward.input.1",
        "Functional.linear.0.forward.input.bias", "Functional.linear.0.forward.output.0",
        "Tensor.view.0.forward.input.0", "Tensor.view.0.forward.output.0",
        "Distributed.all_reduce.0.forward.input.0", "Distributed.all_reduce.0.forward.output.0.0",
        "Distributed.all_reduce.0.forward.output.0.1",
        "Module.fc.Linear.backward.0.input.0", "Cell.fc.Dense.forward.0.parameters.weight",
        "Module.fc.Linear.parameters_grad.0.weight", "Module.fc.Linear.parameters_grad.0.bias",
        "probe.0.debug", "Tensor.add.0.forward.input.0", "Tensor.add.0.forward.output.0"]
    kinds = dict(zip(rs.names, rs.kinds.tolist()))
    assert kinds["Module.fc.Linear.backward.0.input.0"] == Kind.BACKWARD
    assert kinds["Module.fc.Linear.parameters_grad.0.weight"] == Kind.GRAD_LOCAL
    assert kinds["probe.0.debug"] == Kind.SAVED
    assert kinds["Functional.linear.0.forward.input.1"] == Kind.FORWARD
    # A module's parameters are learned as replicated or not, never taken so by name: the
    # shards of a tensor-parallel weight differ by design.
    assert kinds["Cell.fc.Dense.forward.0.parameters.weight"] == Kind.FORWARD
    assert (rs.framework, rs.task, rs.level) == ("pytorch", "statistics", "mix")
    i = rs.names.index("Functional.linear.0.forward.output.0")
    assert rs.stats[i].tolist() == [3, -3, 0.1, 5] and rs.numel[i] == 8 and rs.crc[i] == NO_CRC


def test_non_finite_statistics_count_as_at_least_one_and_md5_is_not_compared(tmp_path):
    rs = read_rank_step(write_dump(tmp_path / "rank0"))
    at = {n: i for i, n in enumerate(rs.names)}
    nan_row, inf_row, ok_row = at["probe.0.debug"], at["Tensor.add.0.forward.input.0"], at["Tensor.view.0.forward.input.0"]
    assert (rs.nan[nan_row], rs.inf[nan_row]) == (1, 0)
    assert (rs.nan[inf_row], rs.inf[inf_row]) == (0, 1) and math.isinf(rs.stats[inf_row, 0])
    assert (rs.nan[ok_row], rs.inf[ok_row]) == (0, 0)
    assert rs.crc[inf_row] == NO_CRC  # gloo's all_reduce is not bit-identical across ranks: stats compare
    bools = at["Tensor.add.0.forward.output.0"]  # a bool tensor: no Mean, no Norm, not a NaN
    assert rs.nan[bools] == 0 and rs.stats[bools, 0] == 1.0


@pytest.mark.parametrize("content, words", [
    ('{"task": "statistics", "data": {"Functional.relu.0.forward": {"input_args": [{"Max"', "truncated"),
    ('[1, 2]', "not an msProbe dump.json"),
    (b"\xff\xfe\x00", "truncated"),
])
def test_a_damaged_dump_json_is_an_error_that_names_the_file_and_the_fault(tmp_path, content, words):
    (tmp_path / "rank1").mkdir()
    path = tmp_path / "rank1" / "dump.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DumpReadError, match=words) as err:
        read_rank_step(tmp_path / "rank1")
    assert str(path) in str(err.value)
    with pytest.raises(DumpReadError, match="no dump.json"):
        read_rank_step(tmp_path / "nowhere")


def test_kinds_of_rankscope_sentinels_and_graph_kernels():
    assert entry_kind("Sentinel.grad_reduced.fc1.weight") == Kind.GRAD_REDUCED
    assert entry_kind("Sentinel.param.fc1.weight") == Kind.PARAM
    assert entry_kind("MatMul.Gradients-Default-network-MatMul-op12") == Kind.BACKWARD
    assert entry_kind("Cell.fc1.Dense.forward.0") == Kind.FORWARD


def test_msprobe_communication_rows_are_collective_calls():
    io = parse_collective("MintDistributed.all_reduce.3.forward.output.0")
    assert (io.call, io.io, io.op, io.group) == ("MintDistributed.all_reduce.3.forward", "output", "AllReduce", None)
    assert parse_collective("Distributed.all_gather_into_tensor.0.forward.input.1").op == "AllGather"
    assert parse_collective("Distributed.barrier.0.forward.input.0") is None
    assert parse_collective("Distributed.all_reduce.0.backward.input.0") is None


def test_the_tree_is_found_from_a_dump_path_a_step_or_a_rank_folder(tmp_path):
    for step in (0, 1):
        for rank in (0, 1, 2):
            write_dump(tmp_path / "dump" / f"step{step}" / f"rank{rank}")
    (tmp_path / "dump" / "step1" / "rank2" / "dump.json").unlink()  # a rank folder left empty
    tree = find_dumps([tmp_path / "dump"])
    assert tree.steps == [0, 1] and tree.ranks == [0, 1, 2]
    assert tree.where[1][2] == tmp_path / "dump" / "step1" / "rank2"  # kept: reading it says what is missing
    assert find_dumps([tmp_path / "dump" / "step1"]).where.keys() == {1}
    assert find_dumps([tmp_path / "dump" / "step0" / "rank1"]).where == {0: {1: tmp_path / "dump" / "step0" / "rank1"}}


def test_two_nodes_trees_merge_and_process_folders_get_numbers(tmp_path):
    write_dump(tmp_path / "node0" / "step0" / "rank0")
    write_dump(tmp_path / "node1" / "step0" / "rank1")
    write_dump(tmp_path / "node1" / "step0" / "rank0")  # the same rank twice: said, the first kept
    write_dump(tmp_path / "node1" / "step0" / "proc4242")
    tree = find_dumps([tmp_path / "node0", tmp_path / "node1"])
    assert tree.where[0][0] == tmp_path / "node0" / "step0" / "rank0"
    assert tree.where[0][2] == tmp_path / "node1" / "step0" / "proc4242"
    assert any("two places" in n for n in tree.notes) and any("proc4242 as rank 2" in n for n in tree.notes)


def test_a_path_with_no_dump_is_refused_by_name(tmp_path):
    with pytest.raises(TreeError, match="no such file"):
        find_dumps([tmp_path / "absent"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(TreeError, match=r"empty: no msProbe dump here"):
        find_dumps([tmp_path / "empty"])
