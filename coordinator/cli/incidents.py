"""rankscope incidents DIR [ID] [--open]: past incidents of an export folder, offline.

Without ID: one line per incident (id, detector, rank, step, when, state). With ID (the
full id or any unique part of it): that incident's verdict and where its files are;
--open also opens its report.html in the browser (rendering it first if missing).
"""
from __future__ import annotations

import argparse
import json
import sys
import webbrowser
from pathlib import Path

from rankscope.coordinator.launch.progress import format_verdict
from rankscope.coordinator.report.listing import find_incident, list_incidents


def _table(entries: list) -> str:
    rows = [("incident", "detector", "rank", "step", "detected", "state", "tensor")]
    for e in entries:
        rows.append((e.incident_id, e.detector or "?", str(e.rank), str(e.step), str(e.detected_at or "—")[:23],
                     (e.state or "?") + ("" if e.written else " (no incident.json)") + (f" {e.problem}" if e.problem
                                                                                         else ""),
                     e.tensor or "—"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rankscope incidents", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="an export folder (or its incidents/ folder)")
    ap.add_argument("id", nargs="?", help="show this incident (its id, or a unique part of it)")
    ap.add_argument("--open", action="store_true", help="open the incident's report.html in a browser")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    if not args.dir.exists():
        print(f"rankscope incidents: {args.dir}: no such folder", file=sys.stderr)
        return 2
    if args.id is None and not args.open:
        entries = list_incidents(args.dir)
        if args.json:
            print(json.dumps([e.to_dict() for e in entries], indent=1))
        elif not entries:
            print(f"no incidents under {args.dir}")
        else:
            print(_table(entries))
        return 0
    try:
        entry = find_incident(args.dir, args.id or "")
    except LookupError as exc:
        print(f"rankscope incidents: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(entry.to_dict(), indent=1))
    elif entry.written:
        doc = json.loads((entry.dir / "incident.json").read_text(encoding="utf-8"))
        doc["dir"] = str(entry.dir)
        print(format_verdict(doc).lstrip("\n"))
        print(f"  detected : {entry.detected_at}; state {entry.state}")
    else:
        print(f"{entry.incident_id}: {entry.detector} rank {entry.rank} step {entry.step} [{entry.state}]; "
              f"incident.json was never written (state.json only) in {entry.dir}")
    if args.open:
        return _open(entry.dir)
    return 0


def _open(d: Path) -> int:
    report = d / "report.html"
    if not report.is_file() and (d / "incident.json").is_file():
        from rankscope.coordinator.report.render import render_report
        report = render_report(d)
    if not report.is_file():
        print(f"rankscope incidents: {d} has no report.html and no incident.json to render one from",
              file=sys.stderr)
        return 1
    opened = False
    try:
        opened = webbrowser.open(report.resolve().as_uri())
    except webbrowser.Error:
        pass
    print(f"{'opened' if opened else 'open this file in a browser'}: {report}")
    return 0
