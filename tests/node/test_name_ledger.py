"""NameLedger: re-sending name tables to a coordinator that lost them."""
from __future__ import annotations

from rankscope.node.name_ledger import NameLedger
from rankscope.wire import protocol
from rankscope.wire.records import Kind, NameTable, StepBatchBuilder


def _frames(src: str, steps: int):
    b = StepBatchBuilder(NameTable())
    out = []
    for step in range(steps):
        b.add("a", Kind.LOSS, (1.0, 1.0, 1.0, 1.0))
        b.add(f"n{step}", Kind.FORWARD, (1.0, 1.0, 1.0, 1.0))
        batch = b.build("j", 0, step)
        out.append((batch.new_names, protocol.encode(protocol.step_message(batch, src, step))))
    return out


def test_owed_table_is_merged_into_the_next_step_once_and_src_seq_are_kept():
    led = NameLedger()
    frames = _frames("rank:x", 3)
    for names, _ in frames:
        led.note("j|rank:x", names)
    assert led.attach(frames[2][1]) is frames[2][1]  # nothing owed: untouched
    led.owe_all()
    sent = protocol.Decoder().decode(led.attach(frames[1][1]))
    assert sent.body["new_names"] == {0: "a", 1: "n0", 2: "n1", 3: "n2"}
    assert (sent.src, sent.seq, sent.body["step"]) == ("rank:x", 1, 1)
    assert led.attach(frames[2][1]) is frames[2][1]  # paid


def test_retired_tables_are_bounded():
    led = NameLedger()
    for i in range(10):
        led.note(f"j|r{i}", {0: "a"})
        led.retire(f"j|r{i}", keep=3)
    led.owe_all()
    assert led._owed == {"j|r7", "j|r8", "j|r9"}


def test_a_gone_ranks_debt_ends_once_the_replay_is_sent():
    led = NameLedger()
    led.note("j|gone", {0: "a"})
    led.note("j|live", {0: "b"})
    led.retire("j|gone")
    led.owe_all()
    assert led._owed == {"j|gone", "j|live"}  # its frames may be among those replayed
    led.replay_done()
    assert led._owed == {"j|live"}  # a live rank's next step still pays
    led.replay_done(everyone=True)  # its steps go to the ingest shards now, not this way
    assert not led.owed
