"""``rankscope analyze`` on a wide msProbe-layout tree: time and memory.

Writes a synthetic data-parallel job's tree (``rankscope.coordinator.offline.synthetic_tree``:
msProbe's PyTorch layout and names) of ``--ranks`` x ``--steps``, ``--layers`` layers each
(10 tensor rows per layer and rank-step), with a NaN injected on one rank, then runs
``rankscope analyze`` on it in a fresh process and samples, every 0.2 s, the resident
memory of that process and of its reader processes together. Baseline in the same run:
the same tree read with ``json.load`` file by file and nothing else (what reading costs
before any judging).

    .venv/bin/python bench/analyze_scale.py [--ranks 1024] [--steps 4] [--layers 8] [--jobs 2]

Prints the tree's size, the time, the peak memory of analyze (all its processes) and the
verdict line; the last line is JSON. Figures only: nothing here asserts.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from rankscope.coordinator.offline.synthetic_tree import write_tree


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_sampled(cmd: list[str]) -> tuple[float, int, str]:
    t0 = time.monotonic()
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    me, peak = psutil.Process(popen.pid), 0
    while popen.poll() is None:
        try:
            peak = max(peak, _tree_rss(me))
        except psutil.Error:
            pass
        time.sleep(0.2)
    out = popen.stdout.read() if popen.stdout else ""
    return time.monotonic() - t0, peak, out


READ_ONLY = r'''
import json, sys
from pathlib import Path
n = 0
for p in sorted(Path(sys.argv[1]).glob("step*/rank*/dump.json")):
    n += len(json.loads(p.read_bytes())["data"])
print(n)
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="leave the tree in place")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rankscope-analyze-bench-"))
    try:
        t0 = time.monotonic()
        fault_rank = args.ranks * 3 // 4
        root = write_tree(work / "dump", args.ranks, args.steps, args.layers, ("nan", fault_rank, args.steps - 1))
        files = sum(1 for _ in root.rglob("*.json"))
        size = sum(p.stat().st_size for p in root.rglob("*.json"))
        print(f"tree: {args.ranks} ranks x {args.steps} steps x {args.layers} layers ({args.layers * 10} rows per "
              f"rank-step): {files} files, {size / 2**20:.1f} MiB, written in {time.monotonic() - t0:.1f} s")
        base_s, base_peak, _ = run_sampled([sys.executable, "-c", READ_ONLY, str(root)])
        print(f"baseline (json.load of every dump.json, one process): {base_s:.1f} s, peak {base_peak / 2**20:.0f} MiB")
        cmd = [sys.executable, "-m", "rankscope", "analyze", str(root), "--out", str(work / "out"),
               "--jobs", str(args.jobs)]
        secs, peak, out = run_sampled(cmd)
        verdict = next((ln for ln in out.splitlines() if "DIVERGENCE" in ln or "no divergence" in ln), out[-300:])
        rows = args.ranks * args.steps * args.layers * 10
        print(f"analyze (--jobs {args.jobs}): {secs:.1f} s ({rows / secs:,.0f} rows/s, x{secs / base_s:.2f} the "
              f"baseline), peak {peak / 2**20:.0f} MiB over all its processes")
        print(f"  {verdict}")
        print(json.dumps({"ranks": args.ranks, "steps": args.steps, "layers": args.layers, "jobs": args.jobs,
                          "tree_mib": round(size / 2**20, 1), "files": files, "baseline_s": round(base_s, 2),
                          "baseline_peak_mib": round(base_peak / 2**20), "analyze_s": round(secs, 2),
                          "analyze_peak_mib": round(peak / 2**20), "expected_rank": fault_rank,
                          "named": f"rank {fault_rank} at step {args.steps - 1}" in verdict}))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
