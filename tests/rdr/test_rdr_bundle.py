"""write_bundle: layout, sha256 manifest, secrets filtered, nothing overwritten, full disk."""
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from repo_paths import REPO

from rankscope.rdr.bundle import MANIFEST, RdrWriteError, verify_bundle, write_bundle
from rankscope.rdr.flight_recorder import FlightRecorder
from rankscope.rdr.steps_file import load_steps
from rankscope.wire.layout import bundle_dir_name as rank_dir_name
from rankscope.wire.records import Kind, NameTable, StepBatchBuilder, StepOutput


def _recorder(k=4, steps=6, names_per_step=3, nan_at=None):
    names, fr = NameTable(), FlightRecorder(k)
    for s in range(steps):
        b = StepBatchBuilder(names)
        b.add("Sentinel.loss", Kind.LOSS, (2.0 / (s + 1),) * 4, numel=1)
        for i in range(names_per_step):
            val = float("nan") if (s, i) == nan_at else float(s + i)
            b.add(f"Cell.fc{i}.Dense.forward.0.output.0", Kind.FORWARD, (val, 0.0, val / 2, val),
                  nan=int(math.isnan(val)), numel=64, crc=1234 + s)
        fr.emit(StepOutput(batch=b.build("job1", 2, s), rank_label="rank2"))
    return fr


def test_rank_dir_names():
    assert rank_dir_name(3) == rank_dir_name("3") == rank_dir_name("rank3") == "rank_3"
    assert rank_dir_name("proc1234") == "rank_proc1234"
    for bad in ("../x", "a/b", "", -1):
        with pytest.raises(ValueError):
            rank_dir_name(bad)


def test_bundle_files_manifest_and_steps_round_trip(tmp_path):
    fr = _recorder(k=4, steps=6, nan_at=(5, 1))
    try:
        raise RuntimeError("boom at step 5")
    except RuntimeError as exc:
        err = exc
    d = write_bundle(tmp_path, 2, reason="test", steps=fr, exception=err,
                     config={"task": "statistics", "rdr": {"enable": True}}, seeds={"seed": 1234, "mode": False},
                     extra={"rank_map": [{"claimed": 0, "assigned": 2}]})
    assert d == tmp_path / "rank_2" / "rdr"
    man = json.loads((d / MANIFEST).read_text())
    assert man["complete"] is True and man["errors"] == [] and man["on_behalf"] is False
    listed = {f["path"] for f in man["files"]}
    on_disk = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()} - {MANIFEST}
    assert listed == on_disk  # no stray temp/owner files, nothing unlisted
    assert {"flight_recorder_steps.msgpack", "flight_recorder_steps.json", "exception.txt", "thread_stacks.txt",
            "config.json", "seeds.json", "versions.json", "environment.json", "memory.json",
            "rank_map.json"} <= listed
    assert verify_bundle(d) == []
    assert "RuntimeError: boom at step 5" in (d / "exception.txt").read_text()
    assert "test_bundle_files_manifest_and_steps_round_trip" in (d / "thread_stacks.txt").read_text()
    assert json.loads((d / "seeds.json").read_text()) == {"seed": 1234, "mode": False}

    # The ring kept the last 4 steps, and names first sent in evicted steps are still known.
    batches, names = load_steps((d / "flight_recorder_steps.msgpack").read_bytes())
    assert [b.step for b in batches] == [2, 3, 4, 5]
    original = fr.batches()
    for got, want in zip(batches, original):
        for col in ("name_ids", "kinds", "nan_count", "crc32"):
            np.testing.assert_array_equal(getattr(got, col), getattr(want, col))
        np.testing.assert_array_equal(got.stats, want.stats)  # NaN survives exactly
    assert names[int(batches[-1].name_ids[2])] == "Cell.fc1.Dense.forward.0.output.0"
    summary = json.loads((d / "flight_recorder_steps.json").read_text())  # strict JSON: no NaN literals
    last = summary["steps"][-1]
    assert last["first_nonfinite"]["name"] == "Cell.fc1.Dense.forward.0.output.0"
    assert last["loss"]["Sentinel.loss"]["Mean"] == pytest.approx(2.0 / 6)


def test_snapshot_list_keeps_names_of_evicted_steps(tmp_path):
    fr = _recorder(k=2, steps=5)
    d = write_bundle(tmp_path, 2, reason="export", steps=fr.steps())  # a list, as an exporter passes it
    batches, names = load_steps((d / "flight_recorder_steps.msgpack").read_bytes())
    assert [b.step for b in batches] == [3, 4] and not any(b.new_names for b in batches)
    assert names == fr.names() and names[int(batches[0].name_ids[0])] == "Sentinel.loss"


def test_secrets_filtered_from_environment(tmp_path):
    env = {"HOME": "/home/u", "MY_API_KEY": "s3cr3t-key-value", "HF_TOKEN": "tok-value-123",
           "DB_PASSWORD": "pw-value-xyz", "aws_secret_access_key": "lower-case-secret", "RANK_ID": "2"}
    d = write_bundle(tmp_path, 2, reason="test", steps=(), env=env)
    doc = json.loads((d / "environment.json").read_text())
    assert doc["variables"]["HOME"] == "/home/u" and doc["variables"]["RANK_ID"] == "2"
    assert set(doc["filtered"]) == {"MY_API_KEY", "HF_TOKEN", "DB_PASSWORD", "aws_secret_access_key"}
    every_byte = b"".join(p.read_bytes() for p in d.rglob("*") if p.is_file())
    for secret in (b"s3cr3t-key-value", b"tok-value-123", b"pw-value-xyz", b"lower-case-secret"):
        assert secret not in every_byte


def test_nothing_overwritten_and_on_behalf_leaves_out_process_state(tmp_path):
    first = write_bundle(tmp_path, "rank5", reason="first", steps=_recorder())
    second = write_bundle(tmp_path, 5, reason="rank lost", steps=_recorder(), on_behalf=True,
                          extra={"rank_lost": {"pid": 1, "last_step": 5}})
    assert first.name == "rdr" and second.name == "rdr.1"
    assert json.loads((first / MANIFEST).read_text())["reason"] == "first"
    man = json.loads((second / MANIFEST).read_text())
    assert man["on_behalf"] is True and man["complete"] is True
    names = {f["path"] for f in man["files"]}
    assert "rank_lost.json" in names
    assert not names & {"thread_stacks.txt", "environment.json", "memory.json"}


def test_graph_ir_files_copied_when_save_graphs_set(tmp_path):
    graphs = tmp_path / "graphs_out"
    (graphs / "rank_0").mkdir(parents=True)
    (graphs / "rank_0" / "01_validate_0000.ir").write_text("# IR graph\n%1 = Add(%0, %0)\n")
    (graphs / "notes.txt").write_text("not a graph")
    env = {"MS_DEV_SAVE_GRAPHS": "1", "MS_DEV_SAVE_GRAPHS_PATH": str(graphs)}
    d = write_bundle(tmp_path / "rdr_root", 0, reason="test", env=env)
    copied = d / "graphs" / "rank_0" / "01_validate_0000.ir"
    assert copied.read_text().startswith("# IR graph")
    assert not (d / "graphs" / "notes.txt").exists()
    d2 = write_bundle(tmp_path / "rdr_root2", 0, reason="test", env={"MS_DEV_SAVE_GRAPHS_PATH": str(graphs)})
    assert not (d2 / "graphs").exists()


def test_verify_bundle_detects_tampering(tmp_path):
    d = write_bundle(tmp_path, 1, reason="test", steps=_recorder())
    with open(d / "flight_recorder_steps.msgpack", "r+b") as f:
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert verify_bundle(d) == ["flight_recorder_steps.msgpack: sha256 mismatch"]


def test_unwritable_root_is_a_clear_error(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(RdrWriteError) as info:
        write_bundle(not_a_dir, 0, reason="test")
    assert str(not_a_dir) in str(info.value)


FULL_DISK_CHILD = textwrap.dedent("""
    import json, resource, sys
    from rankscope.rdr.bundle import write_bundle
    from rankscope.rdr.flight_recorder import FlightRecorder
    from rankscope.wire.records import Kind, NameTable, StepBatchBuilder
    names, fr = NameTable(), FlightRecorder(8)
    for s in range(8):
        b = StepBatchBuilder(names)
        for i in range(300):
            b.add(f"Cell.layer{i}.Dense.forward.0.output.0", Kind.FORWARD, (1.0, 0.0, 0.5, 1.0))
        fr.emit(b.build("j", 0, s))
    # Every file this process writes is capped: the big ones fail with EFBIG like a full disk.
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        d = write_bundle(sys.argv[1], 0, reason="full disk test", steps=fr, env={"HOME": "/h"})
    except OSError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    else:
        print(json.dumps(str(d)))
""")


def test_full_disk_gives_incomplete_manifest_and_no_half_files(tmp_path):
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_CHILD, str(tmp_path), "8192"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    d = Path(json.loads(proc.stdout.strip().splitlines()[-1]))
    man = json.loads((d / MANIFEST).read_text())
    assert man["complete"] is False
    failed = {e["file"] for e in man["errors"]}
    assert "flight_recorder_steps.msgpack" in failed
    assert all("File too large" in e["error"] and "incomplete" in e["error"] for e in man["errors"])
    assert "INCOMPLETE" in proc.stderr and "flight_recorder_steps.msgpack" in proc.stderr
    on_disk = {p.name for p in d.iterdir()}
    assert not failed & on_disk  # a failed file is absent, never half-written
    assert not [n for n in on_disk if ".tmp-" in n]
    assert "versions.json" in on_disk  # small files still made it
    assert "manifest says incomplete" in verify_bundle(d)


def test_disk_full_even_for_the_final_manifest_raises_and_leaves_it_incomplete(tmp_path):
    # 700 bytes: the first ("writing") manifest fits, the final one listing the errors does not.
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_CHILD, str(tmp_path), "700"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"] == "RdrWriteError" and "incomplete" in result["message"]
    d = tmp_path / "rank_0" / "rdr"
    man = json.loads((d / MANIFEST).read_text())
    assert man["complete"] is False and man["state"] == "writing"
    assert verify_bundle(d)[0] == "manifest says incomplete"
