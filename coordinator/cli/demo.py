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
import sys
from pathlib import Path

from rankscope.coordinator.cli import launch
from rankscope.coordinator.launch.preflight import UsageError, writable_dir
from rankscope.coordinator.launch.runner import ACTIONS
from rankscope.coordinator.launch.watched import INCIDENT_EXIT
from rankscope.wire.ports import free_port


def _example() -> Path:
    """examples/train_dp.py of the checkout this package runs from."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "examples" / "train_dp.py"
        if candidate.is_file():
            return candidate
    raise SystemExit("rankscope demo: examples/train_dp.py not found; run the demo from a rankscope "
                     "checkout (make demo)")

FAULTS = ("nan_batch", "scale_grad", "perturb_weight", "seed", "kill", "sdc_once", "sdc_always", "none")


def msrun_command(ranks: int, log_dir: Path, script: Path | None = None) -> list[str]:
    script = script or _example()
    return ["msrun", f"--worker_num={ranks}", f"--local_worker_num={ranks}",
            f"--master_port={free_port()}", f"--log_dir={log_dir}", "--join=True", str(script)]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def parse_fault(spec: str, ranks: int, steps: int) -> tuple[str, int, int] | None:
    """``KIND:RANK:STEP`` checked against the job it will be injected into; None for "none".
    ValueError saying what is wrong: a fault the job never reaches would make a clean
    run look like a missed one."""
    parts = spec.split(":")
    kind = parts[0]
    if kind not in FAULTS:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(FAULTS)}")
    if kind == "none":
        if len(parts) != 1:
            raise ValueError(f"{spec!r}: 'none' takes no rank or step")
        return None
    if len(parts) != 3:
        raise ValueError(f"{spec!r}: expected KIND:RANK:STEP, e.g. {kind}:2:4")
    try:
        rank, step = int(parts[1]), int(parts[2])
    except ValueError:
        raise ValueError(f"{spec!r}: RANK and STEP must be whole numbers") from None
    if not 0 <= rank < ranks:
        raise ValueError(f"{spec!r}: rank {rank} is not one of the job's ranks 0-{ranks - 1} (--ranks {ranks})")
    if not 0 <= step < steps:
        raise ValueError(f"{spec!r}: step {step} is not one of the job's steps 0-{steps - 1} (--steps {steps})")
    return kind, rank, step


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rankscope demo", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--export-dir", type=Path, default=Path("demo-out"),
                   help="where the incident, report, bundles and logs go (default: %(default)s)")
    p.add_argument("--fault", default="nan_batch:2:4",
                   help="KIND:RANK:STEP with KIND in " + "|".join(FAULTS[:-1])
                        + ", or none for a clean run (default: %(default)s)")
    p.add_argument("--ranks", type=positive_int, default=4, help="ranks of the msrun job (default: %(default)s)")
    p.add_argument("--steps", type=positive_int, default=10, help="training steps (default: %(default)s)")
    p.add_argument("--on-divergence", choices=ACTIONS, default="terminate",
                   help="what to do at the first divergence (default: %(default)s)")
    p.add_argument("--verbose", action="store_true", help="also show Ray's own log lines")
    return p


def main(argv: list[str]) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        fault = parse_fault(args.fault, args.ranks, args.steps)
    except ValueError as exc:
        p.error(f"--fault {exc}")
    script = _example()
    try:
        export_dir = writable_dir("--export-dir", args.export_dir)
    except UsageError as exc:
        p.error(str(exc))
    os.environ["TRAIN_STEPS"] = str(args.steps)
    if fault is None:
        os.environ.pop("TRAIN_FAULT", None)
        print(f"[rankscope demo] a clean {args.ranks}-rank run, no fault injected", flush=True)
    else:
        kind, rank, step = fault
        os.environ["TRAIN_FAULT"] = f"{kind}:{rank}:{step}"
        print(f"[rankscope demo] {args.ranks}-rank msrun job; injecting '{kind}' on rank {rank} "
              f"at step {step}. Training script: {script}", flush=True)
    cmd = msrun_command(args.ranks, export_dir / "msrun_logs", script)
    rc = launch.main(["--export-dir", str(export_dir), "--on-divergence", args.on_divergence,
                      "--log", str(export_dir / "command.log"), *(["--verbose"] if args.verbose else []),
                      "--", *cmd])
    if rc == 2:  # launch refused its arguments and said why; nothing ran
        return rc
    print(closing_summary(rc, export_dir), flush=True)
    # The demo succeeded if it found the fault it injected (or nothing, for a clean run).
    return 0 if rc in (0, INCIDENT_EXIT) else rc


def closing_summary(rc: int, export_dir: Path) -> str:
    """Where everything is, naming only what this run wrote."""
    lines = [f"\n[rankscope demo] done (exit {rc}). Under {export_dir}:"]
    incidents = sorted(p.parent for p in export_dir.glob("incidents/*/incident.json"))
    for inc in incidents:
        rel = inc.relative_to(export_dir)
        lines.append(f"  {rel}/incident.json  the verdict and its evidence")
        if (inc / "report.html").is_file():
            lines.append(f"  {rel}/report.html    open in a browser (self-contained, no network)")
        bundles = sorted(p.name for p in inc.glob("rank_*") if p.is_dir())
        if bundles:
            lines.append(f"  {rel}/rank_<r>/       {len(bundles)} rank bundle(s)")
    if not incidents:
        lines.append("  (no incident: nothing diverged)")
    for name, what in (("local_dump", "each rank's msProbe-format dump (step<N>/rank<r>/)"),
                       ("command.log", "msrun's and the workers' own output"),
                       ("msrun_logs", "each worker's log")):
        if (export_dir / name).exists():
            lines.append(f"  {name:<16} {what}")
    lines.append(f"  rankscope incidents {export_dir}   lists them later, offline")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
