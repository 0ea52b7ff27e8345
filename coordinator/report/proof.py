"""The verdict's proof for the named tensor: each rank's statistics at the verdict step
beside the group median and the rule's threshold, and the same tensor over the steps
around the divergence on every rank.

Both come from history.json's ``tensor_window`` (every rank's record as the coordinator
judged it); without one (an older incident, a verdict with no tensor) the rank's own
statistics from the evidence are shown and the page says what is missing.
"""
from __future__ import annotations

from typing import Any

from rankscope.coordinator.report.fmt import as_float, esc, muted, num, num_cell, table, text_cell

STATS = ("Max", "Min", "Mean", "Norm")
NAMED = " \u2190 named"


def suspects(incident: dict) -> tuple[Any, set[str]]:
    """(the named rank as text, the tied ranks as text)."""
    if incident.get("decided") is False:  # nobody named: the ranks that disagree are shown alike
        return "", {str(t) for t in incident.get("undecided_between") or []}
    return str(incident.get("first_diverging_rank")), {str(t) for t in incident.get("ties") or []}


def _row_class(rank: Any, first: str, ties: set[str]) -> str:
    r = str(rank)
    return "faulty" if r == first else "tie" if r in ties else ""


def key_stat(incident: dict) -> str:
    """The statistic the rule judged: |loss| is the Mean of a loss record, else the Norm;
    a replica finding is about the checksum."""
    if incident.get("detector") in ("replica", "param_moved"):
        return "crc32"
    ev = incident.get("evidence") or {}
    if ev.get("value") == "|loss|" or incident.get("kind") == "loss":
        return "Mean"
    return "Norm"


def threshold_cells(incident: dict, fields: list[str]) -> dict[str, str]:
    """Per column, the rule's threshold in words and numbers (only where the rule looks)."""
    det, ev = incident.get("detector"), incident.get("evidence") or {}
    out: dict[str, str] = {}
    if det == "nan_origin":
        out.update(nan="> 0", inf="> 0")
    elif det == "outlier":
        th = ev.get("thresholds") or {}
        med, ratio = as_float(ev.get("group_median")), as_float(th.get("effective_ratio"))
        col = key_stat(incident)
        if med is not None and ratio is not None:
            # The rule's median is taken over log values (a geometric median); with an even
            # number of ranks it differs from the plain median the table shows, so say which.
            out[col] = (f"> {num(med * ratio)} or < {num(med / ratio)} "
                        f"(the group's median on a log scale, {num(med)}, \u00d7/\u00f7 {num(ratio)})")
        out["_note"] = f"and robust z > {num(th.get('z'))}"
    elif det == "replica":
        out["crc32"] = f"= {ev.get('majority_crc32') or 'majority'} (bit for bit)"
        for s in STATS:
            out[s] = "= majority"
    elif det == "param_moved":
        out["crc32"] = f"= {ev.get('crc32_after_last_update') or 'its value'} (what its last update left)"
    elif det == "watchpoint":
        out["_note"] = str(ev.get("rule") or ev.get("condition") or "")
    return {k: v for k, v in out.items() if k == "_note" or k in fields}


def _window_at(history: dict | None, step: Any) -> tuple[dict | None, int | None]:
    w = (history or {}).get("tensor_window")
    if not w or step not in (w.get("steps") or []):
        return w, None
    return w, w["steps"].index(step)


def stats_table(incident: dict, history: dict | None) -> str:
    """Every rank's Max/Min/Mean/Norm/NaN/Inf(/CRC-32) of the named tensor at the step."""
    tensor, step = incident.get("tensor"), incident.get("step")
    if not tensor:
        why = ("an operator's export" if incident.get("detector") == "manual"
               else "a rank stopped or fell behind: see the failure table")
        return muted(f"This verdict names no tensor ({why}); the heatmap and curves below show every rank.",
                     "stats-none")
    w, j = _window_at(history, step)
    first, ties = suspects(incident)
    if w is None or j is None:
        return _evidence_only(incident, first)
    fields = list(w["fields"])
    show = [*STATS, "nan", "inf"] + (["crc32"] if any(
        row[j] and row[j][fields.index("crc32")] for row in w["values"]) else [])
    idx = {f: fields.index(f) for f in show}
    head = ["rank", *("NaN count" if f == "nan" else "Inf count" if f == "inf" else
                      "CRC-32" if f == "crc32" else f for f in show)]
    rows = []
    for rank, series in sorted(zip(w["ranks"], w["values"]), key=lambda t: int(t[0])):
        rec = series[j]
        cls = _row_class(rank, first, ties)
        cells = "".join(_value_cell(f, None if rec is None else rec[idx[f]]) for f in show)
        named = NAMED if cls == "faulty" else ""
        rows.append(f'<tr class="{cls}" data-rank="{esc(rank)}"><th>rank {esc(rank)}{named}</th>{cells}</tr>')
    med = (w.get("median") or [None] * len(w["steps"]))[j]
    med_cells = "".join(num_cell(med[STATS.index(f)] if med and f in STATS else None) if f in STATS
                        else text_cell("") for f in show)
    rows.append(f'<tr class="median"><th>group median ({esc(w.get("ranks_in_group", len(w["ranks"])))} ranks)</th>'
                f"{med_cells}</tr>")
    th = threshold_cells(incident, show)
    th_cells = "".join(f'<td class="threshold">{esc(th[f])}</td>' if f in th else "<td></td>" for f in show)
    rows.append(f'<tr class="threshold"><th>rule: flagged when</th>{th_cells}</tr>')
    note = th.get("_note")
    caption = f"{tensor} at step {step}" + (f" ({w.get('kind')})" if w.get("kind") else "")
    return table("stats", head, rows, caption) + (f'<p class="muted">{esc(note)}</p>' if note else "")


def _value_cell(field: str, value: Any) -> str:
    if field == "crc32":
        return f'<td class="crc" data-value="{esc(value or "")}"><code>{esc(value or "—")}</code></td>'
    cls = "hot" if field in ("nan", "inf") and isinstance(value, int) and value > 0 else ""
    return num_cell(value, cls)


def _evidence_only(incident: dict, first: str) -> str:
    ev = incident.get("evidence") or {}
    rows = []
    for label, stats in (("rank " + first, ev.get("stats")), ("majority", ev.get("majority_stats"))):
        if isinstance(stats, dict):
            rows.append(f'<tr class="{"faulty" if label != "majority" else "median"}"><th>{esc(label)}</th>'
                        + "".join(num_cell(stats.get(s)) for s in STATS) + "</tr>")
    note = muted("The other ranks' values of this tensor were not kept for this incident "
                 "(history.json has no tensor window at this step).", "stats-partial")
    if not rows:
        return note
    return table("stats", ["", *STATS], rows, f"{incident.get('tensor')} at step {incident.get('step')}") + note


def window_table(incident: dict, history: dict | None) -> str:
    """The named tensor's judged statistic on every rank over the kept steps around it."""
    w = (history or {}).get("tensor_window")
    if not incident.get("tensor"):
        return ""
    if not w:
        return muted("No steps around the divergence were kept for this tensor.", "window-none")
    fields, step = list(w["fields"]), incident.get("step")
    stat = key_stat(incident)
    if stat == "crc32" and not any(rec and rec[fields.index("crc32")] for s in w["values"] for rec in s):
        stat = "Norm"
    k, nan_i, inf_i = fields.index(stat), fields.index("nan"), fields.index("inf")
    first, ties = suspects(incident)
    head = ["rank"] + [f"step {s}" for s in w["steps"]]
    rows = []
    for rank, series in sorted(zip(w["ranks"], w["values"]), key=lambda t: int(t[0])):
        cells = []
        for s, rec in zip(w["steps"], series):
            div = " div-step" if s == step else ""
            if rec is None:
                cells.append(f'<td class="num missing{div}" data-step="{esc(s)}" data-value="">\u2014</td>')
                continue
            bad = (rec[nan_i] or 0) + (rec[inf_i] or 0)
            title = ", ".join(f"{f} {num(v)}" for f, v in zip(fields, rec) if v is not None)
            text = rec[k] if stat == "crc32" else num(rec[k])
            extra = f' <span class="count">({num(rec[nan_i])} NaN)</span>' if rec[nan_i] else ""
            extra += f' <span class="count">({num(rec[inf_i])} Inf)</span>' if rec[inf_i] else ""
            cls = "num" + (" nonfinite" if bad else "") + div
            cells.append(f'<td class="{cls}" data-step="{esc(s)}" data-value="{esc(rec[k])}" '
                         f'title="{esc(title)}">{esc(text)}{extra}</td>')
        rows.append(f'<tr class="{_row_class(rank, first, ties)}" data-rank="{esc(rank)}">'
                    f"<th>rank {esc(rank)}</th>{''.join(cells)}</tr>")
    if stat != "crc32":
        si = STATS.index(stat)
        med = [num_cell(m[si] if m else None, "div-step" if s == step else "")
               for s, m in zip(w["steps"], w.get("median") or [])]
        rows.append(f'<tr class="median"><th>group median</th>{"".join(med)}</tr>')
    more = w.get("ranks_in_group", len(w["ranks"])) - len(w["ranks"])
    note = muted(f"{more} more rank(s) of the group are not listed.") if more > 0 else ""
    label = "CRC-32" if stat == "crc32" else stat
    return table("window", head, rows, f"{label} of {w['tensor']}, steps {w['steps'][0]}\u2013{w['steps'][-1]}") + note
