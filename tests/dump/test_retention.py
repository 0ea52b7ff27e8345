"""The local dump stays bounded: the newest steps within a byte and file budget, steps a
msProbe step list names kept, steps on disk at an incident pinned."""
from __future__ import annotations

import numpy as np
import pytest

from rankscope.config.cluster import parse_cluster
from rankscope.config.errors import ConfigError
from rankscope.coordinator.logic.views.coverage import Coverage, dump_text
from rankscope.dump.retention import MAX_PINNED, DumpRetention, RetentionPolicy
from rankscope.dump.writer import DumpWriter
from rankscope.wire import protocol
from rankscope.wire.protocol import Decoder, Message, ProtocolError
from rankscope.wire.records import StepBatch, StepOutput


def test_a_rolling_window_keeps_the_newest_steps():
    r = DumpRetention(RetentionPolicy(keep_steps=3, max_mb=None, max_files=None))
    gone = [s for step in range(10) for s in r.wrote(step, 100, 3)]
    assert gone == list(range(7)) and r.kept() == [7, 8, 9]
    assert (r.bytes, r.files, r.removed, r.removed_through) == (300, 9, 7, 6)
    assert r.report()["why"] == "keeps the newest 3 steps; older steps removed by the rolling window"


def test_byte_and_file_budgets_remove_the_oldest_first_never_the_newest():
    r = DumpRetention(RetentionPolicy(keep_steps=None, max_mb=1.0, max_files=None))
    for step in range(5):
        r.wrote(step, 300_000, 2)
    assert r.kept() == [2, 3, 4] and r.reason == "bytes"
    assert r.wrote(5, 5_000_000, 1) == [2, 3, 4]  # one huge step: only it is left
    assert r.kept() == [5]
    f = DumpRetention(RetentionPolicy(keep_steps=None, max_mb=None, max_files=10))
    assert [s for step in range(6) for s in f.wrote(step, 1, 4)] == [0, 1, 2, 3] and f.reason == "files"


def test_a_step_written_twice_counts_once():
    r = DumpRetention(RetentionPolicy(keep_steps=2, max_mb=None, max_files=None))
    r.wrote(0, 100, 3)
    r.wrote(0, 150, 3)  # stop/start inside one step rewrote its files
    assert (r.bytes, r.files, r.kept()) == (150, 3, [0])


def test_a_step_list_keeps_every_step_it_names():
    r = DumpRetention(RetentionPolicy(keep_steps=2), keep_all=True)
    assert [s for step in range(50) for s in r.wrote(step, 10, 1)] == []
    assert "step list" in r.report()["why"]


def test_steps_on_disk_at_an_incident_stay_pinned_and_pins_are_bounded():
    r = DumpRetention(RetentionPolicy(keep_steps=3, max_mb=None, max_files=None))
    for step in range(5):
        r.wrote(step, 10, 1)
    r.pin()  # an incident exported: steps 2, 3, 4 stay
    for step in range(5, 12):
        r.wrote(step, 10, 1)
    assert r.kept() == [2, 3, 4, 9, 10, 11]
    big = DumpRetention(RetentionPolicy(keep_steps=1, max_mb=None, max_files=None))
    for step in range(MAX_PINNED + 10):
        big.wrote(step, 1, 1)
        big.pin()
    assert len(big.kept()) <= MAX_PINNED + 1


def test_the_writer_removes_what_the_retention_lets_go(tmp_path):
    w = DumpWriter(tmp_path / "dump")
    w.retention = DumpRetention(RetentionPolicy(keep_steps=4, max_mb=None, max_files=None))
    for step in range(12):  # a step's tensors are written while it runs, its dump.json at its end
        w.write_tensor(step, "rank0", "t.npy", np.ones(4, np.float32))
        w.emit(StepOutput(batch=StepBatch.empty("j", 0, step), rank_label="rank0",
                          entries={"Cell.a.forward.0": {"input_args": []}}))
    w.close()  # removals run off the training thread; close waits for them
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["step10", "step11", "step8", "step9"]
    report = w.retention_report()
    assert (report["kept_from"], report["kept_to"], report["removed"]) == (8, 11, 8)
    assert report["files"] == 4 * 4 and report["bytes"] > 0  # dump.json, stack.json, construct.json, one tensor


def test_a_step_written_while_the_writer_closes_is_written_whole(tmp_path):
    """At exit the probe closes the writer while the training thread may still write the
    last step, whose old steps are then let go: they are removed here, and the step is
    on disk, not lost to a closed removal pool."""
    import threading
    w = DumpWriter(tmp_path / "dump")
    w.retention = DumpRetention(RetentionPolicy(keep_steps=2, max_mb=None, max_files=None))

    def step(s: int) -> None:
        w.write_tensor(s, "rank0", "t.npy", np.ones(4, np.float32))
        w.emit(StepOutput(batch=StepBatch.empty("j", 0, s), rank_label="rank0",
                          entries={"Cell.a.forward.0": {"input_args": []}}))

    for s in range(4):
        step(s)
    closing = [threading.Thread(target=w.close) for _ in range(3)]
    for t in closing:
        t.start()
    for s in range(4, 40):
        step(s)
    for t in closing:
        t.join(10)
    w.close()
    assert w.errors == 0
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["step38", "step39"]
    assert (tmp_path / "dump" / "step39" / "rank0" / "dump.json").is_file()


def test_the_retention_settings_are_checked_where_they_are_read():
    c = parse_cluster({"dump_keep_steps": 10, "dump_max_mb": None, "dump_max_files": 500})
    assert (c.dump_keep_steps, c.dump_max_mb, c.dump_max_files) == (10, None, 500)
    for key, val in (("dump_keep_steps", 0), ("dump_max_mb", -1), ("dump_max_files", "x")):
        with pytest.raises(ConfigError, match=f"cluster.{key}"):
            parse_cluster({key: val})


def test_what_each_rank_kept_travels_checked_and_reads_as_one_line():
    detail = {"rank": 2, "kept_from": 96, "kept_to": 195, "kept": 100, "removed": 96, "removed_through": 95,
              "bytes": 10, "files": 300, "why": "keeps the newest 100 steps; older steps removed by the rolling window"}
    frame = protocol.encode(Message(protocol.STATUS, "j", "r", 1, {"what": "dump", "detail": detail}))
    assert Decoder("j").decode_or_raise(frame).body["detail"] == detail
    with pytest.raises(ProtocolError, match="status.dump"):
        Decoder("j").decode_or_raise(protocol.encode(Message(protocol.STATUS, "j", "r", 1, {
            "what": "dump", "detail": {**detail, "removed": "96"}})))
    cov = Coverage()
    for r in range(4):
        cov.local_dump("j", r, {**detail, "rank": r})
    report = cov.report("j", {r: None for r in range(4)})
    assert dump_text(report) == ("local dump: ranks 0-3 keep steps 96-195 on disk, 96 earlier step(s) removed "
                                 "(keeps the newest 100 steps; older steps removed by the rolling window)")
    assert dump_text(Coverage().report("j", {0: None})) == ""
