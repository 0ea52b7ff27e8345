"""report.html: rendered from incident.json + history.json and checked in a real headless
Chromium (the Debian package), by looking at the DOM after the page's script ran."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rankscope.coordinator.cli import report as report_cli
from rankscope.coordinator.report.history import NONFINITE_DEVIATION, history_from_series, load_history, save_history
from rankscope.coordinator.report.render import MAX_CELLS, render_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _series(ranks: int, steps: int, bad_rank: int, bad_step: int) -> dict:
    """SeriesRecorder.to_dict() shape: step-major rows."""
    loss, gnorm, dev = [], [], []
    for s in range(steps):
        loss.append([1.0 + 0.01 * r + 0.001 * s for r in range(ranks)])
        gnorm.append([None if (r == bad_rank and s == bad_step) else 2.0 + 0.02 * r for r in range(ranks)])
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
        "evidence": {"rule": "nan_count > 0 before the reduction", "group_values": {"3": 0, "4": 12}},
        "ranks": {str(r): {"state": "paused", "step": bad_step + 1} for r in range(ranks)},
        "bundles": {str(r): str(d / f"rank_{r}") for r in (*bundles, 5)}, "ties": [],
        "missing_bundles": [1, 3],
    }
    (d / "incident.json").write_text(json.dumps(doc))
    save_history(d, history_from_series(_series(ranks, steps, bad_rank, bad_step)))
    return d


def _dom(path: Path) -> str:
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_history_is_rank_major_sorted_by_rank_and_keeps_nonfinite_marker():
    series = _series(3, 4, bad_rank=1, bad_step=2)
    series["ranks"] = [2, 0, 1]  # the group's arrival order
    h = history_from_series(series)
    assert h["ranks"] == [0, 1, 2] and h["steps"] == [0, 1, 2, 3]
    assert h["loss"][2][0] == series["loss"][0][0]  # rank 2 was the first column
    series["ranks"] = [0, 1, 2]
    h = history_from_series(series)
    assert len(h["loss"]) == 3 and len(h["loss"][0]) == 4
    assert h["grad_norm"][1][2] is None  # missing stays missing
    assert h["deviation"][1][2] == NONFINITE_DEVIATION and h["deviation"][0][2] == 0.0


def test_render_is_self_contained_and_escapes_run_values(tmp_path):
    d = _incident(tmp_path)
    page = render_report(d).read_text()
    assert "<b>x</b>" not in page  # the tensor name is data, never markup
    assert "&lt;/script&gt;" in page
    for ref in ("http://", "https://", "src=", "<link"):
        assert ref not in page.replace("http://www.w3.org/2000/svg", ""), ref
    assert '"first_rank": 4' in page


def test_window_caps_heatmap_cells_around_the_divergence(tmp_path):
    ranks, steps = 1000, 100
    d = _incident(tmp_path, ranks=ranks, steps=steps, bad_rank=900, bad_step=90, bundles=())
    page = render_report(d).read_text()
    data = json.loads(page.split('id="report-data">', 1)[1].split("</script>", 1)[0])
    kept = data["history"]["steps"]
    assert len(kept) * ranks <= MAX_CELLS and 90 in kept
    assert len(load_history(d)["steps"]) == steps  # the file on disk keeps everything


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    d = _incident(tmp_path)
    dom = _dom(render_report(d))
    assert 'data-rendered="1"' in dom, "the page script did not run to the end"
    # heatmap: one cell per rank x step, and the first divergence marked on its cell
    assert dom.count('class="cell') == 6 * 12
    first = dom.split('id="first-divergence"')[0].rsplit("<rect", 1)[1]
    assert 'data-rank="4"' in first and 'data-step="7"' in first and "first" in first
    # curves: loss and grad-norm plots, the diverging rank drawn
    assert dom.count('class="curve-plot"') == 2
    assert dom.count('class="curve" data-rank="4"') == 2
    # evidence and bundles, including a rank whose bundle never arrived
    assert "nan_count &gt; 0 before the reduction" in dom
    assert dom.count('class="bundle"') == 1 and 'class="bundle incomplete" data-rank="1"' in dom
    assert 'class="bundle missing" data-rank="5"' in dom and 'class="bundle missing" data-rank="3"' in dom
    assert '<strong id="first-rank">4</strong>' in dom


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_report_cli_rerenders_every_incident_of_an_export_dir(tmp_path, capsys):
    d = _incident(tmp_path)
    assert not (d / "report.html").exists()
    assert report_cli.main([str(tmp_path)]) == 0
    assert str(d / "report.html") in capsys.readouterr().out
    assert 'data-rendered="1"' in _dom(d / "report.html")


def test_report_cli_says_when_there_is_nothing_to_render(tmp_path, capsys):
    assert report_cli.main([str(tmp_path)]) == 2
    assert "no incident.json" in capsys.readouterr().err
