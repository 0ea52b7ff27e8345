"""``rankscope launch``: run a command with every rank attached, no code changes.

The options and the top-level flow; :class:`~rankscope.coordinator.launch.runner.Launch`
owns the processes it starts.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from rankscope.coordinator.launch.runner import ACTIONS, Launch


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rankscope launch",
        description="Run CMD (e.g. an msrun line) with every rank process attached to rankscope.",
        epilog="example: rankscope launch --export-dir out -- msrun --worker_num=4 "
               "--local_worker_num=4 --join=True train.py",
    )
    p.add_argument("--export-dir", default="rankscope-out", type=Path,
                   help="where incidents, bundles, reports and local dumps go (default: %(default)s)")
    p.add_argument("--config", type=Path, help="config.json (msProbe fields + rankscope's cluster/rdr)")
    p.add_argument("--on-divergence", choices=ACTIONS,
                   help="what to do at the first divergence (default: the config's, else pause)")
    p.add_argument("--address", help="Ray cluster to join (default: start a local Ray)")
    p.add_argument("--job", help="job id (default: generated; required with --agent, the same on every node)")
    p.add_argument("--agent", metavar="ENDPOINT",
                   help="multi-node: attach ranks to the node agent already running on this host "
                        "(started by srun, systemd or the DaemonSet) instead of starting a coordinator "
                        "and an agent; the verdict is then the cluster coordinator's (rankscope status)")
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the verdict")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds to let a terminated job exit on its own before its process tree is "
                        "killed (msrun's scheduler otherwise waits for its own node timeout)")
    p.add_argument("--log", type=Path,
                   help="send CMD's stdout/stderr to this file instead of the terminal")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    return p


def load_cluster_section(config: Path | None, on_divergence: str | None) -> dict:
    from rankscope.config.errors import ConfigError
    from rankscope.config.job import job_cluster_section
    try:
        return job_cluster_section(config, on_divergence)  # fail here, before anything starts
    except ConfigError as exc:
        raise SystemExit(f"rankscope launch: --config {config}: "
                         f"{exc.reason if exc.field == 'config_path' else exc}") from None


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        build_parser().error("no command given: rankscope launch [options] -- CMD ...")
    args.cmd = cmd
    if args.config is not None:
        args.config = args.config.resolve()
    if args.agent and not args.job:
        build_parser().error("--agent needs --job: every node's ranks must report under one job id")
    cluster = load_cluster_section(args.config, args.on_divergence)
    args.export_dir.mkdir(parents=True, exist_ok=True)
    launch = Launch(args, cluster)
    # Ctrl-C / SIGTERM: stop the command's whole tree, then clean up as usual.
    def _on_signal(signum, _frame):
        launch.signal_tree(signum)
        raise KeyboardInterrupt

    def _catch_signals():
        # SIGINT too: a launcher started in the background has it ignored, yet an
        # explicit kill -INT must still stop the job. Again after ray.init, which
        # installs a SIGTERM handler of its own that exits without any clean-up.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _on_signal)
    _catch_signals()
    try:
        if args.agent:
            agent_endpoint = args.agent
            launch.say(f"attaching ranks to this host's node agent at {agent_endpoint} (job {launch.job})")
        else:
            endpoint = launch.start_coordinator()
            _catch_signals()
            agent_endpoint = launch.start_agent(endpoint)
        rc = launch.run_command(agent_endpoint)
        return launch.finish(rc)
    except KeyboardInterrupt:
        launch.stop_command()
        print(f"[rankscope] interrupted: the job's processes are stopped; what was recorded is in "
              f"{launch.export_dir}", file=sys.stderr)
        return 130
    finally:
        launch.cleanup()
