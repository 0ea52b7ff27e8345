"""How fast, and how right, a crash or hang verdict is on a real 4-rank msrun job.

    .venv/bin/python bench/failure_latency.py [--repeats 1] [--faults exit137:2:6,kill:1:5,...]
                                              [--hang-timeout 15]

Each run launches tests/e2e/jobs/model_train_crash.py (Model.train, PyNative, 4 CPU ranks)
under ``rankscope launch`` with one fault on one rank, then reads the incident:

- right: the named rank and step are the faulty rank and the step it failed in;
- death -> verdict: the incident's detection time minus the failing rank's death as its
  node agent saw it (target: <= 2 s on one node);
- hang -> verdict: detection time minus the moment the first peer started waiting in the
  collective the hung rank never reached (target: <= hang timeout + 1 s).

The last line printed is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "e2e" / "jobs" / "model_train_crash.py"
DEFAULT_FAULTS = "exit137:2:6,kill:1:5,raise:3:4,stop:2:5,sleep:1:4"
HANGS = {"stop", "sleep"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keep(out: Path) -> str:
    """A wrong run's export folder, kept for a look."""
    dest = Path(tempfile.mkdtemp(prefix="rankscope-failbench-kept-"))
    shutil.copytree(out, dest / "out", dirs_exist_ok=True)
    return str(dest)


def one_run(fault: str, hang_timeout: float, workdir: Path) -> dict:
    out = workdir / "out"
    cfg = workdir / "config.json"
    cfg.write_text(json.dumps({"cluster": {"hang_timeout_s": hang_timeout}}))
    env = dict(os.environ, CRASH_FAULT=fault, CRASH_STEPS="10")
    cmd = [sys.executable, "-m", "rankscope", "launch", "--export-dir", str(out), "--config", str(cfg),
           "--on-divergence", "terminate", "--", "msrun", "--worker_num=4", "--local_worker_num=4",
           f"--master_port={free_port()}", f"--log_dir={out / 'msrun_logs'}", "--join=True", str(JOB)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    (out / "launch.out").write_text(proc.stdout + proc.stderr)
    kind, rank, step = fault.split(":")[0], int(fault.split(":")[1]), int(fault.split(":")[2])
    found = sorted(out.glob("incidents/*/incident.json"))
    if not found:
        return {"fault": fault, "right": False, "named": None, "wall_s": round(wall, 1), "kept": keep(out),
                "launch_tail": (proc.stdout + proc.stderr).splitlines()[-3:]}
    inc = json.loads(found[0].read_text())
    ev = inc.get("evidence") or {}
    detected = inc["detected_at_epoch"]
    row = {"fault": fault, "named": [inc["first_diverging_rank"], inc["step"]],
           "right": (inc["first_diverging_rank"], inc["step"]) == (rank, step),
           "followers": [f["rank"] for f in ev.get("followers", [])], "wall_s": round(wall, 1)}
    if not row["right"]:
        row["kept"] = keep(out)
    if kind in HANGS:
        since = (ev.get("collective") or {}).get("waiting_since")
        row["hang_to_verdict_s"] = round(detected - since, 2) if since else None
    elif ev.get("failed_at"):
        row["death_to_verdict_s"] = round(detected - ev["failed_at"], 2)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", default=DEFAULT_FAULTS)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--hang-timeout", type=float, default=15.0)
    args = ap.parse_args()
    rows = []
    for _ in range(args.repeats):
        for fault in args.faults.split(","):
            with tempfile.TemporaryDirectory(prefix="rankscope-failbench-") as tmp:
                row = one_run(fault, args.hang_timeout, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {"hang_timeout_s": args.hang_timeout, "runs": len(rows),
               "right": sum(r["right"] for r in rows), "by_fault": {}}
    for fault in args.faults.split(","):
        mine = [r for r in rows if r["fault"] == fault]
        entry = {"right": f"{sum(r['right'] for r in mine)}/{len(mine)}"}
        for key in ("death_to_verdict_s", "hang_to_verdict_s"):
            vals = [r[key] for r in mine if r.get(key) is not None]
            if vals:
                entry[key] = {"median": round(statistics.median(vals), 2), "max": max(vals)}
        summary["by_fault"][fault] = entry
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
