"""``rankscope bench ingest``: records/s into a real coordinator actor, and detection latency
(the benchmark itself is :mod:`rankscope.coordinator.server.ingest_bench`)."""
from __future__ import annotations

import argparse
import json
import sys

from rankscope.coordinator.server.ingest_bench import __doc__ as BENCH_DOC
from rankscope.coordinator.server.ingest_bench import run_ingest, run_scale


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rankscope bench", description=BENCH_DOC.replace("``", ""),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True, help="which benchmark")
    ing = sub.add_parser("ingest", help="records/s into a coordinator actor and detection latency")
    ing.add_argument("--ranks", type=int, default=256, help="simulated ranks (default: %(default)s)")
    ing.add_argument("--tensors", type=int, default=128, help="tensors per rank and step (default: %(default)s)")
    ing.add_argument("--steps", type=int, default=20, help="steps per rank (default: %(default)s)")
    ing.add_argument("--nodes", type=int, default=None,
                     help="sender processes, each playing node agents of --ranks-per-node ranks; default min(2, ranks)")
    ing.add_argument("--ranks-per-node", type=int, default=8,
                     help="ranks per simulated node agent: with --shards > 1 it packs their records per shard "
                          "(default: %(default)s)")
    ing.add_argument("--fault-rank", type=int, default=None,
                     help="inject a divergence on this rank to time its detection (default: none)")
    ing.add_argument("--shards", type=int, default=1,
                     help="ingest shard actors of the coordinator (cluster.shards; default: %(default)s)")
    ing.add_argument("--paced-steps", type=int, default=10,
                     help="clean steps sent one every --pace-s, each timed from last frame to judged (default: %(default)s)")
    ing.add_argument("--pace-s", type=float, default=0.5,
                     help="seconds between paced steps: the step rate the coordinator must keep up with "
                          "(default: %(default)s)")
    ing.add_argument("--export-dir", default=None, help="where incidents go (default: a temporary folder)")
    ing.add_argument("--scale", default=None, metavar="R1,R2,...",
                     help="one run per rank count (e.g. 8,64,256,1024), steps sized to --min-records; "
                          "the last line is JSON with every run")
    ing.add_argument("--min-records", type=int, default=500_000,
                     help="with --scale: records each run sends at least (default: %(default)s)")
    args = ap.parse_args(argv)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731 - progress on stderr, JSON on stdout
    if args.scale:
        try:
            sizes = [int(x) for x in args.scale.split(",") if x.strip()]
        except ValueError:
            ap.error(f"--scale {args.scale!r}: expected comma-separated rank counts")
        if not sizes or min(sizes) < 1:
            ap.error(f"--scale {args.scale!r}: rank counts must be >= 1")
        rows = run_scale(sizes, args.tensors, args.min_records, shards=args.shards, log=say)
        print(json.dumps({"scale": rows}), flush=True)
        return 0 if all(r["correct"] for r in rows) else 1
    if args.ranks < 1 or args.tensors < 3 or args.steps < 2:
        ap.error(f"need --ranks >= 1, --tensors >= 3, --steps >= 2 (got {args.ranks}, {args.tensors}, {args.steps})")
    from rankscope.wire.shards import check_shard_count
    try:
        check_shard_count(args.shards, "--shards")
    except ValueError as exc:
        ap.error(str(exc))
    if args.ranks_per_node < 1:
        ap.error(f"--ranks-per-node {args.ranks_per_node}: must be >= 1")
    if not args.pace_s > 0:
        ap.error(f"--pace-s {args.pace_s}: must be > 0 seconds")
    if args.fault_rank is not None and not 0 <= args.fault_rank < args.ranks:
        ap.error(f"--fault-rank {args.fault_rank} is not in [0, {args.ranks})")
    out = run_ingest(args.ranks, args.tensors, args.steps, nodes=args.nodes, fault_rank=args.fault_rank,
                     export_dir=args.export_dir, shards=args.shards, paced=args.paced_steps,
                     pace_s=args.pace_s, ranks_per_node=args.ranks_per_node, log=say)
    print(json.dumps(out), flush=True)
    return 0 if out["correct"] else 1
