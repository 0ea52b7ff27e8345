"""An incident whose files were written while it held the job paused ends later (the
operator resumes or terminates): incident.json and report.html are written again and say
so. Real core, real action performer and report renderer, in-process."""
from __future__ import annotations

import json

from logic_helpers import FakeClock

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.synthetic import SyntheticTraining
from rankscope.coordinator.server.actions import ActionPerformer


def _paused_incident(tmp_path):
    clock, wall = FakeClock(100.0), FakeClock(1.8e9)
    core = CoordinatorCore({"on_divergence": "pause", "pause_timeout_s": 1.0, "export_timeout_s": 1.0},
                           clock=clock, export_dir=tmp_path, wall_clock=wall)
    sent: list[str] = []
    perf = ActionPerformer(core, tmp_path, send_control=lambda command, **kw: sent.append(command) or 1)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=2)
    for r in range(4):
        core.on_register(sim.job, r, {"world_size": 4})
    p = sim.column("Sentinel.param.")
    for step in range(3):
        batches = sim.batches(step)
        if step == 2:
            batches[3].crc32[p] ^= 0x10
        for b in batches:
            core.on_step(b)
        for _ in range(8):  # the pause and export time out: nobody answers here
            clock.advance(0.5)
            wall.advance(0.5)
            core.tick()
            perf.run()
    perf.flush()
    [inc] = core.incidents()
    return core, perf, tmp_path / "incidents" / inc["incident_id"], sent


def test_a_resume_after_the_incident_was_written_rewrites_incident_json_and_the_report(tmp_path):
    core, perf, d, sent = _paused_incident(tmp_path)
    assert json.loads((d / "incident.json").read_text())["state"] == "written"
    assert "the job is paused here" in (d / "report.html").read_text()
    core.operator("resume")
    perf.run()
    perf.flush()
    doc = json.loads((d / "incident.json").read_text())
    assert sent[-1] == "resume" and doc["state"] == "resumed" and doc["timeline"][-1]["state"] == "resumed"
    page = (d / "report.html").read_text()
    assert "the job is paused here" not in page and "the job was resumed" in page
    assert (doc["detector"], doc["first_diverging_rank"], doc["step"]) == ("replica", 3, 2)
    perf.close()


def test_a_terminate_after_the_incident_was_written_says_terminated(tmp_path):
    core, perf, d, _ = _paused_incident(tmp_path)
    core.operator("terminate")
    perf.run()
    perf.close()
    assert json.loads((d / "incident.json").read_text())["state"] == "terminated"
    assert "the job was terminated" in (d / "report.html").read_text()


def test_an_operators_export_names_no_rank_and_keeps_the_jobs_curves(tmp_path):
    clock, wall = FakeClock(100.0), FakeClock(1.8e9)
    core = CoordinatorCore({"on_divergence": "pause", "pause_timeout_s": 1.0, "export_timeout_s": 1.0},
                           clock=clock, export_dir=tmp_path, wall_clock=wall)
    perf = ActionPerformer(core, tmp_path, send_control=lambda command, **kw: 1)
    sim = SyntheticTraining(ranks=4, tensors=16, seed=3)
    for r in range(4):
        core.on_register(sim.job, r, {"world_size": 4})

    def run(n: int) -> None:
        for _ in range(n):
            clock.advance(0.5)
            wall.advance(0.5)
            core.tick()
            perf.run()

    for step in range(4):
        for b in sim.batches(step):
            core.on_step(b)
        run(1)
    core.operator("pause")
    core.operator("export")
    run(10)
    perf.flush()
    [inc] = core.incidents()
    assert inc["incident_id"].endswith("-manual-s3") and "-r-1" not in inc["incident_id"]
    d = tmp_path / "incidents" / inc["incident_id"]
    doc = json.loads((d / "incident.json").read_text())
    assert doc["summary"] == "manual: bundles exported on an operator's request at step 3 (no divergence named)"
    history = json.loads((d / "history.json").read_text())
    assert history["steps"] == [0, 1, 2, 3] and len(history["ranks"]) == 4
    assert "No step history was recorded" not in (d / "report.html").read_text()
    perf.close()
