"""NodeCore, the node agent's decisions, driven with encoded frames and a scripted clock:
no sockets, no processes (the daemon's loop is tested with real ones in test_node_agent)."""
from __future__ import annotations

import signal

import numpy as np

from rankscope.node.core import EXIT_GRACE_S, NodeCore
from rankscope.node.liveness import ProcStat
from rankscope.node.settings import AgentSettings
from rankscope.wire import protocol
from rankscope.wire.protocol import Message, encode
from rankscope.wire.records import Kind, NameTable, StepBatchBuilder


class World:
    """A scripted clock and /proc: pids are alive until ``kill`` makes them zombies."""

    def __init__(self) -> None:
        self.t = 100.0
        self.dead: dict[int, int] = {}  # pid -> raw wait status
        self.gone: set[int] = set()
        self.signals: list[tuple[int, int]] = []  # what the agent sent, (pid, signal)

    def clock(self) -> float:
        return self.t

    def read(self, pid: int) -> ProcStat | None:
        if pid in self.gone:
            return None
        if pid in self.dead:
            return ProcStat("Z", 7, self.dead[pid])
        return ProcStat("S", 7, None)

    def kill(self, pid: int, sig: int) -> None:
        self.dead[pid] = sig  # waitpid status of a process killed by ``sig``

    def reaped(self, pid: int) -> None:
        self.gone.add(pid)  # its parent collected it: no exit status left to read


def make(tmp_path, **kw):
    world = World()
    settings = AgentSettings(listen="ipc:///nowhere", coordinator="tcp://127.0.0.1:1", job="j",
                             bundle_dir=tmp_path / "bundles", settle_s=0.3, heartbeat_timeout_s=5.0, **kw)
    core = NodeCore(settings, "h", "agent:h:1", clock=world.clock, read_proc=world.read,
                    send_signal=lambda pid, sig: world.signals.append((pid, sig)))
    return core, world


def register(core, ident: bytes, pid: int, claim: int | None, seq: int = 0, **extra) -> None:
    body = {"host": "h", "pid": pid, "claimed_rank": claim, **extra}
    core.on_rank_frame(ident, encode(Message(protocol.REGISTER, "j", f"rank:h:{pid}", seq, body)))


def up_messages(out) -> list[Message]:
    dec = protocol.Decoder()
    return [dec.decode(f) for f, _ in out.up]


def step_frame(pid: int, rank: int, step: int, seq: int, names: NameTable) -> bytes:
    b = StepBatchBuilder(names)
    b.add("Sentinel.loss", Kind.LOSS, (1.0, 1.0, 1.0, 1.0), numel=1)
    return encode(protocol.step_message(b.build("j", rank, step), f"rank:h:{pid}", seq))


def test_clashing_claims_wait_for_the_settle_window_then_get_distinct_ids(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, dp_index=1)
    register(core, b"b", 12, 0, dp_index=0)
    core.tick()
    assert not core.take().to_ranks  # nobody answered inside the settle window
    world.t += 0.31
    core.tick()
    out = core.take()
    answers = {ident: protocol.Decoder().decode(f).body for ident, f in out.to_ranks}
    # Ordered by what they report (dp_index), not by who registered first.
    assert answers[b"b"]["assigned_rank"] == 0 and answers[b"a"]["assigned_rank"] == 1
    assert answers[b"a"]["remapped"] and not answers[b"b"]["remapped"]
    ups = up_messages(out)
    regs = {m.body["pid"]: m.body["assigned_rank"] for m in ups if m.type == protocol.REGISTER}
    assert regs == {12: 0, 11: 1}
    assert any(m.type == protocol.RANK_MAP for m in ups)
    assert (tmp_path / "bundles" / "j" / "rank_map.json").is_file()


def test_steps_are_forwarded_byte_for_byte_and_kept_for_bundles(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 3, world_size=1)
    core.tick()  # complete world: answered at once
    core.take()
    frame = step_frame(11, 3, 0, 1, NameTable())
    core.on_rank_frame(b"a", frame)
    out = core.take()
    assert out.up == [(frame, ("j|rank:h:11", 1))]
    entry = core.registry.by_identity(b"a")
    assert entry.last_step == 0 and len(core.bundles.recorder(entry).steps()) == 1


def test_a_killed_rank_is_lost_after_the_grace_with_its_signal_and_a_bundle(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=1)
    core.tick()
    names = NameTable()
    for s in range(3):
        core.on_rank_frame(b"a", step_frame(11, 0, s, s + 1, names))
    core.take()
    world.kill(11, signal.SIGKILL)
    world.t += 0.25
    core.tick()
    assert not [m for m in up_messages(core.take()) if m.type == protocol.RANK_LOST]  # still in its grace
    world.t += EXIT_GRACE_S + 0.01
    core.tick()
    lost = [m for m in up_messages(core.take()) if m.type == protocol.RANK_LOST]
    assert [(m.body["rank"], m.body["exit_status"], m.body["last_step"]) for m in lost] == [(0, -signal.SIGKILL, 2)]
    bundle = tmp_path / "bundles" / "j" / "rank_0" / "rdr"
    assert (bundle / "manifest.json").is_file() and (bundle / "rank_lost.json").is_file()


def test_a_silent_rank_is_reported_unresponsive(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=1)
    core.tick()
    core.take()
    world.t += 5.5
    core.tick()
    lost = [m for m in up_messages(core.take()) if m.type == protocol.RANK_LOST]
    assert len(lost) == 1 and lost[0].body["reason"].startswith("unresponsive")


def test_pause_reaches_live_ranks_and_a_late_joiner_hears_it_after_its_id(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=2)
    world.t += 0.31
    core.tick()
    core.take()
    pause = encode(Message(protocol.CONTROL, "j", "coordinator", 5, {"command": "pause", "incident": "i1"}))
    core.on_coordinator_frame(pause)
    assert core.take().to_ranks == [(b"a", pause)]
    register(core, b"b", 12, 1, world_size=2)
    core.tick()  # the world is complete now: answered without waiting
    to_b = [protocol.Decoder().decode(f) for ident, f in core.take().to_ranks if ident == b"b"]
    assert [m.type for m in to_b] == [protocol.REGISTERED, protocol.CONTROL]
    assert to_b[1].body["command"] == "pause"


def test_export_of_a_lost_rank_is_answered_from_the_agent_flight_recorder(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=1)
    core.tick()
    core.on_rank_frame(b"a", step_frame(11, 0, 0, 1, NameTable()))
    world.kill(11, signal.SIGSEGV)
    for _ in range(2):  # seen dead, then lost once its grace is over
        world.t += EXIT_GRACE_S + 0.01
        core.tick()
    assert core.registry.by_rank("j", 0)[0].exit_status == -signal.SIGSEGV
    core.take()
    export = encode(Message(protocol.CONTROL, "j", "coordinator", 6,
                            {"command": "export", "incident": "i1", "args": {"transfer": "i1"}}))
    core.on_coordinator_frame(export)
    chunks = [m for m in up_messages(core.take()) if m.type == protocol.BUNDLE_CHUNK]
    assert chunks and {m.body["rank"] for m in chunks} == {0}
    assert all(m.body["on_behalf"] and m.body["transfer"] == "i1" for m in chunks)
    assert any(m.body["path"].endswith("manifest.json") and m.body["final"] for m in chunks)


def test_a_clean_goodbye_waits_for_the_exit_and_an_uncaught_exception_is_a_loss_at_once(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=2)
    register(core, b"b", 12, 1, world_size=2)
    core.tick()
    core.take()
    bye = lambda pid, ok, seq: encode(Message(protocol.STATUS, "j", f"rank:h:{pid}", seq, {  # noqa: E731
        "what": "bye", "detail": {"ok": ok, "error": "" if ok else "ValueError('boom')", "step": 4}}))
    raised_at = core.wall()
    core.on_rank_frame(b"a", bye(11, True, 9))
    core.on_rank_frame(b"b", bye(12, False, 9))
    assert not [m for m in up_messages(core.take()) if m.type in (protocol.RANK_LOST, protocol.STATUS)]
    # The raising rank's process lingers (its threads, the runtime's teardown): it is
    # lost after the grace anyway, dated when it said so. The clean one waits for its exit.
    world.t += EXIT_GRACE_S + 0.01
    core.tick()
    lost = [m.body for m in up_messages(core.take()) if m.type == protocol.RANK_LOST]
    assert [(b["rank"], b["reason"], b["exit_status"], b["exception"]) for b in lost] == \
        [(1, "raised: ValueError('boom')", None, "ValueError('boom')")]
    assert abs(lost[0]["died_at"] - raised_at) < 1.0
    world.kill(11, 0)
    world.kill(12, 1 << 8)  # its exit, later, changes nothing
    ups = []
    for _ in range(2):
        world.t += EXIT_GRACE_S + 0.01
        core.tick()
        ups += up_messages(core.take())
    assert [m.body["detail"]["rank"] for m in ups if m.type == protocol.STATUS and m.body["what"] == "finished"] == [0]
    assert not [m for m in ups if m.type == protocol.RANK_LOST]


def test_after_a_reconnect_the_registrations_and_name_tables_are_owed_again(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=1)
    core.tick()
    names = NameTable()
    first = step_frame(11, 0, 0, 1, names)
    core.on_rank_frame(b"a", first)
    later = step_frame(11, 0, 1, 2, names)
    assert not protocol.Decoder().decode(later).body["new_names"]
    core.take()
    core.on_link_up()
    assert [m.type for m in up_messages(core.take())] == [protocol.REGISTER, protocol.RANK_MAP]
    assert core.names.owed
    resent = protocol.Decoder().decode(core.names.attach(later))
    assert resent.body["new_names"] == {0: "Sentinel.loss"}
    assert np.array_equal(resent.body["cols"]["name_ids"], [0])


def test_a_rank_s_layout_facts_go_up_and_are_said_again_after_a_reconnect(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=1, layout=True)
    core.tick()
    [reg] = [m for m in up_messages(core.take()) if m.type == protocol.REGISTER]
    assert reg.body["layout"] is True  # the coordinator waits for this rank's facts
    detail = {"rank": 0, "facts": {"world": 2, "groups": {"dp": [0, 1]}, "reducers": ["dp"]}}
    core.on_rank_frame(b"a", encode(Message(protocol.STATUS, "j", "rank:h:11", 1, {"what": "layout",
                                                                                 "detail": detail})))
    assert [m.body["detail"] for m in up_messages(core.take()) if m.type == protocol.STATUS] == [detail]
    core.on_link_up()
    again = up_messages(core.take())
    assert [m.type for m in again] == [protocol.REGISTER, protocol.STATUS, protocol.RANK_MAP]
    assert again[1].body == {"what": "layout", "detail": detail}


def test_stack_files_of_ranks_that_ended_go_when_the_agent_is_done(tmp_path):
    core, world = make(tmp_path)
    folder = tmp_path / "rankscope-stacks" / "j"
    folder.mkdir(parents=True)
    files = {pid: folder / f"{pid}.txt" for pid in (11, 12)}
    for i, (pid, path) in enumerate(files.items()):
        path.write_text("stacks")
        register(core, bytes([i]), pid, i, world_size=2, stacks_file=str(path))
    world.t += 1
    core.tick()
    world.kill(11, signal.SIGKILL)  # rank 0 ended; rank 1 still runs
    core.on_pid_exit(11)
    world.t += 1
    core.tick()
    assert core.remove_stack_files() == 1
    assert not files[11].exists() and files[12].exists() and folder.exists()
    world.kill(12, 0)
    core.on_pid_exit(12)
    world.t += 1
    core.tick()
    core.remove_stack_files()
    assert not folder.exists()


def test_a_register_with_no_pid_is_refused_and_counted(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 0, 0)
    core.tick()
    assert not core.take() and core.decoder.rejected["bad_register"] == 1


def test_a_nonzero_exit_after_a_clean_goodbye_is_a_loss(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=1)
    core.tick()
    core.take()
    core.on_rank_frame(b"a", encode(Message(protocol.STATUS, "j", "rank:h:11", 3, {
        "what": "bye", "detail": {"ok": True, "error": "", "step": 2}})))
    world.kill(11, 3 << 8)  # sys.exit(3) after the client closed cleanly
    core.on_pid_exit(11)
    world.t += EXIT_GRACE_S + 0.01
    core.tick()
    lost = [m.body for m in up_messages(core.take()) if m.type == protocol.RANK_LOST]
    assert [(b["rank"], b["exit_status"], b["signal"]) for b in lost] == [(0, 3, None)]


def test_a_pidfd_notice_starts_the_grace_without_waiting_for_the_scan(tmp_path):
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=1)
    core.tick()
    core.take()
    assert core.watched_pids() == {11}
    world.kill(11, signal.SIGKILL)
    core.on_pid_exit(11)  # what the daemon calls when the pidfd turns readable
    world.t += EXIT_GRACE_S + 0.01
    core.tick()
    lost = [m.body for m in up_messages(core.take()) if m.type == protocol.RANK_LOST]
    assert lost and lost[0]["signal"] == signal.SIGKILL and isinstance(lost[0]["died_at"], float)
    assert core.watched_pids() == set()


def _beat_then_sigkill(core, world, step: int, sync: dict, before_kill=lambda: None) -> dict:
    """Rank 0 (pid 11) sends one heartbeat with ``sync``, then dies by SIGKILL: its RANK_LOST body."""
    register(core, b"a", 11, 0, world_size=1)
    core.tick()
    core.take()
    core.on_rank_frame(b"a", encode(Message(protocol.HEARTBEAT, "j", "rank:h:11", 4, {
        "rank": 0, "step": step, "state": "running", "pid": 11, "sync": sync})))
    before_kill()
    world.kill(11, signal.SIGKILL)
    core.on_pid_exit(11)
    world.t += EXIT_GRACE_S + 0.01
    core.tick()
    [lost] = [m.body for m in up_messages(core.take()) if m.type == protocol.RANK_LOST]
    return lost


def test_the_last_sync_point_travels_with_the_loss_and_a_clock_probe_is_answered(tmp_path):
    core, world = make(tmp_path)
    sync = {"what": "AllReduce", "step": 5, "seq": 0, "phase": "in", "at": 1.7e9}
    lost = _beat_then_sigkill(core, world, 4, sync)
    assert lost["sync"] == sync
    core.on_coordinator_frame(encode(Message(protocol.STATUS, "j", "coordinator", 9,
                                             {"what": "clock", "detail": {"t1": 5.0}})))
    [reply] = [protocol.Decoder().decode(f) for f in core.take().up_volatile]
    assert reply.body["what"] == "clock" and reply.body["detail"]["t1"] == 5.0
    assert isinstance(reply.body["detail"]["t2"], float)


def test_the_sync_point_the_rank_stored_after_its_last_heartbeat_is_the_one_reported(tmp_path, monkeypatch):
    import tempfile

    from rankscope.wire.layout import position_file
    from rankscope.wire.position import NO_TOKEN, PositionWriter
    from rankscope.wire.sync import IN, SyncPoint
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the position files of this test only
    core, world = make(tmp_path)
    stale = {"what": "AllReduce", "step": 4, "seq": 0, "phase": "out", "at": 1.7e9}

    def the_rank_writes_on():
        w = PositionWriter(position_file("j", 11))
        w.write(5, NO_TOKEN)
        w.write_sync(SyncPoint("AllReduce", 5, 0, IN, 1.7e9 + 0.4))  # after the last heartbeat
    lost = _beat_then_sigkill(core, world, 3, stale, the_rank_writes_on)
    assert lost["sync"] == {"what": "AllReduce", "step": 5, "seq": 0, "phase": "in", "at": 1.7e9 + 0.4}
    assert lost["position"] == {"step": 5, "token": None}


def test_stacks_are_asked_of_the_others_only_when_a_rank_ends_badly_and_never_after_a_goodbye(tmp_path):
    import signal

    core, world = make(tmp_path)
    for r in range(4):
        register(core, bytes([r]), 20 + r, r, world_size=4, stacks_file=f"/tmp/s{r}.txt")
    core.tick()
    core.take()
    bye = lambda pid, seq: encode(Message(protocol.STATUS, "j", f"rank:h:{pid}", seq, {  # noqa: E731
        "what": "bye", "detail": {"ok": True, "error": "", "step": 4}}))
    # Rank 0 finishes cleanly and its parent reaps it at once (status unknown): no alarm.
    core.on_rank_frame(bytes([0]), bye(20, 9))
    world.reaped(20)
    core.on_pid_exit(20)
    assert world.signals == []
    # Rank 1 said goodbye and is on its way out; then rank 2 is SIGKILLed: only rank 3,
    # still running, is asked (SIGUSR2 would end a rank whose handler is gone).
    core.on_rank_frame(bytes([1]), bye(21, 9))
    world.kill(22, signal.SIGKILL)
    core.on_pid_exit(22)
    assert world.signals == [(23, signal.SIGUSR2)]


def test_the_coordinators_job_config_is_kept_and_handed_to_whoever_asks(tmp_path):
    from rankscope.wire import job_config
    core, _ = make(tmp_path)
    ask = encode(Message(protocol.STATUS, "j", "launch:1", 0, job_config.body(None)))
    core.on_rank_frame(b"launch", ask)
    (ident, frame), = core.take().to_ranks
    answer = protocol.Decoder().decode(frame)
    assert ident == b"launch" and answer.body == job_config.body(None)  # not heard yet: ask again
    config = {"level": "L0", "cluster": {"on_divergence": "export", "sentinels": False}}
    core.on_coordinator_frame(encode(Message(protocol.STATUS, "", "coordinator", 0, job_config.body(config))))
    bad = {"level": "L9", "cluster": {}}  # never replaces a usable one
    core.on_coordinator_frame(encode(Message(protocol.STATUS, "", "coordinator", 1, job_config.body(bad))))
    core.on_rank_frame(b"launch", ask)
    (_, frame), = core.take().to_ranks
    assert job_config.config_of(protocol.Decoder().decode(frame).body) == config
    assert core.registry.entries() == []  # asking is not registering


def test_an_export_a_rank_did_not_answer_before_its_clean_exit_is_answered_on_its_behalf(tmp_path):
    # A serving worker past its last request: the export reaches it live, but it exits
    # (status 0) without sending its bundle. Its ring still answers it; a rank that did
    # answer is not answered twice.
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=2)
    register(core, b"b", 12, 1, world_size=2)
    core.tick()
    core.on_rank_frame(b"a", step_frame(11, 0, 0, 1, NameTable()))
    core.on_rank_frame(b"b", step_frame(12, 1, 0, 1, NameTable()))
    core.take()
    core.on_coordinator_frame(encode(Message(protocol.CONTROL, "j", "coordinator", 6,
                                             {"command": "export", "incident": "i1", "args": {"transfer": "i1"}})))
    core.on_rank_frame(b"b", encode(Message(protocol.BUNDLE_CHUNK, "j", "rank:h:12", 3, {
        "transfer": "i1", "rank": 1, "path": "manifest.json", "offset": 0, "data": b"{}", "size": 2, "final": True})))
    core.take()
    world.kill(11, 0)
    world.kill(12, 0)
    ups = []
    for _ in range(2):
        world.t += EXIT_GRACE_S + 0.01
        core.tick()
        ups += up_messages(core.take())
    chunks = [m for m in ups if m.type == protocol.BUNDLE_CHUNK]
    assert chunks and {m.body["rank"] for m in chunks} == {0}
    assert all(m.body["on_behalf"] and m.body["transfer"] == "i1" for m in chunks)
    assert [m.body["detail"]["rank"] for m in ups if m.type == protocol.STATUS and m.body["what"] == "finished"] \
        == [0, 1]


def test_a_bundle_written_for_a_rank_that_ended_carries_its_replay_record(tmp_path):
    # The rank re-ran step 5, kept the record and said where; it then finished before the
    # export reached it. The bundle the agent writes for it carries the record, so the
    # incident folder alone is enough for ``rankscope rerun``.
    record = tmp_path / "dump" / "replay" / "rank0" / "step5"
    record.mkdir(parents=True)
    (record / "meta.json").write_text('{"step": 5}')
    (record / "inputs.npz").write_bytes(b"npz")
    core, world = make(tmp_path)
    register(core, b"a", 11, 0, world_size=1)
    core.tick()
    core.on_rank_frame(b"a", step_frame(11, 0, 5, 1, NameTable()))
    detail = {"rank": 0, "step": 5, "trigger": "loss", "outcome": "transient", "replay": str(record)}
    core.on_rank_frame(b"a", encode(Message(protocol.STATUS, "j", "rank:h:11", 2, {"what": "rerun", "detail": detail})))
    core.take()
    world.kill(11, 0)
    for _ in range(2):  # first sight of the exit, then the end of its grace
        world.t += EXIT_GRACE_S + 0.01
        core.tick()
    assert [m.body["what"] for m in up_messages(core.take()) if m.type == protocol.STATUS] == ["finished"]
    core.on_coordinator_frame(encode(Message(protocol.CONTROL, "j", "coordinator", 6,
                                             {"command": "export", "incident": "i1", "args": {"transfer": "i1"}})))
    core.tick()
    chunks = [m for m in up_messages(core.take()) if m.type == protocol.BUNDLE_CHUNK]
    paths = {m.body["path"] for m in chunks}
    assert "rdr/replay/step5/meta.json" in paths and "rdr/replay/step5/inputs.npz" in paths, paths
    meta = next(m for m in chunks if m.body["path"] == "rdr/replay/step5/meta.json")
    assert meta.body["data"] == b'{"step": 5}'
