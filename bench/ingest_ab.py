"""A/B of ``rankscope bench ingest`` end to end: a base commit's coordinator against the
working tree's, alternating in one run, each in its own private Ray.

Both sides run this tree's benchmark harness (``ingest_bench.py``, ``cli/bench.py``) so the
load is the same; on the base side the harness polls the full ``status()`` (a base
without a brief status has nothing else) and its senders keep libzmq's default send
queue. Everything else (wire decoding, sockets, front end, core, shards) is the base's.

    .venv/bin/python bench/ingest_ab.py --base main -n 1 -- --ranks 4096 --tensors 128 --steps 6
    .venv/bin/python bench/ingest_ab.py --base main -n 1 -- --ranks 16384 --tensors 128 --steps 3 \\
        --paced-steps 5 --pace-s 2

Printed per run: records sent/lost, records/s, judge latency median/p99 of the paced
steps, detection latency, peak RSS per shard. The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from logic_ab import REPO, _tree  # bench/logic_ab.py

_HARNESS = ("coordinator/server/ingest_bench.py", "coordinator/cli/bench.py")
#: What the harness asks of the coordinator that a base may not have.
_BASE_COMPAT = (("status(brief=True)", "status()"), (", sndhwm=0, heartbeat=False)", ")"))
_KEYS = ("records", "records_lost", "records_per_s", "judge_latency_ms_median", "judge_latency_ms_p99",
         "detect_latency_ms", "first_step_judged_ms", "correct", "detector", "flagged_rank", "flagged_step",
         "vs_inprocess")


def _overlay_harness(tree: Path) -> None:
    for rel in _HARNESS:
        text = (REPO / rel).read_text()
        for old, new in _BASE_COMPAT:
            text = text.replace(old, new)
        (tree / "rankscope" / "coordinator" / rel.split("/", 1)[1]).write_text(text)


def _run(tree: Path, bench_args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = "import sys; from rankscope.cli import main; sys.exit(main(sys.argv[1:]))"
    res = subprocess.run([sys.executable, "-c", code, "bench", "ingest", *bench_args], env=env,
                         capture_output=True, text=True)
    lines = res.stdout.strip().splitlines()
    if not lines:
        return {"error": res.stderr.strip().splitlines()[-1:] or [f"exit {res.returncode}"]}
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="git revision to compare with (default: %(default)s)")
    ap.add_argument("-n", type=int, default=1, help="rounds, each runs base then new (default: %(default)s)")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: arguments of rankscope bench ingest")
    args = ap.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.base], check=True,
                         capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rankscope-ab-") as tmp:
        trees = {"base": _tree(Path(tmp) / "base", args.base), "new": _tree(Path(tmp) / "new", None)}
        _overlay_harness(trees["base"])
        for i in range(args.n):
            for side in ("base", "new"):
                out = _run(trees[side], bench_args)
                row = {"side": side, "rev": rev if side == "base" else "working tree", "round": i,
                       **{k: out.get(k) for k in _KEYS},
                       "peak_rss_mb": [s.get("peak_rss_mb") for s in out.get("per_shard", [])],
                       "per_shard_records_per_s": [s.get("records_per_s") for s in out.get("per_shard", [])]}
                if "error" in out:
                    row["error"] = out["error"]
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"bench_args": bench_args, "runs": rows}))


if __name__ == "__main__":
    main()
