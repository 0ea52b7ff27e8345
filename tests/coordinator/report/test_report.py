"""report.html's pieces without a browser: history shape, number formatting, the page
being one self-contained file with run values escaped, the heatmap window, where a
tensor sits (real construct.json/stack.json), and the offline incident commands.
(tests/coordinator/report/test_report_dom.py checks the rendered page in Chromium.)"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from repo_paths import DATA

from rankscope.coordinator.cli import incidents as incidents_cli
from rankscope.coordinator.cli import report as report_cli
from rankscope.coordinator.report.fmt import num
from rankscope.coordinator.logic.views.recent import NONFINITE_DEVIATION
from rankscope.coordinator.report.history import history_from_series, save_history
from rankscope.coordinator.report.render import MAX_CELLS, _window, render_report
from rankscope.coordinator.report.where import cell_of, find_dump, frames_for, module_chain, user_frame

DUMP = DATA / "msrun_dp4_nan_rank2_step3" / "dump"


def _series(ranks: int, steps: int, bad_rank: int, bad_step: int) -> dict:
    """SeriesRecorder.to_dict() shape: step-major rows."""
    loss, gnorm, dev = [], [], []
    for s in range(steps):
        loss.append([1.0 + 0.01 * r + 0.001 * s for r in range(ranks)])
        gnorm.append(["nan" if (r == bad_rank and s == bad_step) else 2.0 + 0.02 * r for r in range(ranks)])
        dev.append([NONFINITE_DEVIATION if (r == bad_rank and s >= bad_step) else 0.01 * r for r in range(ranks)])
    return {"ranks": list(range(ranks)), "steps": list(range(steps)), "loss": loss, "grad_norm": gnorm,
            "deviation": dev}


def _incident(tmp: Path, ranks: int = 6, steps: int = 12, bad_rank: int = 4, bad_step: int = 7,
              bundles: tuple[int, ...] = (0, 1)) -> Path:
    d = tmp / "incidents" / "20261121T000000Z-nan_origin-r4-s7"
    d.mkdir(parents=True)
    for r in bundles:
        (d / f"rank_{r}" / "rdr").mkdir(parents=True)
        (d / f"rank_{r}" / "rdr" / "manifest.json").write_text('{"files": []}')
    doc = {
        "incident_id": d.name, "detector": "nan_origin", "first_diverging_rank": bad_rank, "step": bad_step,
        "tensor": "Cell.fc1.Dense.backward.0</script><b>x</b>", "detected_at": "2026-11-21T00:00:00+00:00",
        "evidence": {"rule": "nan_count > 0 <i>before</i> the reduction", "nan_count": 12},
        "ranks": {str(r): {"state": "paused", "step": bad_step + 1} for r in range(ranks)},
        "bundles": {str(r): str(d / f"rank_{r}") for r in (*bundles, 5)}, "ties": [],
        "missing_bundles": [1, 3], "state": "written", "policy": "pause", "job": "j<1>",
        "timeline": [{"event": "start", "state": "pausing", "at": "2026-11-21T00:00:00.500+00:00"}],
    }
    (d / "incident.json").write_text(json.dumps(doc))
    save_history(d, history_from_series(_series(ranks, steps, bad_rank, bad_step)))
    return d


def test_history_is_rank_major_sorted_by_rank_and_keeps_nonfinite_marker():
    series = _series(3, 4, bad_rank=1, bad_step=2)
    series["ranks"] = [2, 0, 1]  # the group's arrival order
    h = history_from_series(series)
    assert h["ranks"] == [0, 1, 2] and h["steps"] == [0, 1, 2, 3]
    assert h["loss"][2][0] == series["loss"][0][0]  # rank 2 was the first column
    series["ranks"] = [0, 1, 2]
    h = history_from_series(series)
    assert h["grad_norm"][1][2] == "nan"  # non-finite stays non-finite, not missing
    assert h["deviation"][1][2] == NONFINITE_DEVIATION and h["deviation"][0][2] == 0.0


def test_numbers_are_formatted_for_people():
    assert num(22.6516078218316) == "22.65"
    assert num(None) == "\u2014" and num("nan") == "NaN" and num("inf") == "+Inf" and num(float("-inf")) == "\u2212Inf"
    assert num(1.0) == "1" and num(2048) == "2\u2009048" and num(0.0) == "0"
    assert num(3.2e-7) == "3.2e\u22127" and num(123456789.0) == "1.235e+8"


def test_render_is_one_self_contained_file_with_run_values_escaped(tmp_path):
    d = _incident(tmp_path)
    page = render_report(d).read_text()
    assert "<b>x</b>" not in page and "<i>before</i>" not in page and "j<1>" not in page
    assert "&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;" in page
    assert "<script" not in page and "<link" not in page and "<img" not in page
    for attr in re.findall(r'(?:href|src)="([^"]*)"', page):
        assert not re.match(r"[a-z]+:", attr) or attr.startswith("data:"), attr  # nothing fetched
    assert '<strong id="first-rank">4</strong>' in page
    assert page.count("<svg") == 3  # heatmap, loss and gradient-norm curves
    assert "{{" not in page
    assert 'class="bundle incomplete' in page and 'class="bundle missing' in page


def test_window_caps_heatmap_cells_around_the_divergence():
    ranks, steps = 1000, 100
    h = history_from_series(_series(ranks, steps, bad_rank=900, bad_step=90))
    kept = _window(h, 90)["steps"]
    assert len(kept) * ranks <= MAX_CELLS and 90 in kept and len(h["steps"]) == steps


def test_a_big_job_still_renders(tmp_path):
    d = _incident(tmp_path, ranks=256, steps=60, bad_rank=200, bad_step=50, bundles=())
    page = render_report(d).read_text()
    assert 'id="first-divergence"' in page and len(page) < 3_000_000


def test_where_finds_the_module_path_and_the_users_code():
    construct = json.loads((DUMP / "construct.json").read_text())
    stack = json.loads((DUMP / "stack.json").read_text())
    assert cell_of("Cell.fc1.Dense.forward.0.input.0", list(construct)) == "Cell.fc1.Dense.forward.0"
    assert cell_of("Sentinel.grad_local.fc2.weight", list(construct)) == "Cell.fc2.Dense.parameters_grad.0"
    assert cell_of("Sentinel.param.fc2.weight", list(construct)) == "Cell.fc2.Dense.forward.0"
    assert cell_of("Cell.head.Dense.parameters_grad.0.bias", list(construct)) == "Cell.head.Dense.parameters_grad.0"
    assert module_chain("Cell.fc1.Dense.forward.0", construct) == ["Cell.fc1.Dense.forward.0"]
    assert module_chain("b", {"b": "a", "a": "b"}) == ["b", "a"]  # a cycle in a damaged file ends
    frames = frames_for("Cell.fc1.Dense.forward.0", stack)
    mine = [f for f in frames if user_frame(f)]
    assert mine and "train_dp.py, line 48, in construct" in mine[0]
    assert frames_for("Cell.fc1.Dense.backward.0", stack)


def test_where_falls_back_to_the_nearest_earlier_step(tmp_path):
    inc = tmp_path / "incidents" / "x"
    inc.mkdir(parents=True)
    dump = tmp_path / "local_dump" / "step3" / "rank2"
    dump.mkdir(parents=True)
    shutil.copy(DUMP / "construct.json", dump)
    assert find_dump(inc, 2, 5, None) == dump
    assert find_dump(inc, 2, 9, None) is None  # too far back
    assert find_dump(inc, 1, 3, None) is None


def test_report_cli_rerenders_every_incident_of_an_export_dir(tmp_path, capsys):
    d = _incident(tmp_path)
    assert not (d / "report.html").exists()
    assert report_cli.main([str(tmp_path)]) == 0
    assert str(d / "report.html") in capsys.readouterr().out
    assert (d / "report.html").is_file()


def test_report_cli_says_when_there_is_nothing_to_render(tmp_path, capsys):
    assert report_cli.main([str(tmp_path)]) == 2
    assert "no incident.json" in capsys.readouterr().err


def test_incidents_lists_shows_and_opens_offline(tmp_path, capsys, monkeypatch):
    d = _incident(tmp_path)
    half = tmp_path / "incidents" / "20261121T000100Z-replica-r1-s9"
    half.mkdir()
    (half / "state.json").write_text(json.dumps({"incident_id": half.name, "state": "exporting",
                                                 "detected_at": 1.7e9, "verdict": {"detector": "replica",
                                                                                   "rank": 1, "step": 9}}))
    assert incidents_cli.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["incident", "detector", "rank", "step"]
    assert out[1].split()[:4] == [d.name, "nan_origin", "4", "7"]
    assert out[2].split()[:4] == [half.name, "replica", "1", "9"] and "no incident.json" in out[2]
    assert incidents_cli.main([str(tmp_path), "nan_origin"]) == 0
    shown = capsys.readouterr().out
    assert "rank 4 diverged first" in shown and str(d) in shown
    opened = []
    monkeypatch.setattr(incidents_cli.webbrowser, "open", lambda url: opened.append(url) or True)
    assert incidents_cli.main([str(tmp_path), d.name, "--open"]) == 0
    assert (d / "report.html").is_file() and opened == [(d / "report.html").resolve().as_uri()]
    capsys.readouterr()
    assert incidents_cli.main([str(tmp_path), "r"]) == 2  # matches both
    assert "matches 2 incidents" in capsys.readouterr().err
    assert incidents_cli.main([str(tmp_path / "nope")]) == 2


def test_a_crash_shows_where_each_ranks_main_thread_stood():
    from rankscope.coordinator.report.where import main_thread_frames
    text = ('# every thread\'s stack\nThread 0x1 (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 982 in run\n\n'
            'Current thread 0x2 (most recent call first):\n'
            '  File "/venv/lib/python3.11/site-packages/mindspore/nn/cell.py", line 1422 in __call__\n'
            '  File "/home/me/train.py", line 106 in main\n'
            '  File "/home/me/train.py", line 112 in <module>\n')
    assert main_thread_frames(text) == ["/home/me/train.py:106 in main", "/home/me/train.py:112 in <module>"]


def test_a_hang_gets_the_failure_table_and_timeline_without_deaths(tmp_path):
    d = tmp_path / "incidents" / "h"
    d.mkdir(parents=True)
    t = 1.7e9
    def sync(step, at, phase="in"):
        return {"what": "AllReduce", "step": step, "seq": 0, "phase": phase, "at": at}

    doc = {"incident_id": "h", "detector": "progress", "first_diverging_rank": 1, "step": 7, "tensor": None,
           "detected_at": "2023-11-14T22:15:20+00:00", "detected_at_epoch": t + 120, "state": "written",
           "policy": "pause", "job": "j",
           "evidence": {"rule": "never reached AllReduce #0 of step 7", "reason": "hang", "failed_at": t,
                        "manner": "never reached AllReduce #0 of step 7; rank(s) 0, 2 waited there",
                        "followers": [], "collective": {"what": "AllReduce", "step": 7, "seq": 0, "entered": [0, 2],
                                                        "never_entered": [1], "waiting_since": t}},
           "ranks": {"0": {"state": "paused", "step": 6, "sync": sync(7, t)},
                     "1": {"state": "stalled", "step": 6, "sync": sync(6, t - 3, "out")},
                     "2": {"state": "paused", "step": 6, "sync": sync(7, t + 0.01)}},
           "timeline": [{"event": "start", "state": "pausing", "at": "2023-11-14T22:15:20.100+00:00"}]}
    (d / "incident.json").write_text(json.dumps(doc))
    page = render_report(d).read_text()
    assert "stuck (never reached the collective)" in page and 'id="failure-timeline"' in page
    assert all(f'id="sync-r{r}"' in page for r in range(3)) and 'id="death-r' not in page
    assert "rankscope resume --job j" in page  # held by the pause policy: how to go on


def test_sparse_or_bad_incident_files(tmp_path, capsys):
    d = tmp_path / "incidents" / "m"
    d.mkdir(parents=True)
    (d / "incident.json").write_text(json.dumps({"incident_id": "m", "detector": "manual", "first_diverging_rank": -1,
                                                 "step": 12, "tensor": None, "evidence": {"rule": "operator export"}}))
    page = render_report(d).read_text()
    assert "operator&#x27;s request at step 12" in page and "No step history" in page
    (d / "incident.json").write_text("{not json")
    assert report_cli.main([str(d)]) == 1
    assert "incident.json: not valid JSON" in capsys.readouterr().err


def test_a_replica_split_with_no_majority_names_no_rank_in_the_report_headline():
    from rankscope.coordinator.report.render import verdict_line
    split = {"first_diverging_rank": 0, "step": 0, "detector": "replica",
             "evidence": {"majority": False, "agreeing_ranks": 1, "compared_ranks": 4}}
    assert verdict_line(split) == ("Replicas differ at step 0 and no value is held by more than half of the "
                                   "4 ranks compared: no rank can be named first")
    one = dict(split, first_diverging_rank=3, evidence={"majority": True, "agreeing_ranks": 3, "compared_ranks": 4})
    assert verdict_line(one).startswith("Rank 3's replica differs at step 0: 3 of 4 ranks agree")


def test_the_report_shows_a_findings_hint_under_its_verdict(tmp_path):
    d = tmp_path / "inc"
    d.mkdir()
    (d / "incident.json").write_text(json.dumps({
        "incident_id": "h", "detector": "replica", "first_diverging_rank": 0, "ties": [1], "step": 0,
        "tensor": "Sentinel.param.w", "evidence": {"majority": False, "agreeing_ranks": 1, "compared_ranks": 2,
                                                   "hint": "give every rank the same seed <mindspore.set_seed>"}}))
    page = render_report(d).read_text()
    assert '<span id="hint">give every rank the same seed &lt;mindspore.set_seed&gt;</span>' in page


def test_a_job_under_a_loss_scale_gets_its_scale_drawn_with_the_overflow_steps_marked(tmp_path):
    d = _incident(tmp_path)
    history = json.loads((d / "history.json").read_text())
    history["loss_scale"] = {
        "scale": 2.0 ** 17, "overflow_steps": 3, "streak": 0,
        "scale_changes": [[0, 2.0 ** 19], [1, 2.0 ** 18], [2, 2.0 ** 17]],
        "recent_overflows": [{"step": s, "scale": 2.0 ** (19 - s), "ranks_overflowed": 4, "ranks": 6}
                             for s in range(2)] + [{"step": 9, "scale": 2.0 ** 17, "ranks_overflowed": 1, "ranks": 6}],
    }
    save_history(d, history)
    page = render_report(d).read_text()
    assert page.count("<svg") == 4  # heatmap, loss, gradient norm, and the scale
    figure = page[page.index('id="curve-loss-scale"'):]
    assert "3 overflow step(s) in all" in figure[:figure.index("</figure>")]
