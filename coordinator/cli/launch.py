"""``rankscope launch``: run a command with every rank attached, no code changes.

The options and the top-level flow; :class:`~rankscope.coordinator.launch.runner.Launch`
owns the processes it starts.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from rankscope.config.watchpoints import blind_watchpoints
from rankscope.coordinator.cli.console import add_console_options
from rankscope.coordinator.cli.shards_option import add_shards_option, apply_shards
from rankscope.coordinator.launch import msrun_args, preflight
from rankscope.coordinator.launch.preflight import UsageError
from rankscope.coordinator.launch.runner import ACTIONS, Launch, print_loud
from rankscope.coordinator.launch.watched import UNWATCHED_EXIT
from rankscope.text.watch_line import TIERS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rankscope launch",
        description="Run CMD (e.g. an msrun line) with every rank process attached to rankscope. "
                    "Everything given here is checked before anything starts.",
        epilog="example: rankscope launch --export-dir out -- msrun --worker_num=4 "
               "--local_worker_num=4 --join=True train.py",
    )
    p.add_argument("--export-dir", default="rankscope-out", type=Path, metavar="DIR",
                   help="where incidents, bundles, reports and local dumps go (default: %(default)s)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="config.json (msProbe fields + rankscope's cluster/rdr); checked whole before the start")
    p.add_argument("--on-divergence", choices=ACTIONS,
                   help="what to do at the first divergence (default: the config's, else pause)")
    p.add_argument("--address", metavar="HOST:PORT", help="Ray cluster to join (default: start a private local Ray)")
    p.add_argument("--job", help="job id (default: generated; required with --agent, the same on every node)")
    p.add_argument("--agent", metavar="ENDPOINT",
                   help="multi-node: attach ranks to the node agent already running on this host "
                        "(started by srun, systemd or the DaemonSet) instead of starting a coordinator "
                        "and an agent; the verdict is then the cluster coordinator's (rankscope status)")
    add_shards_option(p)
    p.add_argument("--watch", choices=TIERS, default=None,
                   help="what each rank records: 'default' stays within cluster.budget (5%%) of a step, "
                        "vital signs every step and weight fingerprints spread over steps when they do not "
                        "fit; 'full' records every parameter, optimizer state and gradient in full every "
                        "step, for hunting (default: the config's, else 'default')")
    p.add_argument("--allow-unwatched", action="store_true",
                   help="exit with the command's status even if some or all ranks could not be attached "
                        f"(default: such a run exits {UNWATCHED_EXIT} after a successful command)")
    p.add_argument("--no-replay", action="store_true",
                   help="do not replay a step a rank re-ran and reproduced in another process at the end "
                        "(rankscope rerun does it later)")
    p.add_argument("--console", nargs="?", const=0, type=int, default=None, metavar="PORT",
                   help="serve the live web console of this job (on PORT, default a free one) and print its "
                        "URL; the same as `rankscope console` in another terminal")
    add_console_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the verdict and warnings")
    p.add_argument("--verbose", action="store_true", help="also show Ray's own log lines")
    p.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                   help="seconds to let a terminated job exit on its own before its process tree is "
                        "killed (msrun's scheduler otherwise waits for its own node timeout; "
                        "default: %(default)s)")
    p.add_argument("--log", type=Path, metavar="FILE",
                   help="send CMD's stdout/stderr to this file instead of the terminal")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run and its arguments")
    return p


def check_args(args: argparse.Namespace) -> dict:
    """Every option and the command, before anything starts; the job's config to run with."""
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.agent and not args.job:
        raise UsageError("--agent needs --job: every node's ranks must report under one job id")
    if args.agent and args.shards is not None:
        raise UsageError("--shards goes with the coordinator, not with --agent: this host's ranks report to the "
                         "cluster coordinator, which was started with its shard count "
                         "(rankscope coordinator --shards K)")
    # The command runs with the PATH launch gives it (this interpreter's folder first).
    args.cmd, args.cmd_note = msrun_args.joined(preflight.resolve_command(cmd, child_env_path()))
    if args.config is not None:
        args.config = args.config.resolve()
    job = apply_shards(preflight.check_config(args.config, args.on_divergence), args.shards)
    if args.watch is not None:
        job["cluster"] = {**job.get("cluster", {}), "watch": args.watch}
    preflight.non_negative("--grace", args.grace)
    if args.console is not None and not 0 <= args.console <= 65535:
        raise UsageError(f"--console {args.console} is not a port (0-65535)")
    if args.console is not None and args.agent:
        raise UsageError("--console goes with the coordinator, not with --agent: run `rankscope console` where "
                         "the cluster coordinator's Ray is reachable")
    args.export_dir = preflight.writable_dir("--export-dir", args.export_dir)
    if args.log is not None:
        args.log = preflight.writable_file("--log", args.log)
    return job


def child_env_path() -> str:
    from rankscope.coordinator.launch.env import AttachSettings, child_env
    return child_env(AttachSettings("", "", Path()))["PATH"]


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        job = check_args(args)
    except UsageError as exc:
        print(f"rankscope launch: {exc}", file=sys.stderr)
        return 2
    for blind in blind_watchpoints(job["cluster"]):
        print_loud(f"WARNING: watchpoint {blind}")
    launch = Launch(args, job)
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
            launch.take_job_config(agent_endpoint)
        else:
            endpoint = launch.start_coordinator()
            _catch_signals()
            if args.console is not None:
                launch.start_console()
            agent_endpoint = launch.start_agent(endpoint)
        rc = launch.run_command(agent_endpoint)
        return launch.finish(rc)
    except Exception as exc:
        # Ray is imported only once launch gets this far, so its error type is too.
        from rankscope.coordinator.server.client import CoordinatorError
        if not isinstance(exc, CoordinatorError):
            raise
        print(f"rankscope launch: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        launch.stop_command()
        print(f"[rankscope] interrupted: the job's processes are stopped; what was recorded is in "
              f"{launch.export_dir}", file=sys.stderr)
        try:
            launch.finish_interrupted()
        except KeyboardInterrupt:  # interrupted again: leave at once
            pass
        return 130
    finally:
        launch.cleanup()
