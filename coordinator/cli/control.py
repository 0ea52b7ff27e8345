"""``rankscope status|pause|resume|step N|terminate|export|collect`` against a running coordinator.

Connects to the Ray cluster (``--address``; default: the one recorded by the rankscope
job running on this machine, see :mod:`~rankscope.coordinator.server.job_index`) and
finds the coordinator actor by name (``--name``; default: the job's, else the only actor
named ``rankscope*`` in ``--namespace``). ``main(argv)`` gets the verb as ``argv[0]``
(the dispatcher puts it there).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rankscope.coordinator.launch.progress import shown
from rankscope.coordinator.logic.views.coverage import describe
from rankscope.coordinator.server.actor import DEFAULT_NAMESPACE

VERBS = ("status", "pause", "resume", "step", "terminate", "export", "collect")


def build_parser(verb: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"rankscope {verb}")
    add_reach_options(ap)
    ap.add_argument("--json", action="store_true", help="print the coordinator's answer as JSON")
    ap.add_argument("--timeout", type=float, default=30.0,
                    help="seconds to wait for the coordinator (default: %(default)s)")
    if verb == "step":
        ap.add_argument("n", type=int, help="run N more steps, then pause again")
    if verb == "collect":
        ap.add_argument("--steps", default=None, help="steps to collect: 3, 2-5 or 1,4-6 (default: all)")
        ap.add_argument("--ranks", default=None, help="comma-separated rank ids (default: all)")
        ap.add_argument("--no-wait", action="store_true", help="start the collection and return")
    return ap


def format_status(st: dict) -> str:
    ranks = st.get("ranks") or {}
    # With ingest shards the records go to them (most never pass the verdict actor).
    records = st.get("records", 0) if "shards" in st else st.get("metrics", {}).get("records_ingested", 0)
    lines = [f"coordinator {shown(st.get('endpoint'))}  job {st.get('job') or '(any)'}  "
             f"agents {st.get('peers', 0)}  records {records}  "
             f"last judged step {shown(st.get('last_judged_step'))}  lag {st.get('lag_steps', 0):g} step(s)"
             + ("  TERMINATED" if st.get("terminated") else "")]
    if ranks:
        lines.append("ranks: " + ", ".join(f"{r}:{shown(v.get('state'))}@{shown(v.get('step'))}"
                                             for r, v in sorted(ranks.items(), key=lambda kv: int(kv[0]))))
    else:
        lines.append("ranks: none attached")
    # What was judged, beside the incident count: on the multi-node path this command is
    # where a user reads the verdict, and "incidents: 0" alone would also be said of
    # steps nobody saw.
    coverage = st.get("coverage") or {}
    for job, report in sorted(coverage.items()):
        lines.append(("coverage: " if len(coverage) == 1 else f"coverage (job {job}): ") + describe(report))
    jobs = st.get("jobs") or {}
    for job, j in sorted(jobs.items()):
        line = (j.get("layout") or {}).get("line")
        if line:
            lines.append(("layout: " if len(jobs) == 1 else f"layout (job {job}): ") + line)
    incs = st.get("incidents") or []
    lines.append(f"incidents: {len(incs)}")
    for inc in incs:
        who = (f"rank {shown(inc.get('first_diverging_rank'))}" if inc.get("decided", True)
               else "undecided between ranks " + ", ".join(map(str, inc.get("undecided_between") or [])))
        lines.append(f"  {inc.get('incident_id')}: {shown(inc.get('detector'))} "
                     f"{who} step {shown(inc.get('step'))} "
                     f"tensor {shown(inc.get('tensor'))} [{shown(inc.get('state'))}] {inc.get('dir') or ''}".rstrip())
    if st.get("collect"):
        lines.append("collect: " + format_collect(st["collect"]))
    return "\n".join(lines)


def format_collect(p: dict) -> str:
    return (f"{len(p['finished_ranks'])}/{len(p['expected_ranks'])} ranks done, {p['files']} files, "
            f"{p['bytes'] / 1e6:.1f} MB in {p['elapsed_s']:.1f} s -> {p['dest']}"
            + (f"; {len(p['problems'])} problem(s)" if p.get("problems") else ""))


def _ranks(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"rankscope collect: --ranks {text!r} must be comma-separated integers") from None
    if any(r < 0 for r in out):
        raise SystemExit(f"rankscope collect: --ranks {text!r} has a negative rank id")
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in VERBS:
        print(f"usage: rankscope {{{'|'.join(VERBS)}}} [options]", file=sys.stderr)
        return 2
    verb, rest = argv[0], argv[1:]
    args = build_parser(verb).parse_args(rest)
    if verb == "step" and args.n < 1:
        print(f"rankscope step: N must be >= 1, got {args.n}", file=sys.stderr)
        return 2
    from rankscope.coordinator.server.client import CoordinatorError
    coord = reach_or_say(verb, args)
    if coord is None:
        return 1
    try:
        if verb == "status":
            st = coord.status(timeout=args.timeout)
            print(json.dumps(st, default=str) if args.json else format_status(st))
            return 0
        cargs: dict[str, Any] = {"job": args.job} if args.job else {}
        if verb == "step":
            cargs["n"] = args.n
        if verb == "collect":
            cargs.update(steps=args.steps, ranks=_ranks(args.ranks))
        answer = coord.control(verb, cargs, timeout=args.timeout)
    except ValueError as exc:  # the coordinator refused the arguments
        print(f"rankscope {verb}: {exc}", file=sys.stderr)
        return 2
    except CoordinatorError as exc:
        print(f"rankscope {verb}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, default=str) if args.json else _describe(verb, answer))
    if verb == "collect" and not args.no_wait:
        return _follow_collect(coord, args.timeout)
    return 0


def add_reach_options(ap: argparse.ArgumentParser) -> None:
    """How a command finds a running job's coordinator (shared by the console)."""
    ap.add_argument("--address", default=None,
                    help="Ray cluster address (default: the cluster of the rankscope job running on this "
                         "machine, --job picking one when there are several)")
    ap.add_argument("--name", default=None, help="coordinator actor name (default: the only rankscope* actor)")
    ap.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="Ray namespace (default: %(default)s)")
    ap.add_argument("--verbose", action="store_true", help="also show Ray's own log lines")
    ap.add_argument("--job", default=None, help="job id, when the coordinator serves several")


def reach(args: argparse.Namespace) -> Any:
    """The running job's Coordinator, found as ``rankscope status`` finds it: ``--address``,
    else the job index of this machine (which also fills ``args.export_dir`` when the
    command has that option unset). CoordinatorError or NoSuchJob naming what is missing."""
    from rankscope.coordinator.server.client import Coordinator, connect_ray
    from rankscope.coordinator.server.job_index import pick
    if args.address is None and not _ray_connected():
        rec = pick(args.job)
        args.address, args.namespace = rec.address, rec.namespace
        args.name = args.name or rec.name
        if getattr(args, "export_dir", "unset") is None:
            args.export_dir = rec.export_dir
    connect_ray(args.address, args.namespace, verbose=args.verbose)
    return Coordinator.find(args.name, args.namespace, job=args.job)


def reach_or_say(verb: str, args: argparse.Namespace) -> Any:
    """:func:`reach`, or None once stderr says why the job's coordinator was not found."""
    from rankscope.coordinator.server.client import CoordinatorError
    from rankscope.coordinator.server.job_index import NoSuchJob
    try:
        return reach(args)
    except (CoordinatorError, NoSuchJob) as exc:
        print(f"rankscope {verb}: {exc}", file=sys.stderr)
        return None


def _ray_connected() -> bool:
    """Called in a process already on a Ray cluster (a notebook, a test): use that one."""
    import ray
    return ray.is_initialized()


def _describe(verb: str, a: dict) -> str:
    if verb == "export":
        return f"export started: incident {a.get('incident')} -> {a.get('dir')}"
    if verb == "collect":
        return f"collect {a.get('transfer')} sent to {a.get('sent_to_agents')} agent(s) -> {a.get('dest')}"
    return f"{verb} sent to {a.get('sent_to_agents')} node agent(s) (job {a.get('job') or '?'})"


def _follow_collect(coord: Any, timeout: float) -> int:
    """Print progress until every expected rank says it is done (or nothing moves for ``timeout``)."""
    last, last_change = None, time.monotonic()
    while True:
        p = (coord.status(timeout=30) or {}).get("collect") or {}
        key = (p.get("files"), p.get("bytes"), tuple(p.get("finished_ranks", ())))
        if key != last:
            print(format_collect(p) if p else "waiting for the coordinator", flush=True)
            last, last_change = key, time.monotonic()
        if p.get("done"):
            return 0 if not p.get("problems") else 1
        if time.monotonic() - last_change > timeout:
            print(f"rankscope collect: no progress for {timeout:.0f} s; run it again to resume", file=sys.stderr)
            return 1
        time.sleep(0.5)
