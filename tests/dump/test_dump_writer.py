"""DumpWriter: msProbe's layout, atomic files, long-name mapping, proc -> rank rename."""
from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from repo_paths import REPO

from rankscope.dump.writer import MAX_FILE_NAME, DumpWriter, group_stacks, mapped_file_name
from rankscope.wire.records import StepBatch, StepOutput


def tensor_entry(arr: np.ndarray, data_name: str | None = None) -> dict:
    d = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": list(arr.shape),
         "Max": float(arr.max()), "Min": float(arr.min()), "Mean": float(arr.mean()),
         "Norm": float(np.linalg.norm(arr))}
    if data_name:
        d["data_name"] = data_name
    return d


def out_for(step: int, label: str, entries: dict, stacks=None, construct=None, selected=True) -> StepOutput:
    return StepOutput(batch=StepBatch.empty("job", 0, step), rank_label=label, entries=entries,
                      stacks=stacks or {}, construct=construct or {}, dump_selected=selected)


def load(path):
    return json.loads(path.read_text())


def no_temp_files(root) -> bool:
    return not [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def test_statistics_layout_and_contents(tmp_path):
    w = DumpWriter(tmp_path / "dump", "statistics", "L0", "statistics")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    entries = {
        "Cell.fc1.Dense.forward.0": {"input_args": [tensor_entry(x)], "input_kwargs": {},
                                     "output": [tensor_entry(x * 2)]},
        "Cell.fc1.Dense.backward.0": {"input": [tensor_entry(x)], "output": [tensor_entry(x)]},
    }
    stacks = {"Cell.fc1.Dense.forward.0": ["File t.py, line 3, in f", "y = fc1(x)"],
              "Cell.fc1.Dense.backward.0": ["File t.py, line 3, in f", "y = fc1(x)"]}
    construct = {"Cell.fc1.Dense.forward.0": None, "Cell.fc1.Dense.backward.0": None}
    w.emit(out_for(3, "rank2", entries, stacks, construct))
    rdir = tmp_path / "dump" / "step3" / "rank2"
    assert sorted(p.name for p in rdir.iterdir()) == ["construct.json", "dump.json", "stack.json"]
    dump = load(rdir / "dump.json")
    assert list(dump) == ["task", "level", "framework", "dump_data_dir", "data"]
    assert dump["task"] == "statistics" and dump["level"] == "L0" and dump["framework"] == "mindspore"
    assert dump["dump_data_dir"] is None
    assert dump["data"] == entries
    assert list(dump["data"]) == list(entries)  # execution order kept
    # msProbe groups names that share a stack: {"0": [[names], stack]}
    assert load(rdir / "stack.json") == {"0": [list(stacks), stacks["Cell.fc1.Dense.forward.0"]]}
    assert load(rdir / "construct.json") == construct
    assert w.errors == 0 and w.steps_written == 1
    assert no_temp_files(tmp_path)


def test_unselected_step_writes_nothing(tmp_path):
    w = DumpWriter(tmp_path, "statistics", "L1")
    w.emit(out_for(0, "rank0", {"a": {}}, selected=False))
    assert list(tmp_path.iterdir()) == []


def test_second_emit_of_a_step_adds_instead_of_replacing(tmp_path):
    w = DumpWriter(tmp_path, "statistics", "L1")
    w.emit(out_for(1, "rank0", {"A.forward.0": {"output": []}}, construct={"A.forward.0": None}))
    w.emit(out_for(1, "rank0", {"B.forward.0": {"output": []}}, construct={"B.forward.0": "A"}))
    rdir = tmp_path / "step1" / "rank0"
    assert list(load(rdir / "dump.json")["data"]) == ["A.forward.0", "B.forward.0"]
    assert load(rdir / "construct.json") == {"A.forward.0": None, "B.forward.0": "A"}


def test_nan_and_numpy_scalars_serialise(tmp_path):
    w = DumpWriter(tmp_path, "statistics", "L1", "md5")
    entry = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [0], "Max": float("nan"),
             "Min": np.float32(-1.5), "Mean": np.float64(float("inf")), "Norm": None,
             "md5": "0000abcd", "nan_count": np.int64(2)}
    w.emit(out_for(0, "rank0", {"X.forward.0": {"output": [entry]}}))
    got = load(tmp_path / "step0" / "rank0" / "dump.json")["data"]["X.forward.0"]["output"][0]
    assert np.isnan(got["Max"]) and got["Min"] == -1.5 and got["Mean"] == float("inf")
    assert got["md5"] == "0000abcd" and got["nan_count"] == 2 and w.errors == 0


@pytest.mark.parametrize("arr", [
    np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32),
    np.array([True, False, True]),
    np.arange(5, dtype=np.int64),
    np.array([1.5, -2.25], dtype=np.float16),
    np.array(3.0, dtype=np.float32),  # 0-d
    np.zeros((0, 4), dtype=np.float32),  # empty
], ids=["f32", "bool", "int64", "f16", "0d", "empty"])
def test_write_tensor_round_trip(tmp_path, arr):
    w = DumpWriter(tmp_path, "tensor", "L0")
    name = w.write_tensor(0, "rank1", "Cell.a.A.forward.0.output.0.npy", arr)
    assert name == "Cell.a.A.forward.0.output.0.npy"
    back = np.load(tmp_path / "step0" / "rank1" / "dump_tensor_data" / name, allow_pickle=False)
    assert back.dtype == arr.dtype and back.shape == arr.shape and np.array_equal(back, arr)


def test_tensor_mode_dump_data_dir_is_absolute_tensor_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = DumpWriter("rel_dump", "tensor", "L0")
    w.emit(out_for(0, "rank0", {}))
    dump = load(tmp_path / "rel_dump" / "step0" / "rank0" / "dump.json")
    assert dump["dump_data_dir"] == str(tmp_path / "rel_dump" / "step0" / "rank0" / "dump_tensor_data")


def test_long_names_are_mapped_and_dump_json_points_at_the_file(tmp_path):
    w = DumpWriter(tmp_path, "tensor", "L0")
    long_name = "Cell." + "very_deep_block." * 20 + "Dense.forward.0.output.0.npy"
    assert len(long_name) > MAX_FILE_NAME
    arr = np.ones((2, 2), np.float32)
    file_name = w.write_tensor(4, "rank0", long_name, arr)
    assert file_name != long_name and len(file_name) == 32 + len(".npy") and file_name[:32].isdigit()
    assert file_name == mapped_file_name(long_name)  # deterministic: seeded runs give equal dumps
    tdir = tmp_path / "step4" / "rank0" / "dump_tensor_data"
    assert np.array_equal(np.load(tdir / file_name), arr)
    with open(tdir / "mapping.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[1:] == [[file_name, long_name]]
    # The producer may keep the original name in data_name: emit rewrites it.
    entry = {"output": [tensor_entry(arr, long_name)]}
    w.emit(out_for(4, "rank0", {long_name[:-len(".output.0.npy")]: entry}))
    data = load(tmp_path / "step4" / "rank0" / "dump.json")["data"]
    assert next(iter(data.values()))["output"][0]["data_name"] == file_name
    # A second long name adds a row, the first stays.
    other = long_name.replace("output", "input")
    w.write_tensor(4, "rank0", other, arr)
    with open(tdir / "mapping.csv", newline="") as fh:
        assert sorted(tuple(r) for r in list(csv.reader(fh))[1:]) == \
            sorted([(file_name, long_name), (mapped_file_name(other), other)])


def test_names_just_under_the_limit_are_written_as_is(tmp_path):
    w = DumpWriter(tmp_path, "tensor", "L0")
    name = "C" * (MAX_FILE_NAME - 4) + ".npy"  # exactly 255 bytes: no mapping, temp name must still fit
    assert w.write_tensor(0, "rank0", name, np.ones(2)) == name
    assert np.array_equal(np.load(tmp_path / "step0" / "rank0" / "dump_tensor_data" / name), np.ones(2))
    assert not (tmp_path / "step0" / "rank0" / "dump_tensor_data" / "mapping.csv").exists()
    assert no_temp_files(tmp_path)


@pytest.mark.parametrize("bad", ["../escape.npy", "a/b.npy", "", ".."])
def test_write_tensor_rejects_path_like_names(tmp_path, bad):
    w = DumpWriter(tmp_path, "tensor", "L0")
    with pytest.raises(ValueError, match="data_name"):
        w.write_tensor(0, "rank0", bad, np.zeros(1))


def test_write_tensor_refuses_object_arrays(tmp_path):
    with pytest.raises(ValueError, match="pickle"):
        DumpWriter(tmp_path, "tensor", "L0").write_tensor(0, "rank0", "x.npy", np.array([{}], dtype=object))


def test_debug_level_writes_debug_json(tmp_path):
    DumpWriter(tmp_path, "statistics", "debug").emit(out_for(0, "rank0", {"loss.0.debug": {}}))
    assert (tmp_path / "step0" / "rank0" / "debug.json").exists()
    assert not (tmp_path / "step0" / "rank0" / "dump.json").exists()


def test_failed_write_is_logged_counted_and_keeps_previous_file(tmp_path):
    w = DumpWriter(tmp_path, "statistics", "L1")
    w.emit(out_for(0, "rank0", {"A.forward.0": {"output": []}}))
    before = (tmp_path / "step0" / "rank0" / "dump.json").read_bytes()
    w.emit(out_for(0, "rank0", {"B.forward.0": {"output": [object()]}}))  # not serialisable
    assert w.errors == 1
    assert (tmp_path / "step0" / "rank0" / "dump.json").read_bytes() == before
    log = (tmp_path / "step0" / "rank0" / "dump_error_info.log").read_text()
    assert "writing step 0 failed" in log and "not JSON serialisable" in log
    assert no_temp_files(tmp_path)


def test_unwritable_dump_path_never_raises(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    w = DumpWriter(blocker, "statistics", "L1")
    w.emit(out_for(0, "rank0", {"A": {}}))  # must not raise into training
    assert w.errors == 1
    w.log_error(0, "rank0", "also fine")  # best effort, silent


def test_log_error_appends_timestamped_lines(tmp_path):
    w = DumpWriter(tmp_path, "statistics", "L1")
    w.log_error(2, "proc9", "hook Cell.a failed: boom")
    w.log_error(2, "proc9", "second")
    lines = (tmp_path / "step2" / "proc9" / "dump_error_info.log").read_text().splitlines()
    assert len(lines) == 2 and lines[0].startswith("[") and lines[0].endswith("hook Cell.a failed: boom")


def test_group_stacks_accepts_both_shapes():
    grouped = group_stacks({"a": ["s1"], "b": ["s2"], "c": ["s1"]})
    assert grouped == {"0": [["a", "c"], ["s1"]], "1": [["b"], ["s2"]]}
    assert group_stacks(grouped) == grouped
    assert group_stacks({}) == {}


# ------------------------------------------------------------------ proc -> rank
def test_rename_moves_every_step_and_redirects_later_writes(tmp_path):
    w = DumpWriter(tmp_path, "tensor", "L0")
    for step in (0, 1):
        w.write_tensor(step, "proc42", "t.npy", np.full(2, step, np.float32))
        w.emit(out_for(step, "proc42", {"A.forward.0": {"output": [tensor_entry(np.ones(1), "t.npy")]}}))
    assert w.rename_rank_folder("proc42", "rank3") == []
    for step in (0, 1):
        assert not (tmp_path / f"step{step}" / "proc42").exists()
        rdir = tmp_path / f"step{step}" / "rank3"
        assert np.array_equal(np.load(rdir / "dump_tensor_data" / "t.npy"), np.full(2, step, np.float32))
        assert load(rdir / "dump.json")["dump_data_dir"] == str(rdir / "dump_tensor_data")
    # Late output still labelled with the old name lands in the new folder, merged.
    w.emit(out_for(1, "proc42", {"B.forward.0": {"output": []}}))
    assert list(load(tmp_path / "step1" / "rank3" / "dump.json")["data"]) == ["A.forward.0", "B.forward.0"]
    assert not (tmp_path / "step1" / "proc42").exists()


def test_rename_never_overwrites_an_existing_rank_folder(tmp_path):
    other = DumpWriter(tmp_path, "tensor", "L0")  # another process already owns rank0
    other.write_tensor(0, "rank0", "shared.npy", np.zeros(1))
    other.emit(out_for(0, "rank0", {"Theirs.forward.0": {}}))
    theirs = (tmp_path / "step0" / "rank0" / "dump.json").read_bytes()

    w = DumpWriter(tmp_path, "tensor", "L0")
    w.write_tensor(0, "proc7", "shared.npy", np.ones(1))
    w.write_tensor(0, "proc7", "mine_only.npy", np.ones(3))
    w.emit(out_for(0, "proc7", {"Mine.forward.0": {}}))
    w.write_tensor(1, "proc7", "x.npy", np.ones(1))  # step1 has no clash: moves whole
    kept = w.rename_rank_folder("proc7", "rank0")

    assert kept == [tmp_path / "step0" / "proc7"]
    # Nothing of theirs was replaced ...
    assert (tmp_path / "step0" / "rank0" / "dump.json").read_bytes() == theirs
    assert np.array_equal(np.load(tmp_path / "step0" / "rank0" / "dump_tensor_data" / "shared.npy"), np.zeros(1))
    # ... nothing of ours was lost: clashing files stay in the proc folder, the rest moved.
    assert load(tmp_path / "step0" / "proc7" / "dump.json")["data"] == {"Mine.forward.0": {}}
    assert np.array_equal(np.load(tmp_path / "step0" / "proc7" / "dump_tensor_data" / "shared.npy"), np.ones(1))
    assert np.array_equal(np.load(tmp_path / "step0" / "rank0" / "dump_tensor_data" / "mine_only.npy"), np.ones(3))
    assert (tmp_path / "step1" / "rank0" / "dump_tensor_data" / "x.npy").exists()
    assert not (tmp_path / "step1" / "proc7").exists()
    note = (tmp_path / "step0" / "rank0" / "dump_error_info.log").read_text()
    assert "proc7" in note and "dump.json" in note


def test_rename_before_anything_written_only_redirects(tmp_path):
    w = DumpWriter(tmp_path / "d", "statistics", "L1")
    assert w.rename_rank_folder("proc1", "rank1") == []
    w.emit(out_for(0, "proc1", {"A": {}}))
    assert (tmp_path / "d" / "step0" / "rank1" / "dump.json").exists()
    assert not (tmp_path / "d" / "step0" / "proc1").exists()


# ------------------------------------------------------------------ atomicity under SIGKILL
_KILL_TARGET = r"""
import sys, numpy as np
from rankscope.dump.writer import DumpWriter
from rankscope.wire.records import StepBatch, StepOutput
w = DumpWriter(sys.argv[1], "statistics", "L0")
entry = {"output": [{"type": "mindspore.Tensor", "Max": 1.0, "Min": 0.0, "Mean": 0.5, "Norm": 2.0}] * 50}
entries = {f"Cell.layer{i}.Dense.forward.0": entry for i in range(400)}
step = 0
while True:
    w.emit(StepOutput(StepBatch.empty("j", 0, 0), "rank0", entries=dict(entries, step={"n": step})))
    if step == 0:
        print("ready", flush=True)  # one whole dump.json exists; now rewriting it in a loop
    step += 1
"""


def test_sigkill_mid_write_never_leaves_a_torn_dump_json(tmp_path):
    """Real fault: SIGKILL a process rewriting a ~1 MB dump.json in a loop, several times."""
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _KILL_TARGET, str(tmp_path)], cwd=REPO,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.05 + 0.13 * attempt)  # land somewhere inside a rewrite; not a timing assertion
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        dump = json.loads((tmp_path / "step0" / "rank0" / "dump.json").read_text())  # whole, parseable
        assert len(dump["data"]) == 401


def test_dump_json_text_one_entry_per_line_and_round_trips():
    from rankscope.dump.writer import dumps_json
    doc = {"task": "statistics", "level": "L0", "framework": "mindspore", "dump_data_dir": None,
           "data": {"A.forward.0": {"output": [{"Max": float("nan"), "name": "é"}]}, "B.backward.0": {}}}
    text = dumps_json(doc)
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert sum(line.startswith('  "A.forward.0": ') for line in lines) == 1
    assert sum(line.startswith('  "B.backward.0": ') for line in lines) == 1
    back = json.loads(text)
    assert list(back) == list(doc) and back["data"]["B.backward.0"] == {}
    assert np.isnan(back["data"]["A.forward.0"]["output"][0]["Max"])
    assert back["data"]["A.forward.0"]["output"][0]["name"] == "é"
    assert json.loads(dumps_json({})) == {} and json.loads(dumps_json({"data": {}})) == {"data": {}}
    with pytest.raises(TypeError, match="not JSON serialisable"):
        dumps_json({"data": {"x": object()}})


def test_error_log_is_capped_per_step_but_everything_is_counted(tmp_path):
    from rankscope.dump.writer import ERROR_LOG_LIMIT
    w = DumpWriter(tmp_path, "statistics", "L1")
    for i in range(ERROR_LOG_LIMIT + 50):
        w.log_error(0, "rank0", f"hook failed #{i}")
    w.log_error(1, "rank0", "next step logs again")
    lines = (tmp_path / "step0" / "rank0" / "dump_error_info.log").read_text().splitlines()
    assert len(lines) == ERROR_LOG_LIMIT + 1
    assert lines[ERROR_LOG_LIMIT - 1].endswith(f"hook failed #{ERROR_LOG_LIMIT - 1}")
    assert "suppressed" in lines[-1]
    assert w.errors_suppressed == 49
    assert (tmp_path / "step1" / "rank0" / "dump_error_info.log").read_text().endswith("next step logs again\n")


def test_rename_twice_follows_the_chain(tmp_path):
    w = DumpWriter(tmp_path, "statistics", "L1")
    w.emit(out_for(0, "proc5", {"A": {}}))
    w.rename_rank_folder("proc5", "rank0")
    w.emit(out_for(1, "proc5", {"B": {}}))  # stale label
    w.rename_rank_folder("rank0", "rank5")  # the node agent remapped the claim
    w.emit(out_for(2, "proc5", {"C": {}}))
    w.emit(out_for(2, "rank0", {"D": {}}))
    assert sorted(p.name for p in tmp_path.glob("step*/*")) == ["rank5", "rank5", "rank5"]
    assert list(load(tmp_path / "step2" / "rank5" / "dump.json")["data"]) == ["C", "D"]
