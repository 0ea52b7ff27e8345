"""``rankscope demo``: a real 4-rank data-parallel MindSpore job on CPU (msrun) under
``rankscope launch``, with one real fault injected on one rank, end to end.

The training script (examples/train_dp.py) knows nothing about rankscope. The default
fault is the subtle one: a NaN in rank 2's batch at step 4 that ReLU hides from the
loss, so the loss curve looks fine while the gradient AllReduce spreads NaN to every
rank. rankscope must name rank 2, step 4, not the three ranks that received it.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from rankscope.coordinator.cli import launch
from rankscope.coordinator.launch.runner import ACTIONS, INCIDENT_EXIT


def _example() -> Path:
    """examples/train_dp.py of the checkout this package runs from."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "examples" / "train_dp.py"
        if candidate.is_file():
            return candidate
    raise SystemExit("rankscope demo: examples/train_dp.py not found; run the demo from a rankscope "
                     "checkout (make demo)")

FAULTS = ("nan_batch", "scale_grad", "perturb_weight", "seed", "kill", "none")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def msrun_command(ranks: int, log_dir: Path, script: Path | None = None) -> list[str]:
    script = script or _example()
    return ["msrun", f"--worker_num={ranks}", f"--local_worker_num={ranks}",
            f"--master_port={free_port()}", f"--log_dir={log_dir}", "--join=True", str(script)]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rankscope demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--export-dir", type=Path, default=Path("demo-out"))
    p.add_argument("--fault", default="nan_batch:2:4",
                   help="KIND:RANK:STEP with KIND in " + "|".join(FAULTS) + " (default: %(default)s)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--on-divergence", choices=ACTIONS, default="terminate")
    args = p.parse_args(argv)
    kind = args.fault.split(":")[0]
    if kind not in FAULTS:
        p.error(f"--fault: unknown kind {kind!r}; choose from {', '.join(FAULTS)}")

    export_dir = args.export_dir.resolve()
    export_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TRAIN_STEPS"] = str(args.steps)
    if kind == "none":
        os.environ.pop("TRAIN_FAULT", None)
        print(f"[rankscope demo] a clean {args.ranks}-rank run, no fault injected", flush=True)
    else:
        os.environ["TRAIN_FAULT"] = args.fault
        _, rank, step = args.fault.split(":")
        print(f"[rankscope demo] {args.ranks}-rank msrun job; injecting '{kind}' on rank {rank} "
              f"at step {step}. Training script: {_example()}", flush=True)
    cmd = msrun_command(args.ranks, export_dir / "msrun_logs")
    rc = launch.main(["--export-dir", str(export_dir), "--on-divergence", args.on_divergence,
                      "--log", str(export_dir / "command.log"), "--", *cmd])
    print(f"\n[rankscope demo] done (exit {rc}). Everything is under {export_dir}:\n"
          f"  incidents/<id>/incident.json  the verdict and its evidence\n"
          f"  incidents/<id>/report.html    open in a browser (self-contained, no network)\n"
          f"  incidents/<id>/rank_<r>/rdr/  every rank's bundle\n"
          f"  local_dump/step<N>/rank<r>/   each rank's msProbe-format dump\n"
          f"  command.log, msrun_logs/      msrun's and the workers' own output\n"
          f"  rankscope incidents {export_dir}   lists them later, offline", flush=True)
    # The demo succeeded if it found the fault it injected (or nothing, for a clean run).
    return 0 if rc in (0, INCIDENT_EXIT) else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
