"""What the launcher says while a job is paused: the cut, export progress, the commands
that reach this job, a heartbeat line, and the resume."""
from __future__ import annotations

from rankscope.coordinator.launch.paused import PausedNotice, held, reach_args


def _status(cut=None, incidents=()):
    return {"jobs": {"j": {"cut": cut}}, "incidents": list(incidents)}


def _cut(step, ranks, partial=None, moved=()):
    return {"step": step, "why": "divergence", "moved_from": list(moved), "ranks": ranks,
            "partial": partial or {}, "complete": not partial}


def test_divergence_pause_export_commands_heartbeat_and_resume() -> None:
    lines: list[str] = []
    reach = reach_args("10.0.0.5:6379", "j")
    notice = PausedNotice(lines.append, "j", reach, every_s=30, export_every_s=2)
    inc = {"incident_id": "I1", "job": "j", "state": "pausing", "summary": "replica: rank 2 at step 5"}
    on_way = _cut(7, {"0": "paused before step 7", "1": "on its way (no step after 5)"})
    notice.update(_status(on_way, [inc]), 0.0)
    assert lines == []  # not paused yet: nothing to tell
    both = {"0": "paused before step 7", "1": "paused before step 7"}
    exporting = {**inc, "state": "exporting", "ranks": {"0": {}, "1": {}}, "bundles": {"0": "x"},
                 "bytes_received": 3 * 2**20}
    notice.update(_status(_cut(7, both, moved=[6]), [exporting]), 1.0)
    assert "exporting I1: 1/2 rank bundle(s) in, 3.0 MiB" in lines
    assert any(line.startswith("PAUSED: 2 of 2 rank(s) hold before step 7") and "moved from step 6" in line
               for line in lines)
    assert not any("go on with" in line for line in lines)  # the export is still running
    written = {**exporting, "state": "written", "bundles": {"0": "x", "1": "y"}, "dir": "/out/incidents/I1"}
    lines.clear()
    notice.update(_status(_cut(7, both), [written]), 3.0)
    assert lines[0] == "incident written: 2 rank bundle(s), 3.0 MiB -> /out/incidents/I1"
    assert "go on with one of" in lines[2]
    cmds = [line.split("#")[0].split() for line in lines[3:]]
    assert ["rankscope", "resume", "--address", "10.0.0.5:6379", "--job", "j"] in cmds
    assert ["rankscope", "step", "1", "--address", "10.0.0.5:6379", "--job", "j"] in cmds
    # the incident's bundles are written: a second export would be refused while it is open
    assert {c[1] for c in cmds} == {"resume", "step", "terminate", "status"}
    lines.clear()
    notice.update(_status(_cut(7, both), [written]), 20.0)
    assert lines == []  # no repeats
    notice.update(_status(_cut(7, both), [written]), 95.0)
    assert lines == [f"still paused before step 7 for 1m34s; waiting for rankscope resume|step N|terminate {reach}"]
    lines.clear()
    notice.update(_status(None, [{**written, "state": "resumed"}]), 100.0)
    assert lines == ["resumed: training goes on (was paused before step 7 for 1m39s)"]
    notice.update(_status(_cut(7, both), [written]), 101.0)
    lines.clear()
    notice.update({**_status(None, [{**written, "state": "terminated"}]), "terminated": True}, 102.0)
    assert lines == ["terminated (was paused before step 7 for 1s)"]  # not "training goes on"


def test_a_partial_cut_names_the_ranks_that_are_not_there() -> None:
    lines: list[str] = []
    notice = PausedNotice(lines.append, "j", reach_args(None, "j"))
    cut = _cut(5, {"0": "paused before step 5", "1": "lost after step 3 (signal 9, killed)"},
               partial={"1": "lost after step 3 (signal 9, killed)"})
    assert held(cut)
    notice.update(_status(cut), 0.0)
    assert lines[0].startswith("PAUSED: 1 of 2 rank(s) hold before step 5")
    assert lines[1] == "  rank 1 is not paused: lost after step 3 (signal 9, killed)"
    assert lines[-1].split("#")[0].split() == ["rankscope", "status", "--job", "j"]
    assert not held(_cut(5, {"0": "on its way (no step after 3)"}))
