"""What ``rankscope launch`` runs: the processes of one watched job, and their clean-up.

Starts (or joins) a coordinator on Ray, starts this node's agent, runs the command in
an environment that attaches the probe to every Python process it spawns, shows
progress while it runs, and prints the verdict. Exits with the command's status, or
:data:`INCIDENT_EXIT` when rankscope terminated the job on an incident.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rankscope.coordinator.launch.env import AttachSettings, child_env
from rankscope.coordinator.launch.progress import ProgressPrinter, format_verdict, watch_summary

#: Exit status when rankscope terminated the job because of an incident.
INCIDENT_EXIT = 86
ACTIONS = ("pause", "export", "terminate", "continue")


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
        from rankscope.coordinator.server.client import Coordinator, connect_ray
        self.started_ray = connect_ray(self.args.address)
        self.coordinator = Coordinator.start(str(self.export_dir), self.cluster, job=self.job,
                                             name=f"rankscope-{self.job}")
        endpoint = self.coordinator.endpoint()
        self.say(f"coordinator up on {endpoint} (job {self.job}, on divergence: "
                 f"{self.cluster['on_divergence']})")
        return endpoint

    def start_agent(self, coordinator_endpoint: str) -> str:
        listen = f"ipc://{self.runtime_dir}/agent.sock"
        cmd = [sys.executable, "-m", "rankscope", "agent", "--coordinator", coordinator_endpoint,
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
        progress = self.progress = ProgressPrinter(self.say)
        killed_at: float | None = None
        while self.cmd_proc.poll() is None:
            if self.coordinator is None:  # --agent: the cluster's coordinator reports
                time.sleep(0.5)
                continue
            try:
                status = self.coordinator.status(timeout=10)
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
        incidents = self.coordinator.drain(30.0)
        if not incidents:
            self.say(f"no divergence found; command exited with {rc}")
            self._say_watch()
            return rc
        for inc in incidents:
            print(format_verdict(inc), flush=True)
        self._say_watch()
        # A job that failed after rankscope terminated it failed *because* of the incident.
        terminated = any(inc.get("policy") == "terminate" or inc.get("state") == "terminated"
                         for inc in incidents)
        return INCIDENT_EXIT if terminated and rc != 0 else rc

    def _say_watch(self) -> None:
        progress = getattr(self, "progress", None)
        try:
            status = self.coordinator.status(timeout=10) or {}
            if progress is not None:
                progress.watch.update({r: i["watch"] for r, i in (status.get("ranks") or {}).items()
                                       if isinstance(i.get("watch"), dict)})
        except Exception:  # noqa: BLE001 - the summary is best effort
            status = {}
        watch = progress.watch if progress is not None else {}
        for line in watch_summary(watch, (status.get("ranks") or {}).keys()):
            self.say(line)

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
        from rankscope.coordinator.server.client import disconnect_ray
        if self.coordinator is not None:
            # Killed too: on a shared cluster (--address) the per-job actor must not linger.
            self.coordinator.stop(timeout_s=10)
        if self.started_ray:
            disconnect_ray()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


