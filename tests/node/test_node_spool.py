"""The spool log (bounded, ordered, rewindable) and the uplink's confirm/rewind logic."""
from __future__ import annotations

import logging
import time

import pytest
import zmq

from rankscope.node.spool import SpoolLog
from rankscope.node.uplink import Uplink
from rankscope.wire import protocol
from rankscope.wire.protocol import Message
from rankscope.wire.transport import bind_router

pytestmark = pytest.mark.timeout(60)


def _drain(spool: SpoolLog) -> list[bytes]:
    out = []
    while (item := spool.peek()) is not None:
        after, frame = item
        spool.advance(after)
        out.append(frame)
    return out


def test_order_segments_rewind_and_confirm(tmp_path):
    spool = SpoolLog(tmp_path, max_bytes=1 << 20, segment_bytes=100, cache_bytes=0)  # no cache: read disk
    frames = [f"frame-{i:03d}".encode() * 3 for i in range(20)]
    positions = [spool.append(f) for f in frames]
    assert all(p is not None for p in positions)
    assert len(list(tmp_path.glob("seg-*.spool"))) > 3  # rotated
    assert _drain(spool)[:20] == frames
    spool.rewind()  # nothing confirmed: everything goes again, in order
    assert _drain(spool) == frames
    spool.confirm(positions[10])  # frames 0..9 are safe
    spool.rewind()
    assert _drain(spool) == frames[10:]
    segs = sorted(tmp_path.glob("seg-*.spool"))
    assert segs[0].name != "seg-0000000000.spool"  # confirmed segments are deleted


def test_full_spool_drops_new_frames_with_one_warning(tmp_path, caplog):
    spool = SpoolLog(tmp_path, max_bytes=1000, segment_bytes=500)
    caplog.set_level(logging.WARNING)
    kept = sum(spool.append(b"x" * 96) is not None for _ in range(20))
    assert kept == 10 and spool.dropped == 10
    warnings = [r.message for r in caplog.records if "is full" in r.message]
    assert len(warnings) == 1 and "dropping new records" in warnings[0]
    assert _drain(spool) == [b"x" * 96] * 10


def test_leftover_segments_are_replayed_after_restart(tmp_path):
    a = SpoolLog(tmp_path, segment_bytes=64)
    for i in range(10):
        a.append(b"old%d" % i)
    a.close()
    b = SpoolLog(tmp_path, segment_bytes=64)
    b.append(b"new")
    assert _drain(b) == [b"old%d" % i for i in range(10)] + [b"new"]


def test_rejects_limit_smaller_than_a_segment(tmp_path):
    with pytest.raises(ValueError, match="max_bytes"):
        SpoolLog(tmp_path, max_bytes=10, segment_bytes=100)


def _frame(seq: int) -> bytes:
    return protocol.encode(Message(protocol.STATUS, "j", "r", seq, {"what": "x", "detail": {"i": seq}}))


def _wait(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_uplink_acks_trim_and_a_drop_rewinds(tmp_path):
    ctx = zmq.Context()
    try:
        router, ep = bind_router(ctx, "tcp://127.0.0.1:0")
        up = Uplink(ctx, ep, b"agent:test", SpoolLog(tmp_path / "s", segment_bytes=256),
                    replay_window_s=3600.0)  # never confirm by age here
        assert _wait(lambda: up.poll_link() == [True] or up.connected)
        for seq in range(10):
            up.send(_frame(seq), ("j|r", seq))
        got = []
        assert _wait(lambda: (router.poll(10) and got.append(router.recv_multipart())) or len(got) == 10)
        up.on_ack({"j|r": 4})  # the coordinator has 0..4
        assert up.spool.confirmed > (0, 0)
        # The coordinator dies with 5..9 unread (in a real one: in its socket buffers).
        router.close(0)
        assert _wait(lambda: (up.poll_link() or True) and not up.connected)
        router, _ = bind_router(ctx, ep)
        assert _wait(lambda: (up.poll_link() or True) and up.connected)
        up.pump()
        replayed = []
        assert _wait(lambda: (router.poll(10) and replayed.append(router.recv_multipart())) or len(replayed) == 5)
        seqs = [protocol.Decoder().decode(f).seq for _, f in replayed]
        assert seqs == [5, 6, 7, 8, 9]
        up.close()
        router.close(0)
    finally:
        ctx.destroy(linger=0)


def test_second_agent_on_the_same_spool_is_refused(tmp_path):
    from rankscope.node.spool import SpoolBusy

    first = SpoolLog(tmp_path)
    with pytest.raises(SpoolBusy, match="in use by another node agent"):
        SpoolLog(tmp_path)
    first.close()
    SpoolLog(tmp_path).close()  # free again once the first is gone
