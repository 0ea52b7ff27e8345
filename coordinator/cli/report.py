"""``rankscope report DIR``: re-render report.html for one incident directory, or for
every incident under an export directory."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rankscope.coordinator.report.listing import incident_dirs as _all_dirs
from rankscope.coordinator.report.render import render_report


def incident_dirs(path: Path) -> list[Path]:
    return [d for d in _all_dirs(path) if (d / "incident.json").is_file()]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rankscope report", description=__doc__.replace("``", ""))
    ap.add_argument("dir", type=Path, help="an incident directory, or an export directory")
    args = ap.parse_args(argv)
    dirs = incident_dirs(args.dir)
    if not dirs:
        print(f"rankscope report: no incident.json under {args.dir}", file=sys.stderr)
        return 2
    status = 0
    for d in dirs:
        try:
            print(render_report(d))
        except (OSError, ValueError) as exc:
            print(f"rankscope report: {d}: {exc}", file=sys.stderr)
            status = 1
    return status
