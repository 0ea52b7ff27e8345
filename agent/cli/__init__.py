"""The ``rankscope`` command: a thin dispatcher.

Every verb is one module named after it that exposes ``main(argv: list[str]) -> int``:
verbs that run on training nodes (``agent``, ``keys``) in this folder, the others in
``rankscope.coordinator.cli``. Modules are imported only when their verb runs, so
``rankscope agent`` on a training node never imports Ray.
"""
from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "launch": ("rankscope.coordinator.cli.launch", "run CMD (e.g. an msrun line) with every rank attached"),
    "demo": ("rankscope.coordinator.cli.demo", "a real 4-rank msrun job with an injected fault, end to end"),
    "coordinator": ("rankscope.coordinator.cli.coordinator", "start (or join) the coordinator actor on a Ray cluster"),
    "agent": ("rankscope.cli.agent", "run the node agent for this host's ranks"),
    "keys": ("rankscope.cli.keys", "create CURVE key pairs and allowlists"),
    "status": ("rankscope.coordinator.cli.control", "ranks, steps, lag and incidents of a running job"),
    "pause": ("rankscope.coordinator.cli.control", "pause every rank before one common step (a consistent cut)"),
    "resume": ("rankscope.coordinator.cli.control", "resume a paused job"),
    "step": ("rankscope.coordinator.cli.control", "run N more steps, then pause again"),
    "terminate": ("rankscope.coordinator.cli.control", "terminate every rank"),
    "export": ("rankscope.coordinator.cli.control", "export every rank's bundle now"),
    "collect": ("rankscope.coordinator.cli.control", "gather every rank's local dump into one tree"),
    "console": ("rankscope.coordinator.cli.console", "the live web console of a running job (grid, verdicts, controls)"),
    "report": ("rankscope.coordinator.cli.report", "re-render an incident's report.html"),
    "rerun": ("rankscope.coordinator.cli.rerun", "replay an incident's anomalous step: data, code, or that device?"),
    "analyze": ("rankscope.coordinator.cli.analyze", "the same verdict from msProbe dump trees made elsewhere (offline)"),
    "incidents": ("rankscope.coordinator.cli.incidents", "list past incidents of an export folder (offline); show or open one"),
    "bench": ("rankscope.coordinator.cli.bench", "benchmarks (ingest throughput, detection latency)"),
}


def _usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: rankscope <command> [options]", "       rankscope --version", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "rankscope <command> --help for a command's options."]
    return "\n".join(lines)


def version() -> str:
    import rankscope
    return str(rankscope.__version__)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        # No command is a usage error (exit 2), as argparse treats a missing argument.
        print(_usage(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"rankscope {version()}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in SUBCOMMANDS:
        print(f"rankscope: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[cmd][0])
    # Control commands share one module; they need to know which verb was typed.
    if SUBCOMMANDS[cmd][0] == "rankscope.coordinator.cli.control":
        rest = [cmd, *rest]
    try:
        return int(module.main(rest) or 0)
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        # The rank-side install has no Ray; the coordinator's commands need it.
        print(f"rankscope {cmd}: needs Ray, which this installation lacks "
              "(pip install 'rankscope[coordinator]')", file=sys.stderr)
        return 1
    except OSError as exc:
        # What a user's input or machine can cause (a path that cannot be made or read, a
        # port in use) is one line naming it; anything else is a bug and keeps its traceback.
        print(f"rankscope {cmd}: {_os_error(exc)}", file=sys.stderr)
        return 1


def _os_error(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


if __name__ == "__main__":
    sys.exit(main())
