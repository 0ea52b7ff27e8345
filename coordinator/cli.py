"""The ``rankscope`` command: a thin dispatcher.

Each subcommand lives in the module that owns its job and exposes
``main(argv: list[str]) -> int``. Modules are imported only when their subcommand
runs, so ``rankscope agent`` on a training node never imports Ray.
"""
from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "launch": ("coordinator.launch", "run CMD (e.g. an msrun line) with every rank attached"),
    "demo": ("coordinator.demo", "a real 4-rank msrun job with an injected fault, end to end"),
    "coordinator": ("coordinator.serve", "start (or join) the coordinator actor on a Ray cluster"),
    "agent": ("agent.daemon_cli", "run the node agent for this host's ranks"),
    "keys": ("agent.keys_cli", "create CURVE key pairs and allowlists"),
    "status": ("coordinator.control_cli", "ranks, steps, lag and incidents of a running job"),
    "pause": ("coordinator.control_cli", "pause every rank at its next step boundary"),
    "resume": ("coordinator.control_cli", "resume a paused job"),
    "step": ("coordinator.control_cli", "run N more steps, then pause again"),
    "terminate": ("coordinator.control_cli", "terminate every rank"),
    "export": ("coordinator.control_cli", "export every rank's bundle now"),
    "collect": ("coordinator.control_cli", "gather every rank's local dump into one tree"),
    "report": ("coordinator.report.cli", "re-render an incident's report.html"),
    "bench": ("coordinator.bench_cli", "benchmarks (ingest throughput, detection latency)"),
}


def _usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: rankscope <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "rankscope <command> --help for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in SUBCOMMANDS:
        print(f"rankscope: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[cmd][0])
    # Control commands share one module; they need to know which verb was typed.
    if SUBCOMMANDS[cmd][0] == "coordinator.control_cli":
        rest = [cmd, *rest]
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
