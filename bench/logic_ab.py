"""A/B of the coordinator's in-process ingest: a base commit against the working tree, in one run.

Each side is its own copy of ``agent/`` + ``coordinator/`` laid out as the ``rankscope``
package (the base from ``git archive``), imported by a child process through
``PYTHONPATH``; the children alternate ``-n`` times so both see the same machine load.
The workload is what one coordinator (or one ingest shard) does per frame: decode a
STEP frame (``protocol.Decoder``), build the StepBatch, ``on_steps`` + ``tick``/``judge``
on R ranks x T tensors. Frames are encoded before the clock starts. Figures are records
per CPU-second of the child (steadier than wall time on a shared machine), median over
the rounds, and new/base ratios.

    .venv/bin/python bench/logic_ab.py --base main -n 5
    .venv/bin/python bench/logic_ab.py --base main -n 3 --shards 1,2,4

With ``--shards`` each shard's core gets only its own frames (one per rank and step,
as node agents send them): records/CPU-s per shard shows the per-frame cost, which does
not shrink with the shard's share of records. The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_CHILD = r'''
import json, sys, time
import numpy as np
import rankscope
from rankscope.wire import protocol
from rankscope.wire.shards import ShardMap
from rankscope.coordinator.server.ingest_load import simulated_batch
ranks, tensors, steps, shards = (int(x) for x in sys.argv[1:5])
rng = np.random.default_rng(0)
smap = ShardMap(shards)
# frames[k][s]: shard k's frames of step s (step 0 carries the names: warm-up, not timed)
frames = [[[] for _ in range(steps)] for _ in range(shards)]
for s in range(steps):
    for r in range(ranks):
        b = simulated_batch("ab", r, s, tensors, rng)
        parts = smap.split(b) if shards > 1 else [b]
        for k, p in enumerate(parts):
            frames[k][s].append(protocol.encode(protocol.step_message(p, f"rank:{r}", s)))
out = {"module": rankscope.__file__, "per_shard": []}
for k in range(shards):
    if shards > 1:
        from rankscope.coordinator.logic.shards.shard import ShardCore
        core = ShardCore({}, shard=k)
        judge = core.judge
    else:
        from rankscope.coordinator.logic.core import CoordinatorCore
        core = CoordinatorCore({})
        judge = core.tick
    for r in range(ranks):
        core.on_register("ab", r, {"world_size": ranks})
    dec = protocol.Decoder(job="ab")
    decode_cpu = cpu = 0.0
    records = 0
    for s in range(steps):
        c0 = time.process_time()
        batches = [protocol.step_from_message(dec.decode(f)) for f in frames[k][s]]
        c1 = time.process_time()
        core.on_steps(batches)
        judge()
        c2 = time.process_time()
        if s:
            decode_cpu, cpu = decode_cpu + (c1 - c0), cpu + (c2 - c0)
            records += sum(len(b) for b in batches)
    out["per_shard"].append({"records": records, "cpu": cpu, "decode_cpu": decode_cpu,
                             "frames": ranks * (steps - 1)})
print(json.dumps(out))
'''


def _tree(dest: Path, base: str | None) -> Path:
    """``dest/rankscope`` = agent/ with coordinator/ inside, from ``base`` or the working tree."""
    pkg = dest / "rankscope"
    if base is None:
        shutil.copytree(REPO / "agent", pkg, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "coordinator", pkg / "coordinator", ignore=shutil.ignore_patterns("__pycache__"))
        return dest
    for folder, into in (("agent", pkg), ("coordinator", pkg / "coordinator")):
        into.mkdir(parents=True, exist_ok=True)
        arch = subprocess.run(["git", "-C", str(REPO), "archive", base, folder], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "--strip-components=1", "-C", str(into)], input=arch.stdout, check=True)
    return dest


def _child(path: Path, ranks: int, tensors: int, steps: int, shards: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(path)}
    res = subprocess.run([sys.executable, "-c", _CHILD, str(ranks), str(tensors), str(steps), str(shards)],
                         env=env, check=True, capture_output=True, text=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    if not out["module"].startswith(str(path)):
        raise RuntimeError(f"child imported {out['module']}, not the copy under {path}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="git revision to compare with (default: %(default)s)")
    ap.add_argument("-n", type=int, default=5, help="rounds, each runs base then new (default: %(default)s)")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--tensors", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--shards", default="1", help="shard counts, comma separated (default: %(default)s)")
    args = ap.parse_args()
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.base], check=True,
                         capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rankscope-ab-") as tmp:
        trees = {"base": _tree(Path(tmp) / "base", args.base), "new": _tree(Path(tmp) / "new", None)}
        for k in [int(x) for x in args.shards.split(",")]:
            runs: dict[str, list[dict]] = {"base": [], "new": []}
            for _ in range(args.n):
                for side in ("base", "new"):
                    runs[side].append(_child(trees[side], args.ranks, args.tensors, args.steps, k))
            row: dict = {"shards": k, "ranks": args.ranks, "tensors": args.tensors, "base": rev}
            for side, outs in runs.items():
                per = [[p["records"] / p["cpu"] for p in o["per_shard"]] for o in outs]
                row[f"{side}_records_per_cpu_s_per_shard"] = [round(statistics.median(x)) for x in zip(*per)]
                row[f"{side}_us_per_frame"] = round(statistics.median(
                    sum(p["cpu"] for p in o["per_shard"]) / sum(p["frames"] for p in o["per_shard"]) * 1e6
                    for o in outs), 1)
                row[f"{side}_decode_us_per_frame"] = round(statistics.median(
                    sum(p["decode_cpu"] for p in o["per_shard"]) / sum(p["frames"] for p in o["per_shard"]) * 1e6
                    for o in outs), 1)
            row["new_vs_base"] = [round(n / b, 2) for n, b in zip(row["new_records_per_cpu_s_per_shard"],
                                                                  row["base_records_per_cpu_s_per_shard"])]
            rows.append(row)
            print(f"{k} shard(s), {args.ranks} ranks x {args.tensors} tensors, median of {args.n}: "
                  f"base {rev} {[f'{x:,}' for x in row['base_records_per_cpu_s_per_shard']]} rec/CPU-s per shard "
                  f"({row['base_us_per_frame']} us/frame, decode {row['base_decode_us_per_frame']}), "
                  f"new {[f'{x:,}' for x in row['new_records_per_cpu_s_per_shard']]} "
                  f"({row['new_us_per_frame']} us/frame, decode {row['new_decode_us_per_frame']}), "
                  f"new/base {row['new_vs_base']}", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
