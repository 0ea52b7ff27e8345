"""What ``rankscope launch`` runs: the processes of one watched job, and their clean-up.

Starts (or joins) a coordinator on Ray, starts this node's agent, runs the command in
an environment that attaches the probe to every Python process it spawns, shows
progress while it runs, and prints the verdict. Exits as
:func:`~rankscope.coordinator.launch.watched.launch_exit` says: the command's status, or 86
when an incident's policy was to terminate the job (still running or just ended).
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
from rankscope.coordinator.launch.paused import PausedNotice, reach_args
from rankscope.coordinator.launch.progress import ProgressPrinter, format_verdict, watch_summary
from rankscope.coordinator.launch.tree import stop_tree
from rankscope.coordinator.launch.watched import (
    UNWATCHED_EXIT,
    AttachWatch,
    WatchedRanks,
    end_command_now,
    end_of_run_line,
    exit_status,
    launch_exit,
    shell_status,
    still_live,
)
from rankscope.coordinator.launch.worker_logs import WorkerLogLinks
from rankscope.wire.job_state import TerminatedWatch
from rankscope.text.watch_line import stream_id

ACTIONS = ("pause", "export", "terminate", "continue")
#: How long the end of the run waits for the node agent's word that the command's ranks
#: ended (its liveness checks take well under a second; a rank that outlives its command
#: is not waited for longer than this).
ENDS_WAIT_S = 5.0
#: An interrupted launch's last word: how long the coordinator may finish open incidents.
INTERRUPTED_DRAIN_S = 3.0


def print_loud(msg: str) -> None:
    print(f"[rankscope] {msg}", file=sys.stderr, flush=True)


class Launch:
    """Owns every process the launch started, so each one is cleaned up on any exit."""

    def __init__(self, args: argparse.Namespace, job_config: dict) -> None:
        self.args = args
        #: The job's config (rankscope.config.job.job_config): every rank reads it.
        self.job_config = job_config
        self.cluster = job_config["cluster"]
        self.job = args.job or f"job-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.export_dir: Path = args.export_dir.resolve()
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="rankscope-"))
        (self.runtime_dir / "attach").mkdir()
        self.attach_watch = AttachWatch(self.runtime_dir / "attach")
        self.last_status: dict | None = None
        self.agent_proc: subprocess.Popen | None = None
        self.cmd_proc: subprocess.Popen | None = None
        self.coordinator = None
        self.console = None  # rankscope.coordinator.console.server.ConsoleServer with --console
        self.address: str | None = None  # the Ray address operator commands use to reach this job
        self.started_ray = False
        self._agent_cmd: list[str] = []
        self.listed: Path | None = None  # this job's record in the machine's job index
        self.agent_downs: list[list] = []  # [how it died, seconds until it was back]
        self.say = (lambda *_: None) if args.quiet else (lambda msg: print(f"[rankscope] {msg}", flush=True))

    # --- start -----------------------------------------------------------------
    def start_coordinator(self) -> str:
        from rankscope.coordinator.server.client import Coordinator, connect_ray
        self.started_ray = connect_ray(self.args.address, verbose=bool(getattr(self.args, "verbose", False)))
        self.coordinator = Coordinator.start(str(self.export_dir), self.cluster, job=self.job,
                                             name=f"rankscope-{self.job}", config=self.job_config)
        endpoint = self.coordinator.endpoint()
        self.say(f"coordinator up on {endpoint} (job {self.job}, on divergence: "
                 f"{self.cluster['on_divergence']})")
        from rankscope.coordinator.server import job_index
        from rankscope.coordinator.server.client import ray_address
        self.address = ray_address()
        self.listed = job_index.record(job_index.JobRecord(
            job=self.job, address=self.address or "", namespace=self.coordinator.namespace,
            name=self.coordinator.name, pid=os.getpid(), export_dir=str(self.export_dir)))
        self.say(f"control it from another terminal: rankscope status|pause|step N|resume|export|terminate "
                 f"{reach_args(self.address, self.job)}")
        return endpoint

    def start_console(self) -> None:
        from rankscope.coordinator.console.server import ConsoleServer, console_line
        self.console = ConsoleServer(self.coordinator, self.export_dir, host=self.args.console_host,
                                     port=self.args.console, read_only=self.args.read_only, job=self.job)
        # Printed even with --quiet: it is the only way to the page.
        print(console_line(self.console.start()), flush=True)

    def start_agent(self, coordinator_endpoint: str) -> str:
        listen = f"ipc://{self.runtime_dir}/agent.sock"
        self._agent_cmd = [sys.executable, "-m", "rankscope", "agent", "--coordinator", coordinator_endpoint,
                           "--listen", listen, "--job", self.job, "--spool", str(self.runtime_dir / "spool"),
                           "--bundle-dir", str(self.export_dir / "agent_bundles")]
        self._spawn_agent()
        self.say(f"node agent listening on {listen}")
        return listen

    def _spawn_agent(self) -> None:
        sock = self.runtime_dir / "agent.sock"
        sock.unlink(missing_ok=True)  # a dead agent's socket file: wait for the new one
        log = open(self.export_dir / "node_agent.log", "ab")
        self.agent_proc = subprocess.Popen(self._agent_cmd, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        log.close()
        started = time.monotonic()
        while not sock.exists():
            if self.agent_proc.poll() is not None:
                raise SystemExit(f"rankscope launch: the node agent exited with {self.agent_proc.returncode}; "
                                 f"see {self.export_dir / 'node_agent.log'}")
            if time.monotonic() - started > 20:
                raise SystemExit("rankscope launch: the node agent did not start listening within 20 s")
            time.sleep(0.05)

    def _supervise_agent(self) -> None:
        """The node agent died under the job: start it again on the same endpoint and
        spool. Ranks reconnect by themselves and send what they buffered meanwhile."""
        if self.agent_proc is None or self.agent_proc.poll() is None:
            return
        rc = self.agent_proc.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 and -rc in signal.valid_signals() else f"exit {rc}"
        down_at = time.monotonic()
        self.say(f"WARNING: the node agent died ({how}); restarting it on the same endpoint")
        self.agent_downs.append([how, 0.0])
        try:
            self._spawn_agent()
        except SystemExit as exc:
            self.say(f"WARNING: could not restart the node agent: {exc}; the rest of this run is not watched")
            self.agent_proc = None
            return
        self.agent_downs[-1][1] = time.monotonic() - down_at
        self.say(f"node agent back after {self.agent_downs[-1][1]:.1f} s")

    def run_command(self, agent_endpoint: str) -> int:
        settings = AttachSettings(job=self.job, agent_endpoint=agent_endpoint,
                                  dump_path=self.export_dir / "local_dump", config_path=self.write_job_config(),
                                  on_terminate=self.cluster.get("on_terminate", "raise"),
                                  attach_reports=self.attach_watch.folder,
                                  launch_output="" if self.args.quiet else stream_id(sys.stdout))
        cmd = self.args.cmd
        if getattr(self.args, "cmd_note", None):
            self.say(self.args.cmd_note)
        self.say(f"running: {' '.join(cmd)}")
        # A new session so the whole tree (msrun and its workers) can be signalled at once.
        out = open(self.args.log, "ab") if self.args.log else None
        self.cmd_proc = subprocess.Popen(cmd, env=child_env(settings), start_new_session=True,
                                         stdout=out, stderr=subprocess.STDOUT if out else None)
        if out is not None:
            out.close()  # the child holds its own descriptor
            self.say(f"command output -> {self.args.log}")
        self.log_links = WorkerLogLinks.for_command(cmd, Path.cwd(), self.export_dir)
        progress = self.progress = ProgressPrinter(self.say)
        paused = PausedNotice(self.say, self.job, reach_args(self.address, self.job))
        # --agent: no coordinator here; the node agent heard any terminate and is asked.
        agent_watch = TerminatedWatch(agent_endpoint, self.job) if self.coordinator is None else None
        try:
            rc = self._supervise(agent_watch, progress, paused)
        finally:
            if agent_watch is not None:
                agent_watch.close()
        self._poll_files()
        return rc

    def _poll_files(self) -> None:
        """What ranks and msrun leave in files: attach failures, new worker logs to link."""
        self.attach_watch.poll()
        if self.log_links is not None:
            self.log_links.poll()

    def _supervise(self, agent_watch: TerminatedWatch | None, progress: ProgressPrinter,
                   paused: PausedNotice) -> int:
        """Until the command ends: progress lines, and once the job was terminated, the
        command's tree killed after the grace (ranks blocked inside a collective whose
        peer died never reach the step boundary where they would obey)."""
        killed_at: float | None = None
        while self.cmd_proc.poll() is None:
            self._poll_files()
            if agent_watch is not None:
                terminated = agent_watch.poll(time.monotonic())
                if terminated and killed_at is None:
                    self.say(f"the coordinator terminated job {self.job}; the command gets {self.args.grace:.0f} s "
                             "to end")
            else:
                self._supervise_agent()
                try:
                    status = (self.console.read_status(self.coordinator) if self.console is not None
                              else self.coordinator.status(timeout=10))
                except Exception as exc:  # a slow status must not stop the launch
                    self.say(f"status unavailable: {exc!r}")
                    status = None
                if status:
                    self.last_status = status
                    progress.update(status)
                    paused.update(status, time.monotonic())
                terminated = bool(status and status.get("terminated"))
            if terminated and killed_at is None:
                killed_at = time.monotonic()
            why = end_command_now(killed_at, time.monotonic(), self.args.grace,
                                  None if agent_watch is not None else status)
            if why is not None:
                self.say(why)
                self.signal_tree(signal.SIGKILL)
                break
            time.sleep(0.5 if agent_watch is not None else 1.0)
        return shell_status(self.cmd_proc.wait())

    def write_job_config(self) -> Path:
        """The job's config where every rank's RANKSCOPE_CONFIG points. Without the
        file's ``cluster.agent``/``cluster.job``: launch tells each rank its node agent and
        job (RANKSCOPE_AGENT, RANKSCOPE_JOB), and a config travelling to every node must not
        point them all at one host's agent."""
        import json

        from rankscope.wire.job_config import FILE_NAME
        ranks = {**self.job_config, "cluster": {k: v for k, v in self.job_config["cluster"].items()
                                                if k not in ("agent", "job")}}
        path = self.runtime_dir / FILE_NAME
        path.write_text(json.dumps(ranks, indent=1), encoding="utf-8")
        return path

    def take_job_config(self, agent_endpoint: str, timeout_s: float = 20.0) -> None:
        """--agent: the coordinator's config (relayed by this host's node agent) is the
        job's, so the ranks here capture what every other node's ranks capture."""
        from rankscope.config.job import checked_job_config
        from rankscope.wire.job_config import ask_agent
        from rankscope.wire.transport import TransportError
        try:
            got = checked_job_config(ask_agent(agent_endpoint, self.job, timeout_s))
        except TransportError as exc:
            got, why = None, str(exc)
        else:
            why = f"it had none from the coordinator within {timeout_s:.0f} s"
        mine = f"--config {self.args.config}" if self.args.config else "launch's defaults"
        if got is None:
            print_loud(f"WARNING: no job config from the node agent at {agent_endpoint} ({why}): "
                       f"ranks on this node run with {mine}, which other nodes may not share")
            return
        if (self.args.config or self.args.on_divergence) and got != self.job_config:
            print_loud(f"WARNING: {mine}{' and --on-divergence' if self.args.on_divergence else ''} "
                       "differ from the coordinator's config: the coordinator's is in force on every node")
        self.job_config, self.cluster = got, got["cluster"]
        self.say("ranks take the coordinator's job config")

    # --- finish ----------------------------------------------------------------
    def finish(self, rc: int) -> int:
        allow = bool(getattr(self.args, "allow_unwatched", False))
        if self.coordinator is None:
            self.say(f"command exited with {rc}; the cluster coordinator holds any verdict "
                     f"(rankscope status --job {self.job})")
            cov = WatchedRanks(watched=None, unwatched=list(self.attach_watch.failures.values()))
            return self._exit(exit_status(cov, rc, allow), rc)
        self._await_ends()
        incidents = self.coordinator.drain(30.0)
        status = self._final_status()
        cov = WatchedRanks.of(status, self.attach_watch.failures)
        if incidents:
            self._say_verdicts(status, incidents)
            self.say(end_of_run_line(cov, rc, found_divergence=True))
        else:  # what was watched comes first when there is no verdict to read
            (self.say if cov.complete else print_loud)(end_of_run_line(cov, rc, found_divergence=False))
            self._say_verdicts(status, [])
        return self._exit(launch_exit(cov, rc, allow, incidents, bool((status or {}).get("terminated"))), rc)

    def finish_interrupted(self) -> None:
        """Interrupted (Ctrl-C, SIGTERM) with the command stopped: what was found so far,
        and coverage.json written, as at a normal end but briefly (whoever interrupted
        wants the launcher gone; a second interrupt skips it)."""
        if self.coordinator is None:
            return
        try:
            incidents = self.coordinator.drain(INTERRUPTED_DRAIN_S, timeout=INTERRUPTED_DRAIN_S + 10)
            status = self.coordinator.status(timeout=5)
        except Exception:  # noqa: BLE001 - the export folder holds what was written
            return
        self._say_verdicts(status, incidents)

    def _say_verdicts(self, status: dict | None, incidents: list[dict]) -> None:
        """What the verdicts stand on, how each rank was watched, then every verdict."""
        self.say(self.watched_line(status))
        self._say_watch(status)
        from rankscope.coordinator.logic.views.coverage import dump_text
        from rankscope.coordinator.logic.job.reruns import strikes_text
        report = ((status or {}).get("coverage") or {}).get(self.job) or {}
        for line in (dump_text(report), strikes_text(report.get("reruns") or {})):
            if line:
                self.say(line)
        for inc in incidents:
            print(format_verdict(inc), flush=True)
        if not getattr(self.args, "no_replay", False):
            from rankscope.coordinator.cli.rerun import replay_after_run
            line = replay_after_run(incidents, self.say)
            if line:
                print(f"  replayed : {line}", flush=True)

    def watched_line(self, status: dict | None) -> str:
        """What the verdict (or its absence) covers, from the coordinator's coverage."""
        from rankscope.coordinator.logic.views.coverage import describe
        if status is None:  # the verdict is already out; say what is unknown
            return "coverage unknown: the coordinator did not answer"
        report = (status.get("coverage") or {}).get(self.job)
        line = describe(report) if report else "nothing watched: no rank reached the coordinator"
        for how, back in self.agent_downs:
            line += f"; node agent {how}, down {back:.1f} s"
        return line

    def _await_ends(self, within_s: float = ENDS_WAIT_S) -> None:
        """The command is over, but the node agent's word that its ranks ended (a worker
        its server SIGTERMed on the way out) may still be on the way: wait for it, briefly,
        so the verdict is not written without those deaths."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                if not still_live(self.coordinator.status(timeout=5)):
                    return
            except Exception:  # noqa: BLE001 - the drain that follows says what it can
                return
            time.sleep(0.2)

    def _final_status(self) -> dict | None:
        try:
            return self.coordinator.status(timeout=10)
        except Exception:  # noqa: BLE001 - the last status seen while running will do
            return self.last_status

    @staticmethod
    def _exit(status: int, rc: int) -> int:
        if status == UNWATCHED_EXIT and rc != UNWATCHED_EXIT:  # said only when launch chose it
            print_loud(f"exit status {UNWATCHED_EXIT}: ranks ran unwatched (pass --allow-unwatched to accept "
                       "such a run)")
        return status

    def _say_watch(self, status: dict | None) -> None:
        """How each rank was watched (its mode, and what could not be seen)."""
        progress = getattr(self, "progress", None)
        ranks = (status or {}).get("ranks") or {}
        watch = progress.watch if progress is not None else {}
        watch.update({r: i["watch"] for r, i in ranks.items() if isinstance(i.get("watch"), dict)})
        for line in watch_summary(watch, ranks.keys()):
            self.say(line)

    def signal_tree(self, sig: int) -> None:
        for proc in (self.cmd_proc,):
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def stop_command(self, grace_s: float = 3.0) -> list[int]:
        """Stop every process of the command's tree (a worker held by a pause included)."""
        if self.cmd_proc is None:
            return []
        return stop_tree(self.cmd_proc.pid, self.cmd_proc.pid, grace_s)

    def cleanup(self) -> None:
        from rankscope.coordinator.server import job_index
        job_index.forget(self.listed)
        if self.console is not None:
            self.console.stop()
        self.stop_command()
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
            # Its shutdown first finishes the reports still being rendered (at most 30 s);
            # killed sooner on a loaded machine, an incident was left without report.html.
            self.coordinator.stop(timeout_s=45)
        if self.started_ray:
            disconnect_ray()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


