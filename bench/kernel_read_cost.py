"""rankscope's own share of a GRAPH step's kernel-dump cost: the reader alone, on real files.

MindSpore dumps one training step of the 4-layer MLP of graph_step_time.py (its own dump,
no rankscope: the kernel set of a mode), then the same iteration folder is copied in again
and again and read by rankscope's KernelReader, as after every compiled step. Printed per
iteration: the CPU the reader spends before the rows are handed back (what a training
step waits for), the CPU of the deletion that follows it, and the wall time from submit to
rows (which on a loaded machine is mostly waiting for a core). CPU time is far less
disturbed by other processes than wall time, so this separates rankscope's cost from
MindSpore's on a shared machine where step-time ratios are noisy.

    .venv/bin/python bench/kernel_read_cost.py [--mode kernels|all] [--iterations 100]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from graph_step_time import JOB, MS_DUMP  # noqa: E402

from rankscope.probe.graph.kernel_config import KernelDump  # noqa: E402
from rankscope.probe.graph.kernel_reader import KernelReader  # noqa: E402


def dump_one_step(root: Path, mode: str) -> tuple[Path, Path]:
    """(one iteration folder, its execution-order CSV) written by MindSpore itself."""
    dump_mode, kernels = MS_DUMP["ms_" + mode]
    cfg = root / "ms.json"
    cfg.write_text(json.dumps({"common_dump_settings": {
        "op_debug_mode": 0, "dump_mode": dump_mode, "path": str(root / "ms"), "net_name": "Net",
        "iteration": "all", "saved_data": "tensor", "input_output": 0, "kernels": kernels,
        "support_device": [0]}, "e2e_dump_settings": {"enable": True, "trans_flag": True}}))
    job = root / "graph_job.py"
    job.write_text(JOB)
    env = dict(os.environ, GLOG_v="3", MINDSPORE_DUMP_CONFIG=str(cfg))
    subprocess.run([sys.executable, str(job), "1"], env=env, cwd=root, check=True, capture_output=True, timeout=600)
    it = max((root / "ms" / "rank_0" / "Net" / "0").iterdir(), key=lambda p: int(p.name))
    return it, next((root / "ms" / "rank_0" / "execution_order").glob("ms_execution_order_graph_0.csv"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("kernels", "all"), default="kernels")
    ap.add_argument("--iterations", type=int, default=100)
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="rankscope-kernel-read-"))
    try:
        src, order = dump_one_step(root, args.mode)
        kroot = root / "reader"
        (kroot / "rank_0" / "execution_order").mkdir(parents=True)
        shutil.copy(order, kroot / "rank_0" / "execution_order")
        reader = KernelReader(KernelDump(kroot, True, "tensor", args.mode), lambda what, exc: print(what, exc))
        wait_cpu = delete_cpu = wall = 0.0
        rows = []
        for i in range(args.iterations):
            shutil.copytree(src, kroot / "rank_0" / "Net" / "0" / str(i))
            c0, t0 = time.process_time(), time.perf_counter()
            reader.submit()
            rows = reader.collect()
            c1, wall = time.process_time(), wall + time.perf_counter() - t0
            reader.idle()
            wait_cpu, delete_cpu = wait_cpu + c1 - c0, delete_cpu + time.process_time() - c1
        reader.close()
        n = args.iterations
        files = len(list(src.iterdir()))
        print(f"{args.mode}: {files} files/iteration, {len(rows)} rows; per iteration: "
              f"read {wait_cpu / n * 1e3:.2f} ms CPU, then deletion {delete_cpu / n * 1e3:.2f} ms CPU; "
              f"submit-to-rows {wall / n * 1e3:.2f} ms wall")
        print(json.dumps({"mode": args.mode, "files": files, "rows": len(rows),
                          "read_cpu_ms": round(wait_cpu / n * 1e3, 3), "delete_cpu_ms": round(delete_cpu / n * 1e3, 3),
                          "wall_ms": round(wall / n * 1e3, 3)}))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
