"""One data-parallel inference worker: loads the model, decodes the session's prompts.

Like an SGLang/vLLM DP worker it is its own one-process world: it never touches
``mindspore.communication``, and the launcher (serve.py) gives every worker
``RANK_ID=0``, so each one believes it is rank 0. Run by serve.py, or alone:

    python examples/dp_inference/worker.py --worker-id 0 --tokens 6

With ``--debugger`` it records with rankscope's msProbe-compatible API:
``PrecisionDebugger(...).start(model, token_range=[a, b], rank_id=...)`` around the
generate call, then ``stop()`` and ``step()``, exactly as in msProbe's vLLM example.
``--pass-worker-id`` passes the worker's own unique id as ``rank_id`` (what msProbe
recommends with SGLang's ``self.gpu_id``); without it the clashing rank-0 claims are
left to rankscope's node agent to tell apart.

``INFER_FAULT`` (see faults.py) injects a real fault on one worker.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "config.json"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="one DP inference worker")
    p.add_argument("--worker-id", type=int, required=True, help="this worker's own unique id (0..N-1)")
    p.add_argument("--tokens", type=int, default=6, help="new tokens to generate (default: %(default)s)")
    p.add_argument("--requests", type=int, default=1,
                   help="times the session's prompts are served; each request is one debugger step "
                        "(default: %(default)s)")
    p.add_argument("--go-file", type=Path,
                   help="announce readiness as GO_FILE.ready<ID>, then wait for GO_FILE before serving")
    p.add_argument("--batch", type=int, default=2, help="prompts in the session (default: %(default)s)")
    p.add_argument("--prompt-len", type=int, default=4, help="prompt length (default: %(default)s)")
    p.add_argument("--debugger", action="store_true",
                   help="record with rankscope's PrecisionDebugger (token_range capture)")
    p.add_argument("--token-range", type=int, nargs=2, metavar=("A", "B"),
                   help="forward calls A..B to record (0 = prefill); default: all of them")
    p.add_argument("--pass-worker-id", action="store_true",
                   help="pass --worker-id as start(rank_id=...) instead of letting rankscope remap")
    p.add_argument("--config", type=Path,
                   help="debugger config.json (default: $RANKSCOPE_CONFIG, else the example's config.json)")
    p.add_argument("--dump-path", help="local dump directory (default: $RANKSCOPE_DUMP_PATH, else the config's)")
    p.add_argument("--result", type=Path, help="write this worker's result (tokens, pid) as JSON here")
    p.add_argument("--trace", type=Path, help="also write a plain-MindSpore reference trace (JSON) here")
    return p


def debugger_config(args: argparse.Namespace) -> Path:
    if args.config is not None:
        return args.config
    env = os.environ.get("RANKSCOPE_CONFIG")
    return Path(env) if env else DEFAULT_CONFIG


def wait_for_go(go_file: Path, worker: int, timeout_s: float = 300.0) -> None:
    """Like a DP server that takes traffic only once every worker is up: say we are
    ready, then wait for the launcher's go. Keeps replicas in step with each other."""
    Path(f"{go_file}.ready{worker}").touch()
    deadline = time.monotonic() + timeout_s
    while not go_file.exists():
        if time.monotonic() > deadline:
            raise ValueError(f"--go-file {go_file}: no go within {timeout_s:.0f} s")
        time.sleep(0.02)


def run(args: argparse.Namespace) -> dict:
    # Imports here, not at module level: argument errors come back without paying for
    # MindSpore, and sibling modules resolve whether run as a script or imported.
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import mindspore as ms
    from decoder import DecoderConfig, build_model, greedy_generate, make_prompts
    from faults import iteration_hook, parse_fault, weight_dtype, weight_seed
    from replica_trace import ReplicaTrace

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    fault = parse_fault(os.environ.get("INFER_FAULT"))
    cfg = DecoderConfig()
    wid = args.worker_id
    model = build_model(cfg, seed=weight_seed(fault, wid), dtype=weight_dtype(fault, wid))
    prompts = make_prompts(args.batch, args.prompt_len, cfg.vocab)
    before_call = iteration_hook(fault, wid, cfg.n_layers)
    trace = ReplicaTrace(model) if args.trace else None

    debugger = None
    if args.debugger:
        from rankscope import PrecisionDebugger
        dump_path = args.dump_path or os.environ.get("RANKSCOPE_DUMP_PATH")
        debugger = PrecisionDebugger(config_path=str(debugger_config(args)), dump_path=dump_path)
    if args.go_file is not None:
        wait_for_go(args.go_file, wid)
    token_range = list(args.token_range) if args.token_range else None
    for _ in range(args.requests):
        if debugger is not None:
            # msProbe's inference pattern: start(model, token_range, rank_id) around generate.
            debugger.start(model=model, token_range=token_range,
                           rank_id=wid if args.pass_worker_id else None)
        tokens = greedy_generate(model, prompts, args.tokens, before_call)
        if debugger is not None:
            debugger.stop()
            debugger.step()  # a request is a step: pause/export/resume land between requests

    result = {"worker": wid, "pid": os.getpid(), "tokens": tokens.tolist(),
              "fault": os.environ.get("INFER_FAULT") if fault and fault.applies_to(wid) else None}
    if trace is not None:
        trace.remove()
        args.trace.write_text(json.dumps(trace.to_json()))
    if args.result is not None:
        args.result.write_text(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.token_range and not args.debugger:
        print("worker: --token-range needs --debugger", file=sys.stderr)
        return 2
    if args.requests < 1:
        print(f"worker: --requests must be >= 1, got {args.requests}", file=sys.stderr)
        return 2
    try:
        result = run(args)
    except ValueError as exc:  # bad INFER_FAULT or sizes: one clear line, no traceback
        print(f"worker {args.worker_id}: {exc}", file=sys.stderr)
        return 2
    print(f"worker {result['worker']} (pid {result['pid']}): tokens {result['tokens']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
