"""The position file a rank keeps for its node agent: written by one process, read by another."""
from __future__ import annotations

import subprocess
import sys

from rankscope.wire.layout import position_file
from rankscope.wire.position import (
    NO_TOKEN,
    PositionWriter,
    pack,
    pack_sync,
    position_from_wire,
    read_position,
    read_rank_file,
    unpack,
    unpack_sync,
)
from rankscope.wire.sync import IN, OUT, SyncPoint


def test_pack_round_trips_and_refuses_what_does_not_fit():
    assert unpack(pack(3, 17)) == (3, 17)
    assert unpack(pack(2**31 - 1, 2**32 - 2)) == (2**31 - 1, 2**32 - 2)
    assert unpack(pack(6, NO_TOKEN)) == (6, None)  # a training step begun: no token
    assert unpack(pack(-1, 0)) is None and unpack(pack(0, 2**32)) is None


def test_a_position_written_by_a_process_killed_with_sigkill_is_read_after_it(tmp_path):
    path = tmp_path / "7.pos"
    code = ("import os, signal; from rankscope.wire.position import PositionWriter\n"
            f"w = PositionWriter({str(path)!r}); w.write(1, 4); w.write(2, 9)\n"
            "os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == -9
    assert read_position(str(path)) == {"step": 2, "token": 9}
    assert not path.exists()  # read once, then gone
    assert read_position(str(path)) is None


def test_nothing_written_yet_and_a_clean_close_leave_nothing_to_report(tmp_path):
    w = PositionWriter(str(tmp_path / "a" / "1.pos"))
    assert w.ok
    assert read_position(w.path, remove=False) is None
    w.write(0, 0)
    assert read_position(w.path, remove=False) == {"step": 0, "token": 0}
    w.close()
    assert read_position(w.path) is None


def test_an_unwritable_place_costs_nothing():
    w = PositionWriter("/proc/no/such/place/1.pos")
    assert not w.ok
    w.write(1, 1)
    w.close()


def test_the_wire_form_is_checked():
    assert position_from_wire({"step": 2, "token": 5}) == (2, 5)
    assert position_from_wire({"step": 6, "token": None}) == (6, None)
    for bad in (None, [], {"token": 1}, {"step": None, "token": None}, {"step": -1, "token": 0},
                {"step": True, "token": 1}, {"step": 1, "token": "3"}):
        assert position_from_wire(bad) is None


def test_the_file_is_named_by_job_and_pid():
    assert position_file("job/1", 42).endswith("job_1/42.pos")


def test_the_jobs_folder_goes_with_its_last_file(tmp_path):
    a, b = PositionWriter(str(tmp_path / "job" / "1.pos")), PositionWriter(str(tmp_path / "job" / "2.pos"))
    a.write(0, 1)
    assert read_position(a.path) == {"step": 0, "token": 1}
    assert (tmp_path / "job").is_dir()  # rank 2 still keeps its file there
    b.close()
    assert not (tmp_path / "job").exists()


def test_the_newest_sync_point_is_read_after_a_sigkill_with_the_position(tmp_path):
    # Stored at every collective the rank enters or leaves: heartbeats carry it later.
    path = tmp_path / "8.pos"
    code = ("import os, signal\n"
            "from rankscope.probe.comm.sync_tracker import SyncTracker\n"
            "from rankscope.wire.position import PositionWriter\n"
            f"w = PositionWriter({str(path)!r}); t = SyncTracker(clock=lambda: 1234.5); t.file = w\n"
            "w.write(6, 2**32 - 1); t.new_step(6); t.enter('AllReduce'); t.leave('AllReduce'); t.enter('AllReduce')\n"
            "os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == -9
    position, sync = read_rank_file(str(path))
    assert position == {"step": 6, "token": None}
    assert SyncPoint.from_wire(sync) == SyncPoint("AllReduce", 6, 1, IN, 1234.5)


def test_sync_words_round_trip_and_what_does_not_fit_is_not_stored():
    for point in (SyncPoint("AllReduce", 0, 0, IN, 1.0), SyncPoint("graph", 2**31 - 1, 2**24 - 1, OUT, 2.5)):
        assert unpack_sync(pack_sync(point), point.at) == point
    assert pack_sync(SyncPoint("Broadcast", 1, 0, IN, 0.0)) == -1  # a kind the word has no code for
    assert pack_sync(SyncPoint("AllReduce", 1, 2**24, IN, 0.0)) == -1
    assert unpack_sync(-1, 0.0) is None


def test_a_file_without_a_sync_point_gives_the_position_alone(tmp_path):
    w = PositionWriter(str(tmp_path / "9.pos"))
    w.write(3, NO_TOKEN)
    assert read_rank_file(w.path, remove=False) == ({"step": 3, "token": None}, None)
    (tmp_path / "old.pos").write_bytes(open(w.path, "rb").read()[:8])  # an 8-byte file: position only
    assert read_rank_file(str(tmp_path / "old.pos")) == ({"step": 3, "token": None}, None)
    w.close()
