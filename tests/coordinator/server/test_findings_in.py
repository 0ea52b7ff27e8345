"""The verdict actor's inbox of shard findings: in each shard's order, whatever thread put
them in, and a push that never comes holds the others back only ``gap_s``."""
from __future__ import annotations

import threading

from rankscope.coordinator.server.findings_in import FindingsInbox


def _f(shard: int, seq: int, epoch: int = 1) -> dict:
    return {"shard": shard, "epoch": epoch, "seq": seq, "judged": {"j/0": seq}}


def test_pushes_put_from_many_threads_come_out_in_each_shards_order() -> None:
    inbox = FindingsInbox()
    pushes = [_f(s, n) for s in range(3) for n in range(200)]
    threads = [threading.Thread(target=lambda part=pushes[i::8]: [inbox.put(d) for d in reversed(part)])
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = inbox.take()
    for s in range(3):
        assert [d["seq"] for d in out if d["shard"] == s] == list(range(200))


def test_a_lost_push_holds_the_later_ones_gap_s_then_they_go_on(caplog) -> None:
    now = [0.0]
    inbox = FindingsInbox(clock=lambda: now[0], gap_s=3.0)
    inbox.put(_f(0, 0))
    inbox.put(_f(0, 2))  # seq 1 is lost
    assert [d["seq"] for d in inbox.take()] == [0]
    now[0] = 2.9
    assert inbox.take() == []
    now[0] = 3.0
    assert [d["seq"] for d in inbox.take()] == [2]
    assert "held behind one that never came" in caplog.text


def test_settle_waits_for_a_push_still_on_its_way() -> None:
    inbox = FindingsInbox()
    inbox.put(_f(1, 1))  # a shard's drain answer, numbered after a push not yet in
    threading.Timer(0.2, inbox.put, (_f(1, 0),)).start()
    assert [d["seq"] for d in inbox.settle(5.0)] == [0, 1]
    inbox.put(_f(1, 3))  # 2 never comes: settle gives up after its timeout
    assert [d["seq"] for d in inbox.settle(0.1)] == [3]
