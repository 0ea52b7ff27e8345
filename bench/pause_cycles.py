"""Pause/resume cycles on a real skewed 4-rank msrun job: does every pause settle on one step?

Launches ``tests/e2e/jobs/train_skewed.py`` (one rank always a step ahead, inside the
next AllReduce) under ``rankscope launch --on-divergence continue``, then from this
process, as an operator would: ``pause`` -> wait until every rank holds before the cut
-> ``resume``, ``--cycles`` times (every third cycle a ``step 2`` in between). Prints one
line per cycle (the cut, how often it moved, seconds to settle) and a final JSON line;
a cycle that does not settle within ``--settle-s`` counts as a deadlock. At the end the
job must finish with exit 0 and its losses must equal an unpaused run's, bit for bit.

    .venv/bin/python bench/pause_cycles.py [--cycles 20] [--steps 400]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "e2e" / "jobs" / "train_skewed.py"


def _losses(d: Path) -> list[str]:
    return sorted(ln for f in d.glob("worker_*.log") for ln in f.read_text(errors="replace").splitlines()
                  if ln.startswith("LOSS "))


def _settle(coord, job: str, want: int | None, limit: float) -> tuple[dict | None, float]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        cut = ((coord.status(timeout=30).get("jobs") or {}).get(job) or {}).get("cut")
        if cut and cut["complete"] and (want is None or cut["step"] == want):
            return cut, time.monotonic() - t0
        time.sleep(0.2)
    return None, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--settle-s", type=float, default=60.0)
    ap.add_argument("--sleep-s", type=float, default=0.2, help="the slow ranks' sleep per step")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from rankscope.coordinator.cli.demo import msrun_command
    from rankscope.coordinator.server.client import Coordinator, connect_ray, disconnect_ray

    work = Path(tempfile.mkdtemp(prefix="rankscope-pause-cycles-"))
    env = dict(os.environ, TRAIN_STEPS=str(args.steps), SKEW_SLEEP_S=str(args.sleep_s))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.pop("TRAIN_FAULT", None)
    job = f"pause-cycles-{os.getpid()}"
    log = work / "launch.out"
    launch = subprocess.Popen([sys.executable, "-m", "rankscope", "launch", "--export-dir", str(work / "out"),
                               "--on-divergence", "continue", "--job", job, "--log", str(work / "command.log"),
                               "--", *msrun_command(4, work / "out" / "msrun_logs", JOB)],
                              env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    results, deadlocks = [], 0
    try:
        text = log.read_text()
        while "4 rank(s) attached" not in text and launch.poll() is None:
            time.sleep(0.5)
            text = log.read_text()
        m = re.search(r"--address (\S+) --job", text)
        if m is None:
            raise SystemExit(f"the launcher did not say how to reach the job:\n{text}")
        connect_ray(m.group(1), "rankscope")
        coord = Coordinator.find(job=job)
        for cycle in range(args.cycles):
            time.sleep(1.0)  # let it train a little
            coord.control("pause", {"job": job})
            cut, took = _settle(coord, job, None, args.settle_s)
            row = {"cycle": cycle, "cut": cut and cut["step"], "moved": len(cut["moved_from"]) if cut else None,
                   "settle_s": round(took, 2)}
            if cut is None:
                deadlocks += 1
            elif cycle % 3 == 0:
                coord.control("step", {"job": job, "n": 2})
                cut2, took2 = _settle(coord, job, cut["step"] + 2, args.settle_s)
                row.update(step2_cut=cut2 and cut2["step"], step2_settle_s=round(took2, 2))
                deadlocks += cut2 is None
            coord.control("resume", {"job": job})
            results.append(row)
            print(json.dumps(row), flush=True)
        disconnect_ray()
        rc = launch.wait(1800)
    finally:
        if launch.poll() is None:
            launch.send_signal(2)
            launch.wait(60)
    paused = _losses(work / "out" / "msrun_logs")
    ref = subprocess.run(msrun_command(4, work / "ref_logs", JOB), env=env, capture_output=True, text=True)
    same = ref.returncode == 0 and paused == _losses(work / "ref_logs") and len(paused) == 4 * args.steps
    print(json.dumps({"cycles": args.cycles, "deadlocks": deadlocks, "job_exit": rc, "losses_bit_identical": same,
                      "loss_lines": len(paused), "max_settle_s": max(r["settle_s"] for r in results),
                      "cuts_moved": sum(1 for r in results if r["moved"]), "work": str(work)}))
    return 0 if deadlocks == 0 and rc == 0 and same else 1


if __name__ == "__main__":
    sys.exit(main())
