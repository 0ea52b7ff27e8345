"""report.html as a browser shows it: four incidents (NaN, outlier, replica, lost rank)
made by the real coordinator logic from a real msrun job's statistics
(tests/report_fixtures.py), rendered, loaded in headless Chromium (the Debian package),
and checked by reading the DOM after layout: the tables hold incident.json's numbers,
the divergence marker and outline sit at the named step and rank on the plots' own
axes, NaN/Inf and missing values are marked, and every file link resolves."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest
from report_fixtures import EXPECTED, KINDS, incident_json, make_incident

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make system-deps, or "
                                                         "apt-get install -y chromium)")


def _dom(path: Path) -> str:
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[dict, str, Path]]:
    out = {}
    for kind in KINDS:
        d = make_incident(kind, tmp_path_factory.mktemp(kind))
        out[kind] = (incident_json(d), _dom(d / "report.html"), d)
    return out


# --- reading the DOM -------------------------------------------------------------------
def _section(dom: str, elem_id: str, end: str = "</figure>") -> str:
    start = dom.index(f'id="{elem_id}"')
    return dom[start:dom.index(end, start)]


def _ticks(svg: str, axis: str) -> dict[str, float]:
    """Tick label -> tick position (px) of the figure's first axes."""
    axes = svg.split('id="axes_2"')[0]
    out = {}
    for block in axes.split(f'id="{axis}tick_')[1:]:
        pos = re.search(rf'<use [^>]*\b{axis}="([-\d.]+)"', block)
        label = re.search(r">([^<>]+)</text>", block)
        if pos and label:
            out[label.group(1).strip()] = float(pos.group(1))
    return out


def _path_xy(svg: str, gid: str) -> tuple[float, float]:
    """Centre of the first path (or marker) drawn by the artist with id ``gid``."""
    block = svg[svg.index(f'id="{gid}"'):][:3000]
    use = re.search(r'<use [^>]*\bx="([-\d.]+)"[^>]*\by="([-\d.]+)"', block)
    d = re.search(r'\bd="([^"]+)"', block)
    if use and (not d or block.index(use.group(0)) < block.index(d.group(0)) or "<defs>" in block[:200]):
        return float(use.group(1)), float(use.group(2))
    nums = [float(v) for v in re.findall(r"[-\d.]+", d.group(1))]
    xs, ys = nums[0::2], nums[1::2]
    return (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2


def _cells(dom: str, table_id: str, rank: int | str) -> list[str]:
    table = _section(dom, table_id, "</table>")
    row = re.search(rf'<tr class="[^"]*" data-rank="{rank}">(.*?)</tr>', table, re.S)
    assert row, f"{table_id}: no row for rank {rank}"
    return re.findall(r'data-value="([^"]*)"', row.group(1))


# --- every kind ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_verdict_and_markers_sit_at_the_named_rank_and_step(pages, kind):
    inc, dom, _ = pages[kind]
    detector, rank, step = EXPECTED[kind]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == (detector, rank, step)
    assert f'<strong id="first-rank">{rank}</strong>' in dom and f'<strong id="first-step">{step}</strong>' in dom
    heat = _section(dom, "heatmap")
    xt, yt = _ticks(heat, "x"), _ticks(heat, "y")
    assert [int(s) for s in xt] == list(range(int(min(xt)), step + 1 + (kind == "nan"))), "every step to the verdict"
    x, y = _path_xy(heat, "first-divergence")
    assert abs(x - xt[str(step)]) < 1.0 and abs(y - yt[str(rank)]) < 1.0
    assert "colorbar" in heat or 'id="axes_2"' in heat, "a colour scale beside the heatmap"
    assert ">step</text>" in heat and ">rank</text>" in heat, "axis titles"
    for metric in ("loss", "grad_norm"):
        svg = _section(dom, f"curve-{metric}")
        ticks = _ticks(svg, "x")
        mx, _ = _path_xy(svg, "divergence-marker")
        assert abs(mx - ticks[str(step)]) < 1.0, f"{metric}: marker not at step {step}"
        assert 'id="curve-r' + str(rank) + '"' in svg


@pytest.mark.parametrize("kind", KINDS)
def test_links_resolve_and_only_distributed_run_variables_are_shown(pages, kind):
    _, dom, d = pages[kind]
    hrefs = re.findall(r'href="([^"#][^"]*)"', _section(dom, "go-on", "</body>"))
    assert hrefs
    for h in hrefs:
        assert not h.startswith(("http:", "https:", "/")), h
        assert (d / unquote(h)).exists(), f"broken link {h}"
    assert any(h.endswith("worker_2.log") for h in hrefs)
    assert "MS_WORKER_NUM=4" in dom and "SECRET_TOKEN" not in dom
    assert "<script" not in dom  # no code: the page is tables and inline SVG
    assert f"rankscope report {d}" in dom


# --- per kind --------------------------------------------------------------------------
def test_nan_report_shows_counts_the_chain_and_marks(pages):
    inc, dom, _ = pages["nan"]
    ev = inc["evidence"]
    cells = _cells(dom, "stats", 2)  # Max, Min, Mean, Norm, NaN, Inf
    assert cells[:4] == [ev["stats"][k] for k in ("Max", "Min", "Mean", "Norm")] == ["nan"] * 4
    assert cells[4:6] == [str(ev["nan_count"]), str(ev["inf_count"])]
    assert _cells(dom, "stats", 0)[4] == "0"
    chain = _section(dom, "nan-chain", 'id="pictures"')
    first_row = chain.split("<tbody>")[1].split("</tr>")[0]
    assert inc["tensor"] in first_row and 'class="ranks">2<' in first_row
    assert "Sentinel.grad_reduced.fc1.weight" in chain  # where it spread: every rank after the AllReduce
    assert 'id="nonfinite-r2-s3"' in _section(dom, "curve-grad_norm")
    assert "NaN/Inf" in _section(dom, "heatmap")
    assert 'id="module-path"' in dom and "Cell.fc1.Dense.forward.0" in dom and "train_dp.py" in dom


def test_outlier_report_holds_the_robust_scores_and_threshold(pages):
    inc, dom, _ = pages["outlier"]
    ev = inc["evidence"]
    row = _cells(dom, "outlier-scores", 1)
    assert float(row[0]) == pytest.approx(float(ev["group_values"]["by_rank"]["1"]))
    assert float(row[2]) == pytest.approx(float(ev["robust_z"]))
    assert float(row[2]) > ev["thresholds"]["z"]
    for r, z in ev["robust_z_by_rank"].items():
        assert float(_cells(dom, "outlier-scores", r)[2]) == pytest.approx(float(z))
    table = _section(dom, "outlier-scores", "</table>")
    assert f'<tr class="faulty" data-rank="1">' in table and "flagged" in table
    win = _section(dom, "window", "</table>")
    assert 'class="faulty" data-rank="1"' in win and "div-step" in win


def test_replica_report_groups_checksums_by_value(pages):
    inc, dom, _ = pages["replica"]
    ev = inc["evidence"]
    groups = _section(dom, "replica-groups", "</table>")
    bad = re.search(rf'data-crc="{ev["crc32"]}">.*?class="ranks">([^<]*)<', groups, re.S)
    good = re.search(rf'data-crc="{ev["majority_crc32"]}">.*?class="ranks">([^<]*)<', groups, re.S)
    assert bad.group(1) == "3" and good.group(1) == "0, 1, 2"
    assert _cells(dom, "stats", 3)[-1] == ev["crc32"]


def test_lost_rank_report_outlines_the_missing_step_and_the_failure_timeline(pages):
    inc, dom, _ = pages["lost"]
    ev = inc["evidence"]
    heat = _section(dom, "heatmap")
    x, _ = _path_xy(heat, "missing-step")
    assert abs(x - _ticks(heat, "x")["2"]) < 1.0
    assert 'id="missing-r2-s2"' in _section(dom, "curve-loss")
    fail = _section(dom, "failures", "</table>")
    assert re.search(r'data-rank="2"><th>rank 2</th><td>first to fail</td><td>killed by SIGKILL', fail)
    delays = {str(f["rank"]): f["delay_s"] for f in ev["followers"]}
    assert delays == {"0": 0.25, "1": 0.25, "3": 0.25}
    for r, delay in delays.items():
        assert re.search(rf'data-rank="{r}">.*?data-value="{delay}">\+250 ms<', fail, re.S)
    timeline = _section(dom, "failure-timeline")
    assert 'id="death-r2"' in timeline and 'id="death-r0"' in timeline
    dx, _ = _path_xy(timeline, "death-r2")
    fx, _ = _path_xy(timeline, "death-r0")
    assert fx > dx  # the followers died after the cause
    states = re.findall(r'<tr data-state="([a-z]+)">', _section(dom, "timeline", "</table>"))
    # incident.json is written before the policy's last move; the page shows it from state.json
    assert [e["state"] for e in inc["timeline"]] == states[1:-1] and states[0] == "detected"
    assert states[-1] == "terminated" and "state <strong>terminated</strong>" in dom
