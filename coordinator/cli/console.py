"""``rankscope console``: the live console of a running job, found as ``rankscope status``
finds it. Serves until Ctrl-C or until the job's coordinator is gone."""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from rankscope.coordinator.cli.control import add_reach_options, reach_or_say
from rankscope.coordinator.console.server import DEFAULT_HOST, ConsoleServer, console_line

#: Seconds between two checks that the coordinator is still there.
ALIVE_EVERY_S = 5.0


def add_console_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--console-host", default=DEFAULT_HOST, metavar="HOST",
                    help="address the console listens on (default: %(default)s; 0.0.0.0 for every interface: "
                         "anyone who can reach it and holds the URL's token can then pause the job)")
    ap.add_argument("--read-only", action="store_true", help="the console shows the job; its controls are off")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rankscope console",
                                 description="Serve the live console (grid, verdicts, model tree, tensors, "
                                             "watchpoints, training controls) of a running job.")
    add_reach_options(ap)
    ap.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    ap.add_argument("--export-dir", type=Path, default=None,
                    help="the job's export folder, whose reports the console links (default: the one the "
                         "job index of this machine records)")
    add_console_options(ap)
    return ap


def _alive(coord) -> bool:
    try:
        return coord.alive(timeout=10)
    except Exception:  # noqa: BLE001 - the job's Ray went away with it
        return False


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"rankscope console: --port {args.port} is not a port (0-65535)", file=sys.stderr)
        return 2
    coord = reach_or_say("console", args)
    if coord is None:
        return 1
    server = ConsoleServer(coord, Path(args.export_dir) if args.export_dir else None, host=args.console_host,
                           port=args.port, read_only=args.read_only, job=args.job)
    print(console_line(server.start()), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        while _alive(coord):
            time.sleep(ALIVE_EVERY_S)
        print("[rankscope] the job's coordinator is gone; the console stops", file=sys.stderr)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
