"""``rankscope launch``: run a command with every rank attached, no code changes.

Starts (or joins) a coordinator on Ray, starts this node's agent, runs the command in
an environment that attaches the probe to every Python process it spawns, shows
progress while it runs, and prints the verdict. Exits with the command's status, or
:data:`INCIDENT_EXIT` when rankscope terminated the job on an incident.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from coordinator.launch_env import AttachSettings, child_env
from coordinator.launch_progress import ProgressPrinter, format_verdict

#: Exit status when rankscope terminated the job because of an incident.
INCIDENT_EXIT = 86
ACTIONS = ("pause", "export", "terminate", "continue")


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
    section: dict = {}
    if config is not None:
        try:
            doc = json.loads(config.read_text())
        except FileNotFoundError:
            raise SystemExit(f"rankscope launch: --config {config}: no such file") from None
        except json.JSONDecodeError as exc:
            raise SystemExit(f"rankscope launch: --config {config}: not valid JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise SystemExit(f"rankscope launch: --config {config}: the top level must be an object")
        section = dict(doc.get("cluster") or {})
    if on_divergence:
        section["on_divergence"] = on_divergence
    section.setdefault("on_divergence", "pause")
    from coordinator.logic.settings import parse_settings
    try:
        parse_settings(section)  # fail here, before anything starts, on a bad section
    except ValueError as exc:
        raise SystemExit(f"rankscope launch: config 'cluster' section: {exc}") from None
    return section


class Launch:
    """Owns every process the launch started, so each one is cleaned up on any exit."""

    def __init__(self, args: argparse.Namespace, cluster: dict) -> None:
        self.args = args
        self.cluster = cluster
        self.job = args.job or f"job-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.export_dir: Path = args.export_dir.resolve()
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="rankscope-"))
        self.agent_proc: subprocess.Popen | None = None
        self.cmd_proc: subprocess.Popen | None = None
        self.coordinator = None
        self.started_ray = False
        self.say = (lambda *_: None) if args.quiet else (lambda msg: print(f"[rankscope] {msg}", flush=True))

    # --- start -----------------------------------------------------------------
    def start_coordinator(self) -> str:
        import ray
        from coordinator.actor import start_coordinator
        if not ray.is_initialized():
            ray.init(address=self.args.address, namespace="rankscope", include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
            self.started_ray = self.args.address is None
        self.coordinator = start_coordinator(str(self.export_dir), self.cluster, job=self.job,
                                             name=f"rankscope-{self.job}")
        endpoint = ray.get(self.coordinator.endpoint.remote())
        self.say(f"coordinator up on {endpoint} (job {self.job}, on divergence: "
                 f"{self.cluster['on_divergence']})")
        return endpoint

    def start_agent(self, coordinator_endpoint: str) -> str:
        listen = f"ipc://{self.runtime_dir}/agent.sock"
        cmd = [sys.executable, "-m", "coordinator.cli", "agent", "--coordinator", coordinator_endpoint,
               "--listen", listen, "--job", self.job, "--spool", str(self.runtime_dir / "spool"),
               "--bundle-dir", str(self.export_dir / "agent_bundles")]
        log = open(self.export_dir / "node_agent.log", "ab")
        self.agent_proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        sock = self.runtime_dir / "agent.sock"
        deadline = time.monotonic() + 20
        while not sock.exists():
            if self.agent_proc.poll() is not None:
                raise SystemExit(f"rankscope launch: the node agent exited with {self.agent_proc.returncode}; "
                                 f"see {self.export_dir / 'node_agent.log'}")
            if time.monotonic() > deadline:
                raise SystemExit("rankscope launch: the node agent did not start listening within 20 s")
            time.sleep(0.05)
        self.say(f"node agent listening on {listen}")
        return listen

    def run_command(self, agent_endpoint: str) -> int:
        if self.coordinator is not None:
            import ray
        settings = AttachSettings(job=self.job, agent_endpoint=agent_endpoint,
                                  dump_path=self.export_dir / "local_dump", config_path=self.args.config,
                                  on_terminate=self.cluster.get("on_terminate", "raise"))
        cmd = self.args.cmd
        self.say(f"running: {' '.join(cmd)}")
        # A new session so the whole tree (msrun and its workers) can be signalled at once.
        out = open(self.args.log, "ab") if self.args.log else None
        self.cmd_proc = subprocess.Popen(cmd, env=child_env(settings), start_new_session=True,
                                         stdout=out, stderr=subprocess.STDOUT if out else None)
        if out is not None:
            out.close()  # the child holds its own descriptor
            self.say(f"command output -> {self.args.log}")
        progress = ProgressPrinter(self.say)
        killed_at: float | None = None
        while self.cmd_proc.poll() is None:
            if self.coordinator is None:  # --agent: the cluster's coordinator reports
                time.sleep(0.5)
                continue
            try:
                status = ray.get(self.coordinator.status.remote(), timeout=10)
            except Exception as exc:  # a slow status must not stop the launch
                self.say(f"status unavailable: {exc!r}")
                status = None
            if status:
                progress.update(status)
                if status.get("terminated") and killed_at is None:
                    killed_at = time.monotonic()
            if killed_at is not None and time.monotonic() - killed_at > self.args.grace:
                self.say(f"job still running {self.args.grace:.0f} s after terminate: killing it")
                self.signal_tree(signal.SIGKILL)
                break
            time.sleep(1.0)
        return self.cmd_proc.wait()

    # --- finish ----------------------------------------------------------------
    def finish(self, rc: int) -> int:
        if self.coordinator is None:
            self.say(f"command exited with {rc}; the cluster coordinator holds any verdict "
                     f"(rankscope status --job {self.job})")
            return rc
        import ray
        incidents = ray.get(self.coordinator.drain.remote(30.0), timeout=120)
        if not incidents:
            self.say(f"no divergence found; command exited with {rc}")
            return rc
        for inc in incidents:
            print(format_verdict(inc), flush=True)
        # A job that failed after rankscope terminated it failed *because* of the incident.
        terminated = any(inc.get("policy") == "terminate" or inc.get("state") == "terminated"
                         for inc in incidents)
        return INCIDENT_EXIT if terminated and rc != 0 else rc

    def signal_tree(self, sig: int) -> None:
        for proc in (self.cmd_proc,):
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def cleanup(self) -> None:
        self.signal_tree(signal.SIGTERM)
        if self.agent_proc is not None and self.agent_proc.poll() is None:
            self.agent_proc.terminate()
            try:
                self.agent_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.agent_proc.kill()
        if self.coordinator is None and not self.started_ray:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            return
        try:
            import ray
            from coordinator.actor import stop_coordinator
            if self.coordinator is not None:
                # Killed too: on a shared cluster (--address) the per-job actor must not linger.
                stop_coordinator(self.coordinator, timeout_s=10)
            if self.started_ray and ray.is_initialized():
                ray.shutdown()
        except ImportError:
            pass
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


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
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        if args.agent:
            agent_endpoint = args.agent
            launch.say(f"attaching ranks to this host's node agent at {agent_endpoint} (job {launch.job})")
        else:
            agent_endpoint = launch.start_agent(launch.start_coordinator())
        rc = launch.run_command(agent_endpoint)
        return launch.finish(rc)
    except KeyboardInterrupt:
        print("[rankscope] interrupted", file=sys.stderr)
        return 130
    finally:
        launch.cleanup()
