"""``rankscope agent``: run this host's node agent.

    rankscope agent --coordinator tcp://coord:7000 --listen ipc:///run/rankscope/agent.sock \\
        --job J --spool /var/lib/rankscope/spool --bundle-dir /var/lib/rankscope/bundles \\
        [--curve-secret agent.key_secret --coordinator-key coordinator.key]

Runs until SIGTERM/SIGINT. Never imports Ray.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from rankscope.wire.transport import CurveKeys, TransportError, is_local


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rankscope agent", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--listen", required=True,
                   help="endpoint the ranks of this host connect to (ipc://PATH or tcp://127.0.0.1:PORT)")
    p.add_argument("--coordinator", default=None,
                   help="coordinator ROUTER endpoint (tcp://HOST:PORT); without it the agent only keeps "
                        "flight recorders and writes bundles for dead ranks")
    p.add_argument("--job", default=None, help="serve only this job id (default: any)")
    p.add_argument("--spool", default="rankscope-spool", help="spool directory (default: %(default)s)")
    p.add_argument("--spool-max-mb", type=int, default=1024, help="spool size limit in MiB (default: %(default)s)")
    p.add_argument("--bundle-dir", default="rankscope-agent-bundles",
                   help="where bundles of dead ranks and rank_map.json go (default: %(default)s)")
    p.add_argument("--flight-recorder-steps", type=int, default=8,
                   help="steps kept per rank for bundles (default: %(default)s)")
    p.add_argument("--heartbeat-timeout", type=float, default=15.0,
                   help="seconds without a heartbeat before a live rank is reported unresponsive")
    p.add_argument("--settle", type=float, default=0.3,
                   help="seconds registrations are collected before ids are assigned (default: %(default)s)")
    p.add_argument("--replay-window", type=float, default=10.0,
                   help="seconds a sent frame stays replayable when the coordinator does not "
                        "acknowledge (default: %(default)s)")
    p.add_argument("--drain", type=float, default=5.0,
                   help="on SIGTERM, seconds to keep sending what is not sent yet (default: %(default)s)")
    # 4 s: under the rank's own 5 s wait for its answer (agent_link), so a slow
    # coordinator still decides the id before the rank starts stepping with its claim.
    p.add_argument("--assign-wait", type=float, default=4.0,
                   help="seconds a registration waits for the coordinator's job-wide id before the rank "
                        "gets this host's (default: %(default)s; 0: do not wait)")
    p.add_argument("--curve-secret", "--curve-secret-key", dest="curve_secret", default=None,
                   help="this agent's CURVE secret key file (rankscope keys new NAME -> NAME.key_secret)")
    p.add_argument("--coordinator-key", "--curve-server-key", dest="coordinator_key", default=None,
                   help="the coordinator's CURVE public key file")
    p.add_argument("--host", default=None,
                   help="host name this agent reports (default: the machine's); ranks whose claimed host "
                        "differs are judged by heartbeats only, not by pid")
    p.add_argument("--allow-dir", default=None,
                   help="client public keys admitted on a non-local --listen (with --curve-secret)")
    p.add_argument("--log-level", default="INFO",
                   help="DEBUG, INFO, WARNING or ERROR (default: %(default)s)")
    return p


def settings_from_args(args: argparse.Namespace):
    from rankscope.node.settings import AgentSettings

    for name in ("replay_window", "drain", "heartbeat_timeout", "settle", "assign_wait"):
        if getattr(args, name) < 0:
            raise SystemExit(f"rankscope agent: --{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    for name in ("spool_max_mb", "flight_recorder_steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"rankscope agent: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.listen.startswith(("ipc://", "tcp://")):
        raise SystemExit(f"rankscope agent: --listen {args.listen!r} must be ipc://PATH or tcp://HOST:PORT")
    if args.coordinator and "://" not in args.coordinator:
        args.coordinator = f"tcp://{args.coordinator}"  # HOST:PORT is what people type
    coord_curve = listen_curve = None
    if args.coordinator and not is_local(args.coordinator):
        if not (args.curve_secret and args.coordinator_key):
            raise SystemExit(f"rankscope agent: --coordinator {args.coordinator} is not loopback: "
                             "--curve-secret and --coordinator-key are required (rankscope keys new ...)")
    if args.curve_secret and args.coordinator_key:
        coord_curve = CurveKeys.from_files(args.curve_secret, server_public_file=args.coordinator_key)
    if not is_local(args.listen):
        if not (args.curve_secret and args.allow_dir):
            raise SystemExit(f"rankscope agent: --listen {args.listen} is not loopback/ipc: "
                             "--curve-secret and --allow-dir are required")
        listen_curve = CurveKeys.from_files(args.curve_secret, allow_dir=args.allow_dir)
    return AgentSettings(
        listen=args.listen, coordinator=args.coordinator, job=args.job, spool_dir=Path(args.spool),
        bundle_dir=Path(args.bundle_dir), flight_recorder_steps=args.flight_recorder_steps,
        spool_max_bytes=args.spool_max_mb << 20, heartbeat_timeout_s=args.heartbeat_timeout,
        settle_s=args.settle, listen_curve=listen_curve, coordinator_curve=coord_curve, host=args.host,
        replay_window_s=args.replay_window, drain_s=args.drain, assign_wait_s=args.assign_wait)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s rankscope-agent %(levelname)s %(name)s: %(message)s")
    from rankscope.node.daemon import NodeAgent

    try:
        agent = NodeAgent(settings_from_args(args))
    except (TransportError, OSError, ValueError) as exc:
        print(f"rankscope agent: {exc}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    # One line on stdout the launcher (or a test) can wait for.
    print(f"rankscope agent listening on {agent.endpoint}", flush=True)
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
