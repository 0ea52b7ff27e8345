"""report.html as a browser shows it: four incidents (NaN, outlier, replica, lost rank)
made by the real coordinator logic from a real msrun job's statistics
(tests/report_fixtures.py), rendered, loaded in headless Chromium (the Debian package),
and checked by reading the DOM after layout: the tables hold incident.json's numbers,
the divergence marker and outline sit at the named step and rank on the plots' own
axes, NaN/Inf and missing values are marked, and every file link resolves."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from report_dom import CHROMIUM, NO_CHROMIUM, cells, check_verdict_marks, dom, path_xy, section, ticks
from report_fixtures import EXPECTED, KINDS, incident_json, make_incident

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[dict, str, Path]]:
    out = {}
    for kind in KINDS:
        d = make_incident(kind, tmp_path_factory.mktemp(kind))
        out[kind] = (incident_json(d), dom(d / "report.html"), d)
    return out


# --- every kind ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_verdict_and_markers_sit_at_the_named_rank_and_step(pages, kind):
    inc, page, _ = pages[kind]
    detector, rank, step = EXPECTED[kind]
    assert (inc["detector"], inc["first_diverging_rank"], inc["step"]) == (detector, rank, step)
    check_verdict_marks(page, rank, step)


@pytest.mark.parametrize("kind", KINDS)
def test_links_resolve_and_only_distributed_run_variables_are_shown(pages, kind):
    _, page, d = pages[kind]
    hrefs = re.findall(r'href="([^"#][^"]*)"', section(page, "go-on", "</body>"))
    assert hrefs
    for h in hrefs:
        assert not h.startswith(("http:", "https:", "/")), h
        assert (d / unquote(h)).exists(), f"broken link {h}"
    assert any(h.endswith("worker_2.log") for h in hrefs)
    assert "MS_WORKER_NUM=4" in page and "SECRET_TOKEN" not in page
    assert "<script" not in page  # no code: the page is tables and inline SVG
    assert f"rankscope report {d}" in page


# --- per kind --------------------------------------------------------------------------
def test_nan_report_shows_counts_the_chain_and_marks(pages):
    inc, page, _ = pages["nan"]
    ev = inc["evidence"]
    row = cells(page, "stats", 2)  # Max, Min, Mean, Norm, NaN, Inf
    assert row[:4] == [ev["stats"][k] for k in ("Max", "Min", "Mean", "Norm")] == ["nan"] * 4
    assert row[4:6] == [str(ev["nan_count"]), str(ev["inf_count"])]
    assert cells(page, "stats", 0)[4] == "0"
    chain = section(page, "nan-chain", 'id="pictures"')
    first_row = chain.split("<tbody>")[1].split("</tr>")[0]
    assert inc["tensor"] in first_row and 'class="ranks">2<' in first_row
    assert "Sentinel.grad_reduced.fc1.weight" in chain  # where it spread: every rank after the AllReduce
    assert 'id="nonfinite-r2-s3"' in section(page, "curve-grad_norm")
    assert "NaN/Inf" in section(page, "heatmap")
    assert 'id="module-path"' in page and "Cell.fc1.Dense.forward.0" in page and "train_dp.py" in page


def test_outlier_report_holds_the_robust_scores_and_threshold(pages):
    inc, page, _ = pages["outlier"]
    ev = inc["evidence"]
    row = cells(page, "outlier-scores", 1)
    assert float(row[0]) == pytest.approx(float(ev["group_values"]["by_rank"]["1"]))
    assert float(row[2]) == pytest.approx(float(ev["robust_z"]))
    assert float(row[2]) > ev["thresholds"]["z"]
    for r, z in ev["robust_z_by_rank"].items():
        assert float(cells(page, "outlier-scores", r)[2]) == pytest.approx(float(z))
    table = section(page, "outlier-scores", "</table>")
    assert '<tr class="faulty" data-rank="1">' in table and "flagged" in table
    win = section(page, "window", "</table>")
    assert 'class="faulty" data-rank="1"' in win and "div-step" in win


def test_replica_report_groups_checksums_by_value(pages):
    inc, page, _ = pages["replica"]
    ev = inc["evidence"]
    groups = section(page, "replica-groups", "</table>")
    bad = re.search(rf'data-crc="{ev["crc32"]}">.*?class="ranks">([^<]*)<', groups, re.S)
    good = re.search(rf'data-crc="{ev["majority_crc32"]}">.*?class="ranks">([^<]*)<', groups, re.S)
    assert bad.group(1) == "3" and good.group(1) == "0, 1, 2"
    assert cells(page, "stats", 3)[-1] == ev["crc32"]


def test_lost_rank_report_outlines_the_missing_step_and_the_failure_timeline(pages):
    inc, page, _ = pages["lost"]
    ev = inc["evidence"]
    heat = section(page, "heatmap")
    x, _ = path_xy(heat, "missing-step")
    assert abs(x - ticks(heat, "x")["2"]) < 1.0
    assert 'id="missing-r2-s2"' in section(page, "curve-loss")
    fail = section(page, "failures", "</table>")
    assert re.search(r'data-rank="2"><th>rank 2</th><td>first to fail</td><td>killed by SIGKILL', fail)
    delays = {str(f["rank"]): f["delay_s"] for f in ev["followers"]}
    assert delays == {"0": 0.25, "1": 0.25, "3": 0.25}
    for r, delay in delays.items():
        assert re.search(rf'data-rank="{r}">.*?data-value="{delay}">\+250 ms<', fail, re.S)
    timeline = section(page, "failure-timeline")
    assert 'id="death-r2"' in timeline and 'id="death-r0"' in timeline
    dx, _ = path_xy(timeline, "death-r2")
    fx, _ = path_xy(timeline, "death-r0")
    assert fx > dx  # the followers died after the cause
    states = re.findall(r'<tr data-state="([a-z]+)">', section(page, "timeline", "</table>"))
    # incident.json is written before the policy's last move, and again once the incident
    # ends: it and the page both end at the final state.
    assert [e["state"] for e in inc["timeline"]] == states[1:] and states[0] == "detected"
    assert states[-1] == inc["state"] == "terminated" and "state <strong>terminated</strong>" in page
