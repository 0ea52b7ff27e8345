"""Render ``incidents/<id>/report.html`` from incident.json (+ history.json).

The page is one file with everything inline (data as JSON, a small script that
draws the heatmap and curves as SVG), so it opens from a bundle on a machine
with no network. Values from the run are HTML-escaped; the JSON block is
escaped so no ``</script>`` in a tensor name can end it.
"""
from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

from rankscope.coordinator.report.history import NONFINITE_DEVIATION, load_history
from rankscope.wire.atomic import atomic_write_bytes
from rankscope.wire.layout import bundle_dirs

REPORT_FILE = "report.html"
#: Heatmap cap: beyond this many cells the step window is narrowed around the
#: divergence, so a 1024-rank job still gives a page a browser opens quickly.
MAX_CELLS = 24_000


def render_report(incident_dir: Path | str, history: dict | None = None) -> Path:
    """Write report.html into ``incident_dir`` and return its path."""
    incident_dir = Path(incident_dir)
    inc_path = incident_dir / "incident.json"
    if not inc_path.is_file():
        raise FileNotFoundError(f"{inc_path}: no incident.json, not an incident directory")
    incident = json.loads(inc_path.read_text())
    if history is None:
        history = load_history(incident_dir)
    history = _window(history, incident.get("step"))
    first_rank, step = incident.get("first_diverging_rank"), incident.get("step")
    data = {"first_rank": first_rank, "step": step, "history": history,
            "nonfinite": NONFINITE_DEVIATION}
    fields = {
        "incident_id": incident.get("incident_id", incident_dir.name),
        "first_rank": first_rank, "step": step, "tensor": incident.get("tensor"),
        "detector": incident.get("detector"), "detected_at": incident.get("detected_at"),
        "job": incident.get("job", ""), "ties": incident.get("ties", []),
    }
    page = _template()
    for key, val in fields.items():
        page = page.replace("{{" + key + "}}", html.escape(str(val)))
    page = page.replace("{{evidence_table}}", _evidence_table(incident.get("evidence") or {}))
    page = page.replace("{{ranks_table}}", _ranks_table(incident.get("ranks") or {}))
    page = page.replace("{{bundle_table}}", _bundle_table(incident_dir, incident.get("bundles") or {},
                                                          incident.get("missing_bundles") or []))
    page = page.replace("{{data_json}}", _script_json(data))
    out = incident_dir / REPORT_FILE
    atomic_write_bytes(out, page.encode("utf-8"))
    return out


def _template() -> str:
    return resources.files("rankscope.coordinator.report").joinpath("template.html").read_text(encoding="utf-8")


def _script_json(obj: Any) -> str:
    text = json.dumps(obj, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


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


def _cell(val: Any) -> str:
    if isinstance(val, (dict, list)):
        text = json.dumps(val, default=str)
        if len(text) > 2000:
            text = text[:2000] + " ..."
        return f"<code>{html.escape(text)}</code>"
    return html.escape(str(val))


def _evidence_table(evidence: dict) -> str:
    if not evidence:
        return '<p class="muted" id="evidence">No evidence recorded.</p>'
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{_cell(v)}</td></tr>" for k, v in evidence.items())
    return f'<table id="evidence"><tbody>{rows}</tbody></table>'


def _ranks_table(ranks: dict | list) -> str:
    items = ranks.items() if isinstance(ranks, dict) else enumerate(ranks)
    rows = []
    for rank, info in items:
        info = info if isinstance(info, dict) else {"state": info}
        rows.append(f'<tr data-rank="{html.escape(str(rank))}"><td>{html.escape(str(rank))}</td>'
                    f"<td>{_cell(info.get('state', ''))}</td><td>{_cell(info.get('step', ''))}</td></tr>")
    if not rows:
        return '<p class="muted" id="ranks">No rank states recorded.</p>'
    return ('<table id="ranks"><thead><tr><th>rank</th><th>state</th><th>step</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def _bundle_table(incident_dir: Path, bundles: dict, missing: list) -> str:
    """Every rank's bundle as it is on disk; a rank whose bundle never completed is
    marked incomplete (some files arrived) or missing (nothing did)."""
    incomplete = {str(r) for r in missing}
    rows = []
    seen = set()
    for rank, rank_dir in bundle_dirs(incident_dir):
        files = sorted(f for f in rank_dir.rglob("*") if f.is_file() and not f.name.startswith("."))
        size = sum(f.stat().st_size for f in files)
        seen.add(rank)
        cls = "bundle incomplete" if rank in incomplete else "bundle"
        rows.append(f'<tr class="{cls}" data-rank="{html.escape(rank)}"><td>{html.escape(rank)}</td>'
                    f"<td><code>{html.escape(rank_dir.name)}/</code></td><td>{len(files)}</td>"
                    f"<td>{size}{' (incomplete)' if rank in incomplete else ''}</td></tr>")
    for rank in sorted({str(r) for r in bundles} | incomplete, key=str):
        if rank not in seen:
            rows.append(f'<tr class="bundle missing" data-rank="{html.escape(rank)}">'
                        f"<td>{html.escape(rank)}</td><td>{_cell(bundles.get(rank, ''))}</td><td>0</td>"
                        "<td>missing</td></tr>")
    if not rows:
        return '<p class="muted" id="bundles">No bundles were received.</p>'
    return ('<table id="bundles"><thead><tr><th>rank</th><th>directory</th><th>files</th><th>bytes</th>'
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")
