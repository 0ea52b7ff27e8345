"""Start N independent data-parallel inference workers on the same prompts (a DP controller).

This is the shape of an SGLang/vLLM data-parallel deployment seen from a debugger: N
worker processes, each its own one-process world that never initialises
``mindspore.communication`` and believes it is rank 0 (``RANK_ID=0``, ``RANK_SIZE=1``),
all given the same prompts for a debugging session. Under rankscope:

    rankscope launch --config examples/dp_inference/config.json -- \\
        python examples/dp_inference/serve.py --workers 3 --debugger --token-range 1 4

Every worker then streams its records to the node agent, which gives the clashing
rank-0 claims distinct ids; the coordinator compares the workers as replicas (every
statistic must match) and names the worker, token and tensor where one departs.
``--pass-worker-id`` makes each worker pass its own id as ``start(rank_id=...)``
instead. Exits non-zero if any worker failed; prints whether the replicas agreed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
GO = "go"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="run N independent DP inference workers on the same prompts")
    p.add_argument("--workers", type=int, default=3, help="number of DP workers (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=6, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--requests", type=int, default=1,
                   help="times every worker serves the session's prompts (default: %(default)s)")
    p.add_argument("--debugger", action="store_true", help="workers record with rankscope's PrecisionDebugger")
    p.add_argument("--token-range", type=int, nargs=2, metavar=("A", "B"),
                   help="forward calls A..B to record (0 = prefill, k = decode iteration k)")
    p.add_argument("--pass-worker-id", action="store_true",
                   help="each worker passes its own id as start(rank_id=...)")
    p.add_argument("--config", type=Path, help="debugger config.json for the workers")
    p.add_argument("--dump-path", help="local dump directory for the workers")
    p.add_argument("--out", type=Path, help="directory for per-worker results (default: a temp dir)")
    p.add_argument("--trace", action="store_true", help="workers also write plain-MindSpore reference traces")
    return p


def worker_command(worker: int, args: argparse.Namespace, out: Path) -> list[str]:
    cmd = [sys.executable, str(WORKER), "--worker-id", str(worker), "--tokens", str(args.tokens),
           "--requests", str(args.requests), "--result", str(out / f"worker{worker}.json"),
           "--go-file", str(out / GO)]
    if args.debugger:
        cmd.append("--debugger")
    if args.token_range:
        cmd += ["--token-range", *map(str, args.token_range)]
    if args.pass_worker_id:
        cmd.append("--pass-worker-id")
    if args.config:
        cmd += ["--config", str(args.config)]
    if args.dump_path:
        cmd += ["--dump-path", args.dump_path]
    if args.trace:
        cmd += ["--trace", str(out / f"trace{worker}.json")]
    return cmd


def worker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Every worker is rank 0 of a world of one: the clash a DP deployment produces."""
    env = dict(os.environ if base is None else base)
    env.update(RANK_ID="0", RANK_SIZE="1")
    return env


def release_when_ready(procs: list[subprocess.Popen], out: Path) -> None:
    """Dispatch the session only once every worker has loaded its model, as a DP
    router does; a worker that dies while loading releases the others anyway."""
    while True:
        ready = sum((out / f"{GO}.ready{i}").exists() for i in range(len(procs)))
        if ready == len(procs) or any(p.poll() is not None for p in procs):
            break
        time.sleep(0.02)
    (out / GO).touch()


def summarize(results: list[dict]) -> tuple[bool, str]:
    """Whether every worker generated worker 0's tokens, and a line saying so."""
    if not results:
        return False, "no worker produced a result"
    ref = results[0]["tokens"]
    differ = [r["worker"] for r in results if r["tokens"] != ref]
    if not differ:
        return True, f"all {len(results)} workers generated identical tokens"
    return False, f"workers {differ} generated different tokens from worker {results[0]['worker']}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("workers", "requests", "tokens"):
        if getattr(args, name) < 1:
            print(f"serve: --{name} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    if os.environ.get("RANKSCOPE_ATTACH") == "1" and not args.debugger:
        # Zero-code attach finds a model through value_and_grad/grad/Model.train; a
        # decode loop has none, so without --debugger the workers would run unprobed
        # and the launch would report "no divergence" having compared nothing.
        print("serve: under rankscope launch without --debugger: zero-code attach does not find "
              "an inference model yet, so the workers are not compared; add --debugger",
              file=sys.stderr, flush=True)
    out = args.out or Path(tempfile.mkdtemp(prefix="dp_inference-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / GO).unlink(missing_ok=True)
    env = worker_env()
    procs = [subprocess.Popen(worker_command(i, args, out), env=env) for i in range(args.workers)]

    def _stop(signum, _frame):  # a terminate from rankscope reaches every worker
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)
    signal.signal(signal.SIGTERM, _stop)
    release_when_ready(procs, out)
    codes = [p.wait() for p in procs]
    failed = [i for i, c in enumerate(codes) if c != 0]
    results = []
    for i in range(args.workers):
        path = out / f"worker{i}.json"
        if path.exists():
            results.append(json.loads(path.read_text()))
    _, line = summarize(results)
    print(f"serve: {line} (results in {out})", flush=True)
    if failed:
        print(f"serve: workers {failed} failed with exit codes {[codes[i] for i in failed]}", file=sys.stderr)
        return next(codes[i] for i in failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
