"""Detector-specific proof tables: replica checksums grouped by value, outlier scores
against the threshold, the NaN chain, and who failed first in a crash or hang.

Each reads the verdict's evidence (incident.json) and, for the NaN chain, history.json.
Whatever the tables do not show is under "all evidence", formatted, with the raw JSON
one click further for tools.
"""
from __future__ import annotations

import json
from typing import Any

from rankscope.coordinator.report.fmt import as_float, esc, muted, num, num_cell, seconds, table, text_cell, when
from rankscope.coordinator.report.proof import suspects
from rankscope.wire.sync import point_name

#: NaN-chain rows shown before the rest is folded away.
CHAIN_SHOWN = 12


def replica_groups(incident: dict) -> str:
    ev = incident.get("evidence") or {}
    by_rank = ev.get("crc32_by_rank")
    if not isinstance(by_rank, dict) or not by_rank:
        return ""
    groups: dict[Any, list[str]] = {}
    for rank, crc in by_rank.items():
        groups.setdefault(crc, []).append(str(rank))
    majority = ev.get("majority_crc32")
    rows = []
    for crc, ranks in sorted(groups.items(), key=lambda kv: (kv[0] != majority, -len(kv[1]))):
        role = "majority" if crc == majority and ev.get("majority") else "deviating"
        ranks = sorted(ranks, key=int)
        rows.append(f'<tr class="{"median" if role == "majority" else "faulty"}" data-crc="{esc(crc or "")}">'
                    f'<td><code>{esc(crc or "— (no checksum)")}</code></td>'
                    f'<td class="ranks">{esc(", ".join(ranks))}</td>{num_cell(len(ranks))}<td>{role}</td></tr>')
    cap = (f"CRC-32 of {incident.get('tensor')} at step {incident.get('step')}: "
           f"{num(ev.get('agreeing_ranks'))} of {num(ev.get('compared_ranks'))} ranks agree")
    return table("replica-groups", ["CRC-32", "ranks", "count", ""], rows, cap)


def outlier_scores(incident: dict) -> str:
    ev = incident.get("evidence") or {}
    values = ((ev.get("group_values") or {}).get("by_rank")) or {}
    if not values:
        return ""
    z_by_rank = ev.get("robust_z_by_rank") or {}
    th = ev.get("thresholds") or {}
    med, z_max, ratio = as_float(ev.get("group_median")), th.get("z"), as_float(th.get("effective_ratio"))
    first, ties = suspects(incident)
    rows = []
    for rank in sorted(values, key=int):
        v = as_float(values[rank])
        r = None if v is None or not med else v / med
        z = z_by_rank.get(rank, ev.get("robust_z") if rank == first else None)
        zf = as_float(z)
        over = zf is not None and z_max is not None and zf > z_max
        far = r is not None and ratio is not None and (r > ratio or r < 1 / ratio)
        cls = "faulty" if rank == first else "tie" if rank in ties else ""
        rows.append(f'<tr class="{cls}" data-rank="{esc(rank)}"><th>rank {esc(rank)}</th>{num_cell(values[rank])}'
                    f'{num_cell(r)}{num_cell(z, "hot" if over else "")}'
                    f'<td>{"flagged" if over and far else "beyond z only" if over else "—"}</td></tr>')
    rows.append(f'<tr class="threshold"><th>threshold</th><td class="num">median {esc(num(med))}</td>'
                f'<td class="num">\u00d7/\u00f7 {esc(num(ratio))}</td><td class="num">{esc(num(z_max))}</td>'
                f"<td>both must be exceeded</td></tr>")
    cap = (f"{ev.get('value') or 'value'} of {incident.get('tensor')} at step {incident.get('step')}: "
           f"robust z = |log v \u2212 median log| / (1.4826 \u00d7 MAD); rule: {ev.get('rule')}")
    return table("outlier-scores", ["rank", ev.get("value") or "value", "ratio to median", "robust z", ""],
                 rows, cap)


def nan_chain(history: dict | None) -> str:
    chain = (history or {}).get("nonfinite_chain")
    if not chain:
        return ""
    rows = []
    for i, rec in enumerate(chain.get("records") or []):
        ranks = ", ".join(map(str, rec.get("ranks") or []))
        if rec.get("rank_count", 0) > len(rec.get("ranks") or []):
            ranks += f" (+{rec['rank_count'] - len(rec['ranks'])})"
        where = "before reduction" if rec.get("before_reduction") else "after reduction / replicated"
        rows.append(f'<tr class="{"faulty" if i == 0 else ""}" data-step="{esc(rec.get("step"))}">'
                    f'{num_cell(rec.get("step"))}{num_cell(rec.get("exec_index"))}'
                    f'<td><code>{esc(rec.get("tensor"))}</code></td>{text_cell(rec.get("kind"))}<td>{where}</td>'
                    f'<td class="ranks">{esc(ranks)}</td>{num_cell(rec.get("nan"), _hot(rec.get("nan")))}'
                    f'{num_cell(rec.get("inf"), _hot(rec.get("inf")))}{num_cell(rec.get("numel"))}</tr>')
    more = chain.get("more") or 0
    note = muted(f"{more} later non-finite record(s) not listed.") if more else ""
    head = ["step", "exec #", "tensor", "kind", "measured", "ranks", "NaN", "Inf", "elements"]
    out = table("nan-chain", head, rows[:CHAIN_SHOWN],
                f"From the first non-finite record (step {chain.get('from_step')}) to where it spread")
    if len(rows) > CHAIN_SHOWN:
        out += (f"<details><summary>{len(rows) - CHAIN_SHOWN} more record(s)</summary>"
                f"{table('nan-chain-more', head, rows[CHAIN_SHOWN:])}</details>")
    return out + note


def _hot(count: Any) -> str:
    return "hot" if isinstance(count, int) and count > 0 else ""


def failure_table(incident: dict) -> str:
    """Crash/hang: the rank that failed first, then the followers with their delay."""
    ev = incident.get("evidence") or {}
    if incident.get("detector") != "progress":
        return ""
    ranks = incident.get("ranks") or {}
    first = str(incident.get("first_diverging_rank"))
    rows = []
    if "failed_at" in ev or "manner" in ev:
        snap = ranks.get(first) or {}
        role = "stuck (never reached the collective)" if ev.get("reason") == "hang" else "first to fail"
        rows.append(_failure_row(first, role, ev.get("manner"), ev.get("exit_status"), ev.get("signal"),
                                 ev.get("exception"), 0.0, snap, "faulty"))
        for f in ev.get("followers") or []:
            r = str(f.get("rank"))
            how = f.get("exception") or (f"killed by {f['signal']}" if f.get("signal") else
                                         f"exited with status {f.get('exit_status')}"
                                         if f.get("exit_status") is not None else f.get("reason"))
            rows.append(_failure_row(r, "taken down after", how, f.get("exit_status"), f.get("signal"),
                                     f.get("exception"), f.get("delay_s"), ranks.get(r) or {}, ""))
    else:  # missed a deadline or lags the group
        for r, last in sorted((ev.get("last_step") or {}).items(), key=lambda kv: int(kv[0])):
            rows.append(f'<tr class="{"faulty" if r == first else ""}" data-rank="{esc(r)}"><th>rank {esc(r)}</th>'
                        f'<td>{esc(ev.get("rule"))}</td>{num_cell(last)}'
                        f'{num_cell((ev.get("heartbeat_step") or {}).get(r))}</tr>')
        return table("failures", ["rank", "finding", "last step reported", "heartbeat step"], rows,
                     f"Ranks that stopped reporting (step {incident.get('step')} not completed)")
    coll = ev.get("collective") or {}
    cap = (f"Who failed first (after step {incident.get('step')}, its last)" if ev.get("after_last_step") is not None
           else f"Who failed first (step {incident.get('step')} is the first step rank {first} did not complete)")
    if coll:
        cap += (f"; {coll.get('what')} #{coll.get('seq')} of step {coll.get('step')} was reached by "
                f"rank(s) {', '.join(map(str, coll.get('entered') or [])) or '—'}, never by "
                f"{', '.join(map(str, coll.get('never_entered') or [])) or '—'}")
    return table("failures", ["rank", "role", "how", "exit status", "signal", "after the first", "last step",
                              "last collective reached", "died at"], rows, cap)


def _failure_row(rank: str, role: str, how: Any, status: Any, sig: Any, exc: Any, delay: Any, snap: dict,
                 cls: str) -> str:
    sync = snap.get("sync") or {}
    coll = point_name(sync.get("what"), sync.get("seq"), sync.get("step"), sync.get("phase")) if sync else None
    died = when(snap["died_at"]) if snap.get("died_at") else None
    return (f'<tr class="{cls}" data-rank="{esc(rank)}"><th>rank {esc(rank)}</th><td>{esc(role)}</td>'
            f'<td>{esc(how or "—")}{"<br><code>" + esc(exc) + "</code>" if exc and exc != how else ""}</td>'
            f'{num_cell(status)}{text_cell(sig)}<td class="num" data-value="{esc(delay)}">'
            f'{"+" + seconds(delay) if as_float(delay) is not None else "—"}</td>'
            f'{num_cell(snap.get("step"))}{text_cell(coll)}{text_cell(died)}</tr>')


_SHOWN = {"crc32_by_rank", "robust_z_by_rank", "group_values", "followers", "collective", "last_sync",
          "heartbeat_step", "last_step"}


def evidence_details(incident: dict) -> str:
    """Every evidence field, formatted; nested values one level deep; raw JSON folded away."""
    ev = incident.get("evidence") or {}
    if not ev:
        return muted("No evidence recorded.", "evidence")
    rows = []
    for key, val in ev.items():
        if key in _SHOWN:
            continue
        rows.append(f"<tr><th>{esc(key.replace('_', ' '))}</th><td>{_pretty(val)}</td></tr>")
    raw = esc(json.dumps(ev, indent=1, default=str)[:20000])
    return (f'<table id="evidence"><tbody>{"".join(rows)}</tbody></table>'
            f"<details><summary>raw evidence (incident.json)</summary><pre>{raw}</pre></details>")


def _pretty(val: Any) -> str:
    if isinstance(val, dict):
        if not val:
            return "—"
        return ", ".join(f"{esc(k)} {esc(num(v)) if not isinstance(v, (dict, list)) else esc(json.dumps(v))}"
                         for k, v in list(val.items())[:16])
    if isinstance(val, list):
        return esc(", ".join(num(v) if not isinstance(v, (dict, list)) else json.dumps(v) for v in val[:32])) or "none"
    if isinstance(val, float) and val > 1e9:  # an epoch time
        return esc(when(val))
    return esc(num(val))
