"""The node agent holds a registration until the coordinator gives its job-wide id, and
reports the host it was told (--host) for ranks on this machine."""
from __future__ import annotations

from rankscope.node.core import NodeCore
from rankscope.node.settings import AgentSettings
from rankscope.wire import protocol
from rankscope.wire.protocol import Message, encode


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def make(tmp_path, wait: float, coordinator: str | None = "tcp://127.0.0.1:1"):
    clock = Clock()
    settings = AgentSettings(listen="ipc:///nowhere", coordinator=coordinator, job="j",
                             bundle_dir=tmp_path / "b", settle_s=0.3, assign_wait_s=wait)
    core = NodeCore(settings, "node1", "agent:node1:1", clock=clock, machine="vm")
    ack = {"what": "ack", "detail": {"high": {}}}
    core.on_coordinator_frame(encode(Message(protocol.STATUS, "j", "coordinator", 0, ack)))
    return core, clock


def register(core, ident: bytes, pid: int, claim: int, host: str = "vm") -> None:
    body = {"host": host, "pid": pid, "claimed_rank": claim}
    core.on_rank_frame(ident, encode(Message(protocol.REGISTER, "j", f"rank:{host}:{pid}", 0, body)))


def assigned(core, pid: int, rank: int, host: str = "node1") -> None:
    body = {"what": "assigned", "detail": {"host": host, "pid": pid, "rank": rank}}
    core.on_coordinator_frame(encode(Message(protocol.STATUS, "j", "coordinator", 1, body)))


def answers(out) -> dict[bytes, dict]:
    return {i: protocol.Decoder().decode(f).body for i, f in out.to_ranks}


def test_the_rank_is_answered_with_the_coordinators_id_and_the_agents_host(tmp_path):
    core, clock = make(tmp_path, wait=1.0)
    register(core, b"a", 11, 0)
    clock.t += 0.31
    core.tick()
    out = core.take()
    assert not out.to_ranks  # held: the coordinator decides first
    up = [protocol.Decoder().decode(f) for f, _ in out.up]
    reg = next(m for m in up if m.type == protocol.REGISTER)
    assert reg.body["host"] == "node1" and reg.body["assigned_rank"] == 0  # proposed, as --host says
    # The agent's own src: another agent proposing id 0 too must not be dropped as a replay.
    assert reg.src == "agent:node1:1"
    assigned(core, 11, 2)
    out = core.take()
    assert answers(out)[b"a"] == {"assigned_rank": 2, "claimed_rank": 0, "remapped": True}
    # Not forwarded twice; the rank map says the job-wide id.
    assert not any(protocol.Decoder().decode(f).type == protocol.REGISTER for f, _ in out.up)
    assert [r["assigned_rank"] for r in core.registry.rank_map("j")] == [2]


def test_without_an_answer_in_time_the_host_id_is_used(tmp_path):
    core, clock = make(tmp_path, wait=1.0)
    register(core, b"a", 11, 0)
    clock.t += 0.31
    core.tick()
    core.take()
    clock.t += 1.0
    core.tick()
    assert answers(core.take())[b"a"]["assigned_rank"] == 0
    assigned(core, 11, 5)  # too late: an id in use is never taken back
    assert not core.take().to_ranks and core.registry.rank_map("j")[0]["assigned_rank"] == 0


def test_no_coordinator_or_no_wait_answers_at_once_and_bad_answers_are_counted(tmp_path):
    for coordinator, wait in ((None, 1.0), ("tcp://127.0.0.1:1", 0.0)):
        core, clock = make(tmp_path, wait=wait, coordinator=coordinator)
        register(core, b"a", 11, 3, host="elsewhere")  # a rank on another machine keeps its host
        clock.t += 0.31
        core.tick()
        assert answers(core.take())[b"a"]["assigned_rank"] == 3
        assert core.registry.rank_map("j")[0]["host"] == "elsewhere"
    assigned(core, -1, 0)
    assert core._updecoder.rejected["bad_assigned"] == 1  # noqa: SLF001


def test_the_coordinators_on_terminate_reaches_the_rank_with_its_id(tmp_path):
    core, clock = make(tmp_path, wait=1.0)
    register(core, b"a", 11, 1)
    clock.t += 0.31
    core.tick()
    core.take()
    body = {"what": "assigned", "detail": {"host": "node1", "pid": 11, "rank": 1,
                                           "settings": {"on_terminate": "exit", "unknown": 1}}}
    core.on_coordinator_frame(encode(Message(protocol.STATUS, "j", "coordinator", 1, body)))
    assert answers(core.take())[b"a"] == {"assigned_rank": 1, "claimed_rank": 1, "remapped": False,
                                          "on_terminate": "exit"}


def test_a_coordinator_that_has_said_nothing_yet_delays_nobody(tmp_path):
    settings = AgentSettings(listen="ipc:///nowhere", coordinator="tcp://127.0.0.1:1", job="j",
                             bundle_dir=tmp_path / "b", settle_s=0.0, assign_wait_s=5.0)
    core = NodeCore(settings, "node1", "agent:node1:1", clock=Clock(), machine="vm")
    register(core, b"a", 11, 0)
    core.tick()
    assert answers(core.take())[b"a"]["assigned_rank"] == 0
