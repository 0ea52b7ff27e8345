"""Ingestion speed of CoordinatorCore alone (no Ray, no sockets, no decoding).

Feeds pre-built synthetic StepBatches (realistic clean training statistics) for R ranks
x T tensors through ``on_step`` and judges every step with ``tick`` (all detectors on),
and prints records/s for ingest alone, judging alone and both, next to a baseline
measured in the same run: the bare cost of touching every batch's columns once
(np.concatenate of the step's columns), the least any consumer must pay. Records per
CPU-second of this process are printed too: on a shared machine they vary less.

    .venv/bin/python bench/coordinator_logic.py [--ranks 256] [--tensors 128] [--steps 40]
    .venv/bin/python bench/coordinator_logic.py --shards 1,2,4   # per ingest shard

The whole system target is >= 500k records/s end to end; the last line is JSON.
With ``--shards`` each shard count is run on the same pre-split batches (the split is
the node agents' work and is timed apart): records/s per shard is the shard's records
over the time spent in that shard alone, next to the one-shard figure of the same run
(target >= 2M per shard), and each shard's memory is measured with tracemalloc.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

from rankscope.coordinator.logic.core import CoordinatorCore
from rankscope.coordinator.logic.synthetic import SyntheticTraining


def run(ranks: int, tensors: int, steps: int, distinct: int = 4) -> dict:
    sim = SyntheticTraining(ranks=ranks, tensors=tensors, seed=0, total_steps=max(steps, 100))
    first = sim.batches(0)
    arrays = [sim.arrays(s) for s in range(distinct)]
    per_step = []
    for s in range(steps):
        src = first if s == 0 else sim.batches(s, arrays[s % distinct])
        per_step.append([dataclasses.replace(b, step=s) for b in src])
    records = sum(len(b) for b in per_step[0]) * steps

    # Baseline: touch every column of every batch once.
    t0 = time.perf_counter()
    for batches in per_step:
        for col in ("stats", "nan_count", "inf_count", "numel", "crc32", "name_ids", "exec_index"):
            np.concatenate([getattr(b, col) for b in batches])
    base = time.perf_counter() - t0

    clock = [0.0]
    core = CoordinatorCore({}, clock=lambda: clock[0])
    for r in range(ranks):
        core.on_register(sim.job, r, {"world_size": ranks})
    ingest = judge = cpu = 0.0
    verdicts = 0
    for batches in per_step:
        c0, t0 = time.process_time(), time.perf_counter()
        for b in batches:
            core.on_step(b)
        t1 = time.perf_counter()
        verdicts += len(core.tick())
        t2, c2 = time.perf_counter(), time.process_time()
        ingest, judge, cpu = ingest + (t1 - t0), judge + (t2 - t1), cpu + (c2 - c0)
        clock[0] += 0.01
    return {
        "ranks": ranks, "tensors": tensors, "steps": steps, "records": records,
        "records_per_s": round(records / (ingest + judge)),
        # The machine is shared: CPU seconds of this process are steadier than wall time.
        "records_per_cpu_s": round(records / cpu) if cpu > 0 else None,
        "ingest_records_per_s": round(records / ingest),
        "judge_ms_per_step": round(1e3 * judge / steps, 2),
        "baseline_touch_records_per_s": round(records / base),
        "ratio_vs_baseline": round(base / (ingest + judge), 3),
        "ratio_vs_500k_target": round(records / (ingest + judge) / 500_000, 1),
        "verdicts_on_clean_data": verdicts,
    }


def main() -> None:
    import sys
    if "--shards" in sys.argv:
        from shard_logic import main as shard_main  # bench/shard_logic.py
        shard_main()
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--tensors", type=int, default=128)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--scale", action="store_true", help="also run 8..1024 ranks")
    args = ap.parse_args()
    sizes = [8, 64, 256, 1024] if args.scale else [args.ranks]
    res = None
    for r in sizes:
        res = run(r, args.tensors, args.steps)
        print(f"{r:5d} ranks x {args.tensors} tensors: {res['records_per_s']:>10,} rec/s wall, "
              f"{res['records_per_cpu_s']:>10,} rec/CPU-s "
              f"(ingest {res['ingest_records_per_s']:,}/s, judge {res['judge_ms_per_step']} ms/step, "
              f"baseline touch {res['baseline_touch_records_per_s']:,}/s, x{res['ratio_vs_500k_target']} of 500k)")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
