"""Installed size of each rankscope install flavour, and what each adds to MindSpore's own.

Walks the dependency closure of each requirement through the installed distributions'
metadata (nothing is downloaded), so it measures the environment it runs in:

    .venv/bin/python bench/install_footprint.py [REQ ...]
    (default: mindspore rankscope 'rankscope[coordinator]' 'rankscope[coordinator,test]')

Prints one line per requirement and a final JSON line.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import sys

from packaging.requirements import Requirement

DEFAULT = ["mindspore", "rankscope", "rankscope[coordinator]", "rankscope[coordinator,test]"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(spec: str) -> dict[str, md.Distribution]:
    """Every installed distribution ``spec`` needs, extras included."""
    seen: dict[tuple[str, frozenset], md.Distribution] = {}
    todo = [Requirement(spec)]
    while todo:
        req = todo.pop()
        key = (_norm(req.name), frozenset(req.extras))
        if key in seen:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in (req.extras or {""})):
                todo.append(dep)
    return {_norm(d.metadata["Name"]): d for d in seen.values()}


def installed_bytes(dist: md.Distribution) -> int:
    total = 0
    for f in dist.files or []:
        try:
            total += os.path.getsize(dist.locate_file(f))
        except OSError:
            pass
    return total


def main(argv: list[str]) -> int:
    rows = []
    for spec in argv or DEFAULT:
        dists = closure(spec)
        mb = sum(installed_bytes(d) for d in dists.values()) / 1e6
        rows.append({"requirement": spec, "distributions": len(dists), "mb": round(mb)})
    base = next((r["mb"] for r in rows if r["requirement"] == "mindspore"), None)
    for r in rows:
        extra = f"  (+{r['mb'] - base} MB over mindspore)" if base and r["requirement"] != "mindspore" else ""
        print(f"{r['requirement']:<30} {r['distributions']:>4} distributions {r['mb']:>6} MB{extra}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
