"""Render ``incidents/<id>/report.html`` from incident.json (+ history.json and the
rank bundles beside it).

One file, no script, no network: tables are HTML, pictures are matplotlib SVG inlined
(:mod:`.plots`). Every run value is HTML-escaped. The page is laid out as a reader
checks a verdict: the claim, its proof, where in the model and code, the pictures,
then everything needed to go on (timeline, files, config, commands).
"""
from __future__ import annotations

import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

from rankscope.coordinator.logic.incidents.incident_store import iso
from rankscope.coordinator.logic.verdict import JOB_WIDE
from rankscope.coordinator.report import findings, plots, proof
from rankscope.coordinator.report.context import (
    Links,
    commands_section,
    config_section,
    files_section,
    timeline_section,
)
from rankscope.coordinator.report.fmt import esc, muted, num, when
from rankscope.coordinator.report.history import load_history
from rankscope.coordinator.report.timeline_plot import failure_timeline_svg
from rankscope.coordinator.report.where import where_section
from rankscope.files.atomic import atomic_write_bytes

REPORT_FILE = "report.html"
#: Heatmap cap: beyond this many cells the step window is narrowed around the
#: divergence, so a 1024-rank job still gives a page a browser opens quickly.
MAX_CELLS = 24_000


def load_incident(incident_dir: Path) -> dict:
    inc_path = incident_dir / "incident.json"
    if not inc_path.is_file():
        raise FileNotFoundError(f"{inc_path}: no incident.json, not an incident directory")
    try:
        return json.loads(inc_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{inc_path}: not valid JSON ({exc})") from None


def render_report(incident_dir: Path | str, history: dict | None = None) -> Path:
    """Write report.html into ``incident_dir`` and return its path."""
    incident_dir = Path(incident_dir)
    incident = with_latest_state(load_incident(incident_dir), incident_dir)
    if history is None:
        history = load_history(incident_dir)
    history = _window(history, incident.get("step"))
    link = Links(incident_dir)
    config_html, bundle_config = config_section(incident, incident_dir, link)
    fields = {
        "headline": verdict_line(incident), "incident_id": incident.get("incident_id", incident_dir.name),
        "verdict_line": _verdict_html(incident), "tensor": incident.get("tensor") or "\u2014",
        "kind": f" ({incident['kind']})" if incident.get("kind") else "",
        "detector": incident.get("detector"), "rule": (incident.get("evidence") or {}).get("rule", "\u2014"),
        "detected_at": when(incident.get("detected_at")), "job": incident.get("job", ""),
        "state": incident.get("state", "\u2014"), "policy": incident.get("policy", "\u2014"),
        "version": _version(), "rendered_at": when(time.time()),
    }
    ties = incident.get("ties") or []
    page = _template()
    for key, val in fields.items():
        page = page.replace("{{" + key + "}}", esc(val) if key != "verdict_line" else val)
    parts = {
        "ties": esc(f"; tied with rank(s) {', '.join(map(str, ties))}") if ties else "",
        "proof": _proof(incident, history),
        "where": where_section(incident, incident_dir, bundle_config, link) + findings.nan_chain(history),
        "pictures": _pictures(incident, history),
        "timeline": timeline_section(incident),
        "files": files_section(incident, incident_dir, link),
        "config": config_html,
        "commands": commands_section(incident, incident_dir),
        "evidence": findings.evidence_details(incident),
    }
    for key, val in parts.items():
        page = page.replace("{{" + key + "}}", val)
    out = incident_dir / REPORT_FILE
    atomic_write_bytes(out, page.encode("utf-8"))
    return out


def with_latest_state(incident: dict, incident_dir: Path) -> dict:
    """incident.json is written before the incident's last moves (terminated, resumed by
    an operator later); state.json beside it is rewritten at every one. Take the state
    and the timeline from it when it has gone further."""
    try:
        st = json.loads((incident_dir / "state.json").read_text(encoding="utf-8"))
        moves = [(str(e), str(s), float(w)) for e, s, w in st.get("history") or []]
    except (OSError, ValueError, TypeError, AttributeError):
        return incident
    if len(moves) <= len(incident.get("timeline") or []):
        return incident
    timeline = [{"event": e, "state": s, "at": iso(w)} for e, s, w in moves]
    return dict(incident, state=st.get("state", incident.get("state")), timeline=timeline)


def verdict_line(incident: dict) -> str:
    """One sentence a reader can forward: who, when, what."""
    rank, step, det = incident.get("first_diverging_rank"), incident.get("step"), incident.get("detector")
    ev = incident.get("evidence") or {}
    if det == "manual":
        return f"Bundles exported on an operator's request at step {step} (no divergence was named)"
    if incident.get("decided") is False and ev.get(JOB_WIDE):
        return (f"Every rank at step {step}: {ev.get('rule', det)}. {str(ev[JOB_WIDE]).capitalize()}: no rank "
                "is named, and the job was left running")
    if incident.get("decided") is False:
        who = ", ".join(str(r) for r in incident.get("undecided_between") or [])
        return (f"Ranks {who} disagree at step {step} and nothing tells which of them is wrong: no rank is "
                "named, and the job was left running")
    if det == "param_moved" or (det == "replica" and "outside the optimizer" in str(ev.get("rule", ""))):
        return (f"Rank {rank}'s weights changed outside the optimizer before step {step} (between the last "
                "update and this step's start); its replicas' did not")
    if det == "progress" and ev.get("manner"):
        followers = ev.get("followers") or []
        tail = f"; {len(followers)} rank(s) went down after it" if followers else ""
        where = "" if ev.get("after_last_step") is not None else f", in step {step}"
        return f"Rank {rank} failed first{where}: {ev['manner']}{tail}"
    if det == "progress":
        return f"Rank {rank} stopped reporting: step {step} never arrived ({ev.get('rule', '')})"
    if det == "nan_origin":
        return f"Rank {rank} produced the first NaN/Inf, at step {step}"
    if det == "outlier":
        return (f"Rank {rank} stands out at step {step}: {ev.get('value', 'value')} "
                f"{num(ev.get('ratio_to_median'))}\u00d7 the group median")
    if det == "replica" and ev.get("majority") is False:
        return (f"Replicas differ at step {step} and no value is held by more than half of the "
                f"{num(ev.get('compared_ranks'))} ranks compared: no rank can be named first")
    if det == "replica":
        return (f"Rank {rank}'s replica differs at step {step}: {num(ev.get('agreeing_ranks'))} of "
                f"{num(ev.get('compared_ranks'))} ranks agree, it does not")
    return f"Rank {rank} diverged first, at step {step} ({det})"


def _verdict_html(incident: dict) -> str:
    rank, step = esc(incident.get("first_diverging_rank")), esc(incident.get("step"))
    line = esc(verdict_line(incident))
    hint = (incident.get("evidence") or {}).get("hint")
    if hint:
        line += f'<br><span id="hint">{esc(hint)}</span>'
    rerun = (incident.get("evidence") or {}).get("rerun")
    if isinstance(rerun, dict) and rerun.get("line"):
        line += f'<br><span id="rerun">Re-run: {esc(rerun["line"])}</span>'
        strikes = rerun.get("strikes") or {}
        if strikes.get("transient"):
            steps = ", ".join(map(str, strikes.get("transient_steps") or []))
            line += (f'<br><span id="strikes">Rank {esc(rerun.get("rank"))} had {esc(strikes["transient"])} '
                     f'transient anomaly(ies) in this run so far (steps {esc(steps)})</span>')
    return (f'{line}<span hidden> rank <strong id="first-rank">{rank}</strong> step '
            f'<strong id="first-step">{step}</strong></span>')


def _proof(incident: dict, history: dict | None) -> str:
    det = incident.get("detector")
    out = [proof.stats_table(incident, history)]
    if det == "replica":
        out.append("<h3>Checksums, grouped by value</h3>" + findings.replica_groups(incident))
    elif det == "outlier":
        out.append("<h3>Robust score against the threshold</h3>" + findings.outlier_scores(incident))
    elif det == "progress":
        out.append("<h3>Who failed first</h3>" + findings.failure_table(incident))
        svg = failure_timeline_svg(incident)
        if svg:
            out.append(f'<figure id="failure-timeline">{svg}<figcaption>When each rank reached its last '
                       "collective and when its process ended, beside the incident's states.</figcaption></figure>")
    window = proof.window_table(incident, history)
    if window:
        out.append("<h3>The same tensor on every rank, steps around the divergence</h3>" + window)
    return "".join(out)


def _pictures(incident: dict, history: dict | None) -> str:
    if not history or not history.get("ranks"):
        return muted("No step history was recorded for this incident.", "heatmap")
    out = []
    heat = plots.heatmap_svg(history, incident)
    if heat:
        out.append(f'<figure id="heatmap" data-step="{esc(incident.get("step"))}">{heat}<figcaption>Every rank '
                   "(rows) at every kept step (columns) up to the verdict: how far its loss, local gradient and "
                   "activation norms were from the group median.</figcaption></figure>")
    for key in ("loss", "grad_norm"):
        svg = plots.curve_svg(history, incident, key)
        if svg:
            out.append(f'<figure id="curve-{key}" class="curve-plot" data-metric="{key}">{svg}</figure>')
    scale = history.get("loss_scale")
    svg = plots.scale_svg(scale, incident) if scale else None
    if svg:
        what = ("the streak of them is this verdict's finding" if incident.get("detector") == "loss_scale" else
                "under a loss scale that is healthy float16 training, not a finding")
        out.append(f'<figure id="curve-loss-scale" class="curve-plot" data-metric="loss_scale">{svg}<figcaption>'
                   f'The loss scale the job multiplied its loss by ({scale["overflow_steps"]} overflow step(s) in all, '
                   f"marked: gradients overflowed and the update was skipped; {what}).</figcaption></figure>")
    return "".join(out) or muted("Nothing to plot.")


def _template() -> str:
    return resources.files("rankscope.coordinator.report").joinpath("template.html").read_text(encoding="utf-8")


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("rankscope")
    except Exception:  # not installed (run from a source tree)
        return "(source)"


def _window(history: dict | None, step: Any) -> dict | None:
    if not history or not history.get("ranks") or not history.get("steps"):
        return history
    n_ranks, steps = len(history["ranks"]), history["steps"]
    keep = max(1, MAX_CELLS // n_ranks)
    if len(steps) <= keep:
        return history
    centre = steps.index(step) if step in steps else len(steps) - 1
    lo = max(0, min(centre - keep // 2, len(steps) - keep))
    sl = slice(lo, lo + keep)
    out = dict(history, steps=steps[sl])
    for key in ("loss", "grad_norm", "deviation"):
        out[key] = [row[sl] for row in history[key]]
    return out

