"""``rankscope analyze DUMP_ROOT [DUMP_ROOT ...]``: the live detectors over msProbe dump
trees made elsewhere (MindSpore or PyTorch; statistics, md5 or tensor task; L0, L1, mix;
rankscope's own ``collect`` tree), with the incident folder, report.html and verdict a
live run gives.

Exit status: 0 no divergence found; 86 a divergence was found (an incident was written);
87 no divergence found but part of the tree could not be read (the line says which);
2 the arguments were refused (nothing was analysed).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rankscope.config.errors import ConfigError
from rankscope.config.file import read_config_file
from rankscope.coordinator.launch.progress import format_verdict, shown, undecided, what_of
from rankscope.coordinator.launch.watched import INCIDENT_EXIT, UNWATCHED_EXIT
from rankscope.coordinator.offline.run import Analysis, Analyzer
from rankscope.coordinator.offline.tree import TreeError, find_dumps
from rankscope.files.atomic import atomic_write_bytes
from rankscope.text.spans import rank_span

SUMMARY_FILE = "analysis.json"
#: Unread dumps listed in analysis.json; the rest are counted.
MAX_LISTED = 1000


def say(msg: str) -> None:
    print(f"[rankscope] {msg}", flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rankscope analyze", description=__doc__.split("\n\n")[0].replace("``", ""))
    ap.add_argument("roots", nargs="+", help="msProbe dump_path folders (one per node), step{N} or rank folders")
    ap.add_argument("--out", type=Path, default=Path("rankscope-analysis"),
                    help="where incidents/ and analysis.json go (default ./rankscope-analysis)")
    ap.add_argument("--config", type=Path, help="a config.json whose cluster section applies (layout, groups, detectors)")
    ap.add_argument("--groups", help='replica sets as JSON, e.g. "[[0,2],[1,3]]" (overrides the config\'s)')
    ap.add_argument("--jobs", type=int, default=None, help="processes reading dump files (default: up to 4)")
    args = ap.parse_args(argv)
    try:
        cluster = _cluster(args.config, args.groups)
        tree = find_dumps(args.roots)
        alone = _check_groups(cluster.get("groups"), tree.ranks)
        args.out.mkdir(parents=True, exist_ok=True)
    except (ConfigError, TreeError, OSError, ValueError) as exc:
        print(f"rankscope analyze: {exc}", file=sys.stderr)
        return 2
    for note in tree.notes:
        say(f"note: {note}")
    if alone:
        say(f"note: {rank_span(alone)} {'is' if len(alone) == 1 else 'are'} in no replica set of --groups: "
            "no other rank is expected to hold the same weights")
    steps = tree.steps
    say(f"reading {len(tree.ranks)} rank(s) ({rank_span(tree.ranks)}), {len(steps)} step(s) "
        f"({steps[0]}-{steps[-1]}) from {', '.join(map(str, args.roots))}")
    try:
        result = Analyzer(tree, args.out, cluster, args.jobs, say).run()
    except ConfigError as exc:
        print(f"rankscope analyze: {exc}", file=sys.stderr)
        return 2
    _write_summary(args.out, result)
    return report(result)


def _cluster(config: Path | None, groups: str | None) -> dict[str, Any]:
    section: dict[str, Any] = {}
    if config is not None:
        section = dict(read_config_file(config).get("cluster") or {})
    if groups is not None:
        try:
            section["groups"] = json.loads(groups)
        except ValueError as exc:
            raise ConfigError("--groups", groups, f"not JSON ({exc})") from None
    return section


def _check_groups(groups: Any, ranks: list[int]) -> list[int]:
    """Replica sets naming ranks the tree does not have are refused; the tree's ranks in
    no set are returned (said once)."""
    if not isinstance(groups, list):
        return []
    named = {r for g in groups if isinstance(g, list) for r in g if isinstance(r, int)}
    unknown = sorted(named - set(ranks))
    if unknown:
        raise ConfigError("cluster.groups", groups, f"{rank_span(unknown)} have no dump in the tree "
                                                    f"(it holds {rank_span(ranks)})")
    return sorted(set(ranks) - named)


def report(result: Analysis) -> int:
    """The terminal's lines; the exit status."""
    head = ", ".join(f"{k} {'/'.join(sorted(v))}" for k, v in result.header.items() if v)
    say(f"read in {result.seconds:.1f} s ({head or 'no header'}); {result.replicated} column(s) held alike by "
        "the replicas are judged as replicated")
    found = [i for i in result.incidents if i.get("detector") != "manual"]
    for inc in found:
        split = undecided(inc)
        if split:
            say(f"UNDECIDED: {shown(inc.get('detector'))}: {rank_span(split)} disagree at step "
                f"{shown(inc.get('step'))} ({what_of(inc)}) and nothing tells which is wrong")
        else:
            say(f"DIVERGENCE: {shown(inc.get('detector'))} names rank {shown(inc.get('first_diverging_rank'))} "
                f"at step {shown(inc.get('step'))} ({what_of(inc)})")
    if found:
        print(format_verdict(found[0], "the bundles are the ranks' dump folders of that step"), flush=True)
    ranks, steps = result.tree.ranks, result.steps_read
    span = f"{len(ranks)} rank(s) ({rank_span(ranks)}), steps {steps[0]}-{steps[-1]}" if steps else "no step"
    missed = _not_read_text(result.not_read)
    tail = f"; NOT READ: {missed}" if missed else ""
    if result.interrupted_at is not None:
        tail += f"; INTERRUPTED while reading step {result.interrupted_at}: later steps not analysed"
        missed = missed or "interrupted"
    if found:
        say(f"analysed {span}{tail}")
        return INCIDENT_EXIT
    say(f"no divergence found in {span}{tail}")
    return UNWATCHED_EXIT if missed else 0


def _not_read_text(not_read: dict[int, list[tuple[int, str]]], most: int = 4) -> str:
    """``rank 3: steps 2-3 (no dump for this step)``, one reason per rank, bounded."""
    parts = []
    for r, items in sorted(not_read.items())[:most]:
        steps = [s for s, _ in items]
        where = rank_span(steps).replace("ranks ", "steps ").replace("rank ", "step ")
        parts.append(f"rank {r}: {where} ({_short(items[0][1])}{', ...' if len({w for _, w in items}) > 1 else ''})")
    more = len(not_read) - most
    return "; ".join(parts) + (f"; and {more} more rank(s)" if more > 0 else "")


def _short(why: str) -> str:
    """The fault without the file's path (the rank and step are already said)."""
    why = why.split("dump.json: ", 1)[-1]
    return why if len(why) <= 120 else why[:117] + "..."


def _write_summary(out: Path, result: Analysis) -> None:
    listed = [{"rank": r, "step": s, "why": w} for r, items in sorted(result.not_read.items()) for s, w in items]
    doc = {
        "roots": [str(p) for p in result.tree.roots], "ranks": result.tree.ranks, "steps_read": result.steps_read,
        "header": {k: sorted(v) for k, v in result.header.items()}, "replicated_columns": result.replicated,
        "notes": result.tree.notes, "not_read": listed[:MAX_LISTED], "not_read_total": len(listed),
        "incidents": [i.get("dir") for i in result.incidents], "seconds": round(result.seconds, 3),
    }
    atomic_write_bytes(out / SUMMARY_FILE, json.dumps(doc, indent=1).encode())
