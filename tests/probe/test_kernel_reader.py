"""Reading MindSpore's kernel dump: file names, execution order, the reducer's AllReduce
as gradient sentinels, files deleted once read, and the GPU/Ascend statistic.csv. The
tensor files are written to the layout checked on MindSpore 2.10 CPU (kernel_files);
the real dump is exercised by the GRAPH e2e job."""
from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from repo_paths import REPO

from rankscope.config.cluster import parse_cluster
from rankscope.config.errors import ConfigError
from rankscope.probe.graph import kernel_config
from rankscope.probe.graph.kernel_config import KernelDump
from rankscope.probe.graph.kernel_reader import KernelReader
from rankscope.files.kernel_files import parse_name, read_statistic_csv
from rankscope.wire.records import NO_CRC, Kind

SCOPE = "Default_loss_net-WeightedLoss_net-Tower_l1-Dense_MatMul-op0"
RED = "Default_reducer-DistributedGradReducer_AllReduce-op{}"


def write(it_dir: Path, op_type: str, op: str, io: str, slot: int, arr: np.ndarray, ts: int) -> None:
    it_dir.mkdir(parents=True, exist_ok=True)
    dt = {"float32": "Float32", "bool": "Bool"}[arr.dtype.name]
    np.save(it_dir / f"{op_type}.{op}.0.0.{ts}.{io}.{slot}.DefaultFormat.{dt}.npy", arr)


def order_csv(root: Path, names: list[str]) -> None:
    d = root / "rank_0" / "execution_order"
    d.mkdir(parents=True, exist_ok=True)
    (d / "ms_execution_order_graph_0.csv").write_text(
        "NodeExecutionOrder-FullNameWithScope\n" + "\n".join(n.replace("_", "/", 0) for n in names) + "\n")


def step_files(root: Path, it: int, x: np.ndarray, grads: list[np.ndarray]) -> None:
    d = root / "rank_0" / "rankscope" / "0" / str(it)
    write(d, "MatMul", SCOPE, "input", 0, x, 5)
    write(d, "MatMul", SCOPE, "output", 0, x[:, :2] * 2, 6)
    # MindSpore numbers the reducer's AllReduce kernels last gradient first
    for i, g in enumerate(grads):
        op = RED.format(len(grads) - 1 - i)
        write(d, "AllReduce", op, "input", 0, g, 10 + i)
        write(d, "AllReduce", op, "output", 0, g / 4, 20 + i)


def test_file_names_parse_to_msprobe_l2_record_names():
    t = parse_name(f"MatMul.{SCOPE}.0.0.1795438745652124.input.1.DefaultFormat.Float32.npy")
    assert t.record_name == f"MatMul.{SCOPE}.0.0.input.1" and not t.backward
    assert parse_name("Parameter.weight.0.0.1795438745654443.output.0.DefaultFormat.Float32.npy") is None
    assert parse_name("statistic.csv") is None


def test_a_step_reads_in_execution_order_names_the_gradients_and_leaves_no_files(tmp_path):
    root = tmp_path / "kernels"
    order_csv(root, [RED.format(1), SCOPE, RED.format(0)])  # AllReduce op1 listed before the MatMul
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    x[1, 1] = np.nan
    g_w, g_b = np.ones((2, 3), np.float32), np.full((2,), 3.0, np.float32)
    step_files(root, 0, x, [g_w, g_b])
    reader = KernelReader(KernelDump(root, True, "tensor", "kernels AllReduce+MatMul"), lambda *_: None)
    reader.grad_names = [("l1.weight", (2, 3)), ("l1.bias", (2,))]
    reader.submit()
    rows = reader.collect()
    names = [r.name for r in rows]
    assert names[0] == "Sentinel.grad_local.l1.weight"  # op1 ran first (execution order CSV)
    assert names.index(f"MatMul.{SCOPE}.0.0.input.0") < names.index(f"MatMul.{SCOPE}.0.0.output.0")
    by = {r.name: r for r in rows}
    assert by[f"MatMul.{SCOPE}.0.0.input.0"].stats.nan == 1 and by[f"MatMul.{SCOPE}.0.0.input.0"].kind is Kind.FORWARD
    assert by["Sentinel.grad_local.l1.bias"].stats.max == 3.0
    red = by["Sentinel.grad_reduced.l1.bias"]
    assert red.kind is Kind.GRAD_REDUCED and red.stats.crc != NO_CRC and red.stats.max == 0.75
    assert by["Sentinel.grad_local.l1.weight"].stats.crc == NO_CRC
    reader.idle()  # deletion runs after the rows are handed back
    assert not list((root / "rank_0" / "rankscope" / "0").iterdir())  # read, then deleted
    assert reader.counters.high_water_iterations == 1 and reader.counters.high_water_bytes > 0
    reader.close()


def test_an_allreduce_outside_a_reducer_cell_is_local_in_and_received_out(tmp_path):
    # A reducer called inside an @ms.jit function: its AllReduce kernels keep no Cell scope.
    root, op = tmp_path / "kernels", "Default_AllReduce-op16"
    order_csv(root, [op])
    d = root / "rank_0" / "rankscope" / "0" / "0"
    write(d, "AllReduce", op, "input", 0, np.ones((2, 3), np.float32), 5)
    write(d, "AllReduce", op, "output", 0, np.full((2, 3), 4.0, np.float32), 6)
    reader = KernelReader(KernelDump(root, True, "tensor", "x"), lambda *_: None)
    reader.submit()
    kinds = {r.name.rsplit(".", 2)[1]: r.kind for r in reader.collect()}
    assert kinds == {"input": Kind.FORWARD, "output": Kind.GRAD_REDUCED}
    reader.close()


def test_a_tensor_parallel_allreduce_stays_a_forward_record_read_as_received(tmp_path, monkeypatch):
    """A script that runs collectives in groups of its own (a row-parallel layer's
    AllReduce in tp_0): an AllReduce outside the reducer is that layer's, not gradients."""
    from rankscope.probe.comm import layout_probe
    monkeypatch.setattr(layout_probe, "_collectives", {("AllReduce", "mccl_world_group")})
    root, op = tmp_path / "kernels", "Default_net-TPNet_fc2-RowParallel_AllReduce-op3"
    order_csv(root, [op])
    d = root / "rank_0" / "rankscope" / "0" / "0"
    write(d, "AllReduce", op, "input", 0, np.ones((2, 3), np.float32), 5)
    write(d, "AllReduce", op, "output", 0, np.full((2, 3), 2.0, np.float32), 6)
    reader = KernelReader(KernelDump(root, True, "tensor", "x"), lambda *_: None)
    reader.submit()
    assert {r.kind for r in reader.collect()} == {Kind.FORWARD, Kind.GRAD_REDUCED}  # a world AllReduce: as before
    monkeypatch.setattr(layout_probe, "_collectives", {("AllReduce", "tp_0")})
    write(root / "rank_0" / "rankscope" / "0" / "1", "AllReduce", op, "output", 0, np.full((2, 3), 2.0, np.float32), 8)
    reader.submit()
    assert [r.kind for r in reader.collect()] == [Kind.FORWARD]
    reader.close()


def test_attribute_inputs_are_deleted_unread_and_a_new_execution_order_is_reread(tmp_path):
    root = tmp_path / "kernels"
    order_csv(root, [SCOPE])
    d = root / "rank_0" / "rankscope" / "0" / "0"
    write(d, "MatMul", SCOPE, "input", 0, np.ones((2, 3), np.float32), 5)
    write(d, "MatMul", SCOPE, "input", 2, np.array(False), 6)  # transpose_a, passed as an input
    write(d, "MatMul", SCOPE, "output", 0, np.array(True), 7)  # an output is always read
    reader = KernelReader(KernelDump(root, True, "tensor", "x"), lambda *_: None)
    reader.submit()
    names = [r.name.rsplit(".", 2)[1:] for r in reader.collect()]
    assert names == [["input", "0"], ["output", "0"]]
    reader.idle()
    assert not d.exists() and reader.counters.files == 2
    later = "Default_loss_net-WeightedLoss_net-Tower_l0-Dense_MatMul-op9"
    order_csv(root, [later, SCOPE])  # recompiled: the new order is read, not the cached one
    write(d, "MatMul", SCOPE, "input", 0, np.ones((2, 3), np.float32), 8)
    write(d, "MatMul", later, "input", 0, np.ones((2, 3), np.float32), 9)
    os.utime(root / "rank_0" / "execution_order" / "ms_execution_order_graph_0.csv", ns=(1, 1))
    reader.submit()
    assert [r.name.split(".")[1] for r in reader.collect()] == [later, SCOPE]
    reader.close()


def test_a_folder_listed_while_its_deletion_waited_is_skipped_and_the_new_one_read(tmp_path):
    # The training thread lists the next step's folders while the last read's deletion
    # is still queued on the helper thread: the listing holds a folder that is gone by
    # the time the next read runs.
    import threading
    root = tmp_path / "kernels"
    order_csv(root, [SCOPE])
    x = np.ones((2, 3), np.float32)
    step_files(root, 0, x, [])
    errors = []
    reader = KernelReader(KernelDump(root, True, "tensor", "x"), lambda what, exc: errors.append((what, exc)))
    reader.submit()
    hold = threading.Event()
    reader._pool.submit(hold.wait)  # the deletion of iteration 0 queues behind this
    assert len(reader.collect()) == 2
    step_files(root, 1, x * 3, [])
    reader.submit()  # lists iteration 0 (not deleted yet) and 1
    hold.set()
    rows = reader.collect()
    assert [r.stats.max for r in rows] == [3.0, 6.0] and errors == []
    reader.idle()
    assert not list((root / "rank_0" / "rankscope" / "0").iterdir())
    reader.close()


def test_a_failed_read_is_reported_once_and_the_next_steps_are_read(tmp_path):
    root = tmp_path / "kernels"
    order_csv(root, [SCOPE])
    errors = []
    reader = KernelReader(KernelDump(root, True, "tensor", "x"), lambda what, exc: errors.append(what))
    real, calls = reader._order_of, []

    def fails_once(*a):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("disk went away")
        return real(*a)
    reader._order_of = fails_once
    step_files(root, 0, np.ones((2, 3), np.float32), [])
    reader.submit()
    reader.submit()  # no collect in between: the failure is reported here, not raised
    assert errors == ["reading the kernel dump"]
    assert len(reader.collect()) == 2 and errors == ["reading the kernel dump"]
    reader.close()


def test_a_users_dump_is_read_but_never_deleted(tmp_path):
    root = tmp_path / "theirs"
    order_csv(root, [SCOPE])
    step_files(root, 0, np.ones((2, 3), np.float32), [])
    reader = KernelReader(KernelDump(root, False, "tensor", "every kernel"), lambda *_: None)
    reader.submit()
    assert len(reader.collect()) == 2
    reader.submit()
    assert reader.collect() == []  # the same iteration is not read twice
    assert len(list((root / "rank_0" / "rankscope" / "0" / "0").iterdir())) == 2
    reader.close()


STAT_CSV = """Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,Min Value,Avg Value,Count,NaN Count,Negative Inf Count,Positive Inf Count,L2Norm Value
MatMul,Default/net-Tower/l1-Dense/MatMul-op0,3,0,1700000000001,input,0,48,float32,"(4,3)",2.5,-1.0,0.5,12,0,0,0,4.2
MatMul,Default/net-Tower/l1-Dense/MatMul-op0,3,0,1700000000002,output,0,32,float32,"(4,2)",nan,nan,nan,8,8,0,0,nan
AllReduce,Default/reducer-DistributedGradReducer/AllReduce-op0,4,0,1700000000003,input,0,8,float32,"(2,)",inf,1.0,inf,2,0,0,1,inf
Broken,row
"""


def test_gpu_ascend_statistic_csv_is_read_by_column_name(tmp_path):
    path = tmp_path / "statistic.csv"
    path.write_text(STAT_CSV)
    rows = read_statistic_csv(path)
    assert len(rows) == 3  # the broken row is skipped
    a, b, c = rows
    assert a.tensor.record_name == "MatMul.Default_net-Tower_l1-Dense_MatMul-op0.3.0.input.0"
    assert (a.shape, a.max, a.min, a.mean, a.norm, a.numel, a.nan, a.inf) == ((4, 3), 2.5, -1.0, 0.5, 4.2, 12, 0, 0)
    assert b.nan == 8 and math.isnan(b.max)
    assert c.inf == 1 and c.tensor.io == "input"


def test_statistic_csv_without_count_columns_still_flags_non_finite(tmp_path):
    path = tmp_path / "statistic.csv"
    path.write_text("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,Max Value,"
                    "Min Value,L2Norm Value\nAdd,Default/Add-op1,1,0,5,output,0,8,float32,\"(2,)\",nan,0.0,nan\n")
    (row,) = read_statistic_csv(path)
    assert row.nan == 1 and row.numel == 2 and math.isnan(row.mean)


def test_statistic_csv_rows_flow_through_the_reader(tmp_path):
    root = tmp_path / "k"
    d = root / "rank_0" / "net" / "0" / "0"
    d.mkdir(parents=True)
    (d / "statistic.csv").write_text(STAT_CSV)
    reader = KernelReader(KernelDump(root, True, "statistic", "x"), lambda *_: None)
    reader.grad_names = [("w", (2,))]
    reader.submit()
    by = {r.name: r for r in reader.collect()}
    assert by["Sentinel.grad_local.w"].stats.inf == 1
    reader.close()


def test_our_config_dumps_tensors_on_cpu_and_statistics_elsewhere(tmp_path):
    env: dict = {}
    dump = kernel_config.install(tmp_path, "default", "CPU", env)
    import json
    cfg = json.loads(Path(env["MINDSPORE_DUMP_CONFIG"]).read_text())["common_dump_settings"]
    assert cfg["saved_data"] == "tensor" and cfg["dump_mode"] == 1 and "AllReduce" in cfg["kernels"]
    assert dump.own and Path(cfg["path"]) == dump.root
    env = {}
    kernel_config.install(tmp_path, "all", "Ascend", env)
    cfg = json.loads(Path(env["MINDSPORE_DUMP_CONFIG"]).read_text())["common_dump_settings"]
    assert cfg["saved_data"] == "statistic" and cfg["dump_mode"] == 0
    assert kernel_config.install(tmp_path, "off", "CPU", {}) is None


def test_an_export_folder_mindspore_s_dump_refuses_puts_the_kernel_files_under_temp(tmp_path, monkeypatch):
    """MindSpore fails the script's first compile on a dump path with a '.' or ':' in it
    (a run.v2 export folder, a first.last home): rankscope's scratch goes elsewhere."""
    env: dict = {}
    dump = kernel_config.install(tmp_path / "out.v2" / "local_dump", "default", "CPU", env)
    assert "." not in str(dump.root) and dump.root.parent.name == "rankscope-kernels" and dump.root.is_dir()
    assert dump.root.parent.parent == Path(tempfile.gettempdir())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp.x"))
    with pytest.raises(ValueError, match="letters, digits"):
        kernel_config.install(tmp_path / "a:b", "default", "CPU", {})
    shutil.rmtree(dump.root)


def test_a_users_dump_config_wins(tmp_path):
    user = tmp_path / "mine.json"
    user.write_text('{"common_dump_settings": {"path": "/data/d", "dump_mode": 0, "saved_data": "tensor"}}')
    dump = kernel_config.install(tmp_path, "default", "CPU", {"MINDSPORE_DUMP_CONFIG": str(user)})
    assert dump.root == Path("/data/d") and not dump.own and "files kept" in dump.describe()


@pytest.mark.parametrize("val", ["some", [], ["Default/MatMul-op0"], 3])
def test_graph_kernels_setting_is_checked(val):
    with pytest.raises(ConfigError, match="graph_kernels"):
        parse_cluster({"graph_kernels": val})
    assert parse_cluster({"graph_kernels": ["AllReduce"]}).graph_kernels == ("AllReduce",)


def test_tensor_task_keeps_kernel_files_in_msprobes_static_graph_layout_for_collect(tmp_path):
    from rankscope.client.transfers import dump_files
    from rankscope.wire.layout import graph_step_dir
    dump_path = tmp_path / "dump_path"
    root = dump_path / "kernels_1"
    order_csv(root, [SCOPE])
    step_files(root, 0, np.ones((2, 3), np.float32), [])
    keep = dump_path / graph_step_dir("rank3", "20261123120000", 2)
    reader = KernelReader(KernelDump(root, True, "tensor", "x"), lambda *_: None)
    reader.submit(keep_in=keep)
    assert len(reader.collect()) == 2
    reader.idle()
    assert keep == dump_path / "rank_3" / "20261123120000" / "step_2"
    assert len(list(keep.glob("MatMul.*.npy"))) == 2
    assert not (root / "rank_0" / "rankscope" / "0" / "0").exists()
    got = dump_files(dump_path, "rank3", "2")
    assert sorted(p.name for p in got) == sorted(p.name for p in keep.iterdir())
    assert dump_files(dump_path, "rank3", "3") == [] and dump_files(dump_path, "rank1", None) == []
    reader.close()


@pytest.mark.parametrize("ops", [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2]])
def test_gradient_allreduce_kernels_are_named_by_shape(ops):
    from rankscope.probe.graph.kernel_reader import match_by_shape
    params = [("w1", (4, 3)), ("b1", (4,)), ("w2", (2, 4)), ("b2", (2,))]
    kernels = [(op, params[i][1]) for i, op in enumerate(ops)]
    assert match_by_shape(kernels, params) == ["w1", "b1", "w2", "b2"]


def test_same_shaped_gradients_follow_the_direction_of_the_unique_ones():
    from rankscope.probe.graph.kernel_reader import match_by_shape
    params = [("w1", (8, 8)), ("b1", (8,)), ("w2", (8, 8)), ("b2", (8,)), ("head", (1, 8))]
    # numbered last gradient first, as MindSpore does for a reducer's HyperMap
    kernels = [(4 - i, s) for i, (_, s) in enumerate(params)]
    assert match_by_shape(kernels, params) == ["w1", "b1", "w2", "b2", "head"]
    assert match_by_shape(kernels[:-1], params) is None


@pytest.mark.parametrize("arr", [np.arange(12, dtype=np.float32).reshape(3, 4), np.float32(2.5),
                                 np.array([True, False]), np.zeros((0, 3), np.int64),
                                 np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))])
def test_kernel_tensors_load_exactly_as_numpy_writes_them(tmp_path, arr):
    from rankscope.files.kernel_files import load_npy
    path = tmp_path / "t.npy"
    np.save(path, arr)
    got = load_npy(str(path))
    assert got.dtype == np.asarray(arr).dtype and got.shape == np.asarray(arr).shape
    assert np.array_equal(got, arr)


def test_a_float16_label_on_float32_data_from_mindspores_cpu_dump_is_read_as_written():
    # A real file from MindSpore 2.10's CPU dump of an AMP O2 job (see the folder's README):
    # read as its header says, it held NaN and Inf, and a clean job was stopped for it.
    from rankscope.files.kernel_files import load_npy, parse_name
    [path] = (REPO / "tests" / "data" / "mindspore_cpu_amp_o2").glob("*.npy")
    raw = path.read_bytes()
    assert b"'descr': '<f2'" in raw[:128] and parse_name(path.name).dtype == "Float16"
    got = load_npy(str(path))
    assert got.dtype == np.float32 and got.shape == (8, 1, 3, 3)
    assert np.isfinite(got).all() and 0 < np.abs(got).max() < 1
    as_labelled = np.frombuffer(raw[-got.size * 2:], np.float16)  # what the header claims
    assert not np.isfinite(as_labelled).all()


def test_a_kernel_file_whose_size_fits_no_float_width_is_refused_by_name(tmp_path):
    from rankscope.files.kernel_files import load_npy
    path = tmp_path / "t.npy"
    np.save(path, np.arange(6, dtype=np.int32))
    with open(path, "ab") as fh:
        fh.write(b"\0" * 4)  # one value more than the header's shape
    with pytest.raises(ValueError, match=r"t\.npy: the header says <i4 \(6,\) \(24 bytes\), the file holds 28 bytes"):
        load_npy(str(path))


def test_closing_removes_rankscope_s_own_scratch_folder_and_never_a_user_s(tmp_path):
    for own in (True, False):
        root = tmp_path / f"kernels_{own}"
        order_csv(root, [SCOPE])
        (root / "mindspore_dump_config.json").write_text("{}")
        write(root / "rank_0" / "rankscope" / "0" / "0", "MatMul", SCOPE, "input", 0, np.ones(3, np.float32), 5)
        reader = KernelReader(KernelDump(root, own, "tensor", "x"), lambda *_: None)
        reader.submit()
        reader.collect()
        reader.close()
        assert root.exists() is not own


def test_a_graph_run_twice_before_its_folder_is_read_hands_its_runs_over_in_time_order(tmp_path, monkeypatch):
    """A jit helper every layer calls leaves one file per run under the same name in one
    folder; the folder lists them in no set order, so the runs are put in timestamp order
    and every rank's k-th record of that name is the same run."""
    root = tmp_path / "kernels"
    op = "Default_AllReduce-op1"
    order_csv(root, [op])
    d = root / "rank_0" / "rankscope" / "0" / "0"
    runs = {30: 3.0, 10: 1.0, 20: 2.0}  # timestamp -> what that run received
    for ts, value in runs.items():
        write(d, "AllReduce", op, "input", 0, np.full(4, value, np.float32), ts)
        write(d, "AllReduce", op, "output", 0, np.full(4, value * 4, np.float32), ts + 1)
    listed = os.scandir

    def backwards(path):  # a directory that lists the newest run first
        entries = sorted(listed(path), key=lambda e: e.name, reverse=True)

        class _Listing(list):
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False
        return _Listing(entries)
    monkeypatch.setattr("rankscope.probe.graph.kernel_reader.os.scandir", backwards)
    reader = KernelReader(KernelDump(root, True, "tensor", "kernels AllReduce"), lambda *_: None)
    reader.submit()
    rows = reader.collect()
    outs = [r.stats.max for r in rows if r.name.endswith(".output.0")]
    assert outs == [4.0, 8.0, 12.0]
    assert [r.stats.max for r in rows][:2] == [1.0, 4.0]  # a run's input, then its output
    reader.close()
