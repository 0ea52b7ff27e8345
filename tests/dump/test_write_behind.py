"""The local dump written behind the step: in order, on disk before anything reads the
folders (an incident's export, a rank's rename) and at close; a slow disk does not hold
the training thread until the queue is full."""
from __future__ import annotations

import json
import threading
import time

from rankscope.dump import behind
from rankscope.dump.writer import DumpWriter
from rankscope.wire.records import StepBatch, StepOutput


def out_for(step: int, label: str, entries: dict) -> StepOutput:
    return StepOutput(batch=StepBatch.empty("job", 0, step), rank_label=label, entries=entries)


def entry(v: float) -> dict:
    return {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [2], "Max": v, "Min": v, "Mean": v, "Norm": v}


def test_steps_written_behind_are_on_disk_in_order_after_a_flush_and_merge_as_before(tmp_path):
    w = DumpWriter(tmp_path / "dump", level="L0")
    w.write_behind()
    for step in range(5):
        w.emit(out_for(step, "rank0", {f"a.{step}": entry(step)}))
    w.emit(out_for(4, "rank0", {"b.4": entry(9.0)}))  # a second emit for a step adds to it
    w.flush()
    for step in range(4):
        data = json.loads((tmp_path / "dump" / f"step{step}" / "rank0" / "dump.json").read_text())["data"]
        assert list(data) == [f"a.{step}"]
    data = json.loads((tmp_path / "dump" / "step4" / "rank0" / "dump.json").read_text())["data"]
    assert list(data) == ["a.4", "b.4"]
    assert w.steps_written == 6
    w.close()


def test_a_slow_disk_does_not_hold_the_step_and_close_waits_for_every_step(tmp_path, monkeypatch):
    w = DumpWriter(tmp_path / "dump", level="L0")
    w.write_behind()
    gate = threading.Event()
    write = w._emit_now  # noqa: SLF001

    def slow(out):  # a shared file system that takes its time
        gate.wait(5)
        write(out)
    w._behind._write = slow  # noqa: SLF001
    t0 = time.perf_counter()
    for step in range(3):
        w.emit(out_for(step, "rank0", {f"a.{step}": entry(step)}))
    assert time.perf_counter() - t0 < 1.0  # handed over, not written
    assert not (tmp_path / "dump" / "step0").exists()
    gate.set()
    w.close()
    assert all((tmp_path / "dump" / f"step{s}" / "rank0" / "dump.json").is_file() for s in range(3))


def test_a_rank_rename_and_an_incident_pin_see_every_step_already_emitted(tmp_path):
    w = DumpWriter(tmp_path / "dump", level="L0")
    w.write_behind()
    for step in range(3):
        w.emit(out_for(step, "proc77", {f"a.{step}": entry(step)}))
    w.rename_rank_folder("proc77", "rank3")  # drains first: nothing is left behind under proc77
    assert sorted(p.name for p in (tmp_path / "dump").glob("step*/*")) == ["rank3"] * 3
    w.emit(out_for(3, "proc77", {"a.3": entry(3)}))  # queued under the old label: lands under the new
    w.pin_kept()
    assert (tmp_path / "dump" / "step3" / "rank3" / "dump.json").is_file()
    w.close()


def test_the_queue_is_bounded_so_a_stalled_disk_cannot_hold_unbounded_steps():
    seen = []
    gate = threading.Event()
    wb = behind.WriteBehind(lambda item: (gate.wait(5), seen.append(item)), depth=2)
    wb.submit(0)  # taken by the thread, which waits on the gate
    time.sleep(0.05)
    wb.submit(1)
    wb.submit(2)
    blocked = threading.Thread(target=wb.submit, args=(3,))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive()  # the queue is full: the submitter waits, as a synchronous write would
    gate.set()
    blocked.join(5)
    wb.close()
    assert seen == [0, 1, 2, 3]


def test_a_step_handed_over_just_before_the_process_exits_is_on_disk(tmp_path):
    """A zero-code rank is never closed: the exit itself must wait for the queued step
    (its daemon thread would otherwise be stopped mid-write)."""
    import subprocess
    import sys
    script = f"""
import pathlib, time
from rankscope.dump.behind import WriteBehind
def write(i):
    time.sleep(0.5)  # a slow disk
    pathlib.Path({str(tmp_path)!r}, f"step{{i}}.json").write_text("{{}}")
wb = WriteBehind(write)
for i in range(3):
    wb.submit(i)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step0.json", "step1.json", "step2.json"]
