"""Every structure that sees every step stays bounded in steps: thousands of steps through
each, then its size is what it was after the first hundred (a run of 100,000 steps holds
what a run of 200 holds)."""
from __future__ import annotations

import numpy as np
from logic_helpers import FakeClock, feed_step

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.views.coverage import MAX_RUNS
from rankscope.coordinator.logic.incidents.incident import IncidentEvent
from rankscope.coordinator.logic.incidents.incident_book import MAX_INCIDENTS_PER_JOB
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.dump.retention import DumpRetention, RetentionPolicy
from rankscope.dump.writer import DumpWriter
from rankscope.node.core import NodeCore
from rankscope.node.settings import AgentSettings
from rankscope.rdr.flight_recorder import FlightRecorder
from rankscope.wire import protocol
from rankscope.wire.protocol import Message, encode
from rankscope.wire.records import Kind, NameTable, StepBatch, StepBatchBuilder, StepOutput

STEPS = 3000


def _core_sizes(core: CoordinatorCore, job: str) -> dict[str, int]:
    grp = core.aligner.groups[(job, 0)]
    series = core.series
    return {
        "pending_slots": core.aligner.pending_steps(),
        "pooled_slots": len(core.aligner.pool._free),  # noqa: SLF001
        "series_rows": sum(len(q) for q in series._groups.values()),  # noqa: SLF001
        "recent_steps": sum(len(q) for q in series.recent._groups.values()),  # noqa: SLF001
        "coverage_runs": sum(len(log.runs) for log in core.coverage._jobs.values()),  # noqa: SLF001
        "verdicts": len(core.verdicts),
        "quiet_keys": len(core._quiet),  # noqa: SLF001
        "detector_state_keys": sum(len(v) for v in grp.state.values()),
        "layouts": len(core.aligner.layouts._jobs),  # noqa: SLF001
        "key_columns": len(core.aligner.keys[job]),
    }


def test_the_coordinator_core_holds_as_much_after_3000_steps_as_after_1000():
    sim = SyntheticTraining(ranks=4, tensors=24, seed=21)
    clock = FakeClock()
    core = CoordinatorCore({}, clock=clock)
    for r in range(4):
        core.on_register(sim.job, r, {"world_size": 4, "pid": r})
    sizes = {}
    for step in range(STEPS):
        feed_step(core, clock, sim.batches(step), dt=0.05)
        if step in (999, STEPS - 1):
            sizes[step] = _core_sizes(core, sim.job)
    assert sizes[999] == sizes[STEPS - 1]
    assert sizes[STEPS - 1]["coverage_runs"] <= MAX_RUNS and sizes[STEPS - 1]["series_rows"] == 512
    assert core.coverage_report(sim.job)["steps"] == [0, STEPS - 1]


def test_a_rank_that_keeps_coming_and_going_keeps_coverage_bounded():
    core = CoordinatorCore({}, clock=FakeClock())
    for step in range(STEPS):
        core.coverage.judged("j", step, [0, 1, 2, 3] if step % 2 else [0, 1, 2])
    assert sum(len(log.runs) for log in core.coverage._jobs.values()) <= MAX_RUNS  # noqa: SLF001
    per_rank = core.coverage.per_rank("j")
    assert len(per_rank[3]) == STEPS // 2 and len(per_rank[0]) == STEPS


def test_the_local_dump_writer_and_its_retention_hold_a_window(tmp_path):
    w = DumpWriter(tmp_path / "dump")
    w.retention = DumpRetention(RetentionPolicy(keep_steps=20, max_mb=None, max_files=None))
    for step in range(STEPS // 3):
        w.write_tensor(step, "rank0", "x.npy", np.ones(2, np.float32))
        w.emit(StepOutput(batch=StepBatch.empty("j", 0, step), rank_label="rank0",
                          entries={"Cell.a.forward.0": {"input_args": []}}))
    w.close()
    assert len(w._written) <= 4 and len(w._tensor_bytes) <= 16 and len(w._labels) == 20  # noqa: SLF001
    assert len(w.retention.kept()) == 20 and len(list((tmp_path / "dump").iterdir())) == 20


def test_the_in_rank_flight_recorder_keeps_its_last_k_steps():
    fr = FlightRecorder(k=8)
    for step in range(STEPS):
        fr.emit(StepOutput(batch=StepBatch.empty("j", 0, step), rank_label="rank0"))
    assert [s.batch.step for s in fr.steps()] == list(range(STEPS - 8, STEPS))


def test_the_node_agent_holds_a_rank_s_last_steps_and_names_not_its_history(tmp_path):
    settings = AgentSettings(listen="ipc:///nowhere", coordinator="tcp://127.0.0.1:1", job="j",
                             bundle_dir=tmp_path / "bundles", settle_s=0.0, heartbeat_timeout_s=5.0)
    t = [100.0]
    core = NodeCore(settings, "h", "agent:h:1", clock=lambda: t[0], read_proc=lambda pid: None,
                    send_signal=lambda pid, sig: None)
    core.on_rank_frame(b"a", encode(Message(protocol.REGISTER, "j", "rank:h:11", 0, {
        "host": "h", "pid": 11, "claimed_rank": 0, "world_size": 1})))
    t[0] += 1
    core.tick()
    names = NameTable()
    for step in range(STEPS // 3):
        b = StepBatchBuilder(names)
        b.add("Sentinel.loss", Kind.LOSS, (1.0, 1.0, 1.0, 1.0), numel=1)
        batch = b.build("j", 0, step)
        core.on_rank_frame(b"a", encode(protocol.step_message(batch, "rank:h:11", step + 1)))
        core.take()
    [entry] = core.registry.live()
    assert len(core.bundles.recorder(entry).steps()) == core.bundles.k
    assert sum(len(v) for v in core.names._names.values()) == 1  # noqa: SLF001


def test_a_job_opens_at_most_its_incident_cap_and_counts_the_verdicts_after_it():
    clock = FakeClock()
    core = CoordinatorCore({"on_divergence": "continue"}, clock=clock)
    for r in range(2):
        core.on_register("j", r, {"world_size": 2, "pid": r})
    for n in range(MAX_INCIDENTS_PER_JOB + 25):
        v = Verdict("outlier", n % 2, 10_000 + 2000 * n, "t", 0, "loss", "j/0", job="j")
        inc = core.book.open_or_attach(v)
        if inc is not None:  # the continue policy: exported (no bundles here), written, over
            core.book.fire(inc, IncidentEvent.EXPORT_TIMEOUT)
            core.book.fire(inc, IncidentEvent.WRITE_DONE)
    assert len(core.book.by_id) == MAX_INCIDENTS_PER_JOB
    assert core.status()["jobs"]["j"]["verdicts_past_incident_cap"] == 25
