"""A one-machine Slurm cluster for a test: munged, slurmctld and slurmd with one node
(this machine), every file in a folder the test owns, every daemon started here and
stopped by its pid. Commands reach it through SLURM_CONF, never the machine's own
/etc/slurm or munge socket.

Debian's slurm-wlm: slurmctld, slurmd and the client tools. slurmd runs as root (it
switches to the job's user), so the cluster needs root as well.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scancel", "scontrol")


def missing() -> str | None:
    """Why no cluster can be started here, or None."""
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return (f"Slurm is not installed ({', '.join(absent)} not on PATH; "
                "Debian: apt-get install slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        return "slurmd needs root to start jobs as their user; this test is not root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(d: Path, node: str, cpus: int) -> str:
    # linuxproc/none: no cgroup hierarchy of the machine's is touched; CR_CPU: memory is
    # not a consumable, so steps need not declare it.
    return f"""\
ClusterName=rankscope-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.node = socket.gethostname()
        self.env = dict(os.environ, SLURM_CONF=str(folder / "slurm.conf"))
        self.procs: list[subprocess.Popen] = []

    def _daemon(self, argv: list[str], log: str) -> None:
        with open(self.dir / "log" / log, "ab") as out:  # the daemon keeps its own descriptor
            self.procs.append(subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True))

    def start(self, timeout: float = 60.0) -> None:
        d = self.dir
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        subprocess.run(["mungekey", "--create", f"--keyfile={d}/munge/munge.key"], check=True,
                       capture_output=True)
        (d / "slurm.conf").write_text(_conf(d, self.node, os.cpu_count() or 1))
        # --force: the key's folder sits under /tmp, whose permissions munged distrusts.
        self._daemon(["munged", "--foreground", "--force", f"--key-file={d}/munge/munge.key",
                      f"--socket={d}/munge/munge.sock", f"--pid-file={d}/munge/munged.pid",
                      f"--log-file={d}/munge/munged.log", f"--seed-file={d}/munge/seed"], "munged.out")
        self._wait(lambda: (d / "munge" / "munge.sock").exists(), timeout, "munged's socket")
        self._daemon(["slurmctld", "-D", "-f", str(d / "slurm.conf")], "slurmctld.out")
        self._daemon(["slurmd", "-D", "-f", str(d / "slurm.conf"), "-N", self.node], "slurmd.out")
        self._wait(self._idle, timeout, "an idle Slurm node")

    def _idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True,
                             check=False)
        return out.stdout.strip() == "idle"

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{what} not up after {timeout:.0f} s (exited: {dead})\n{self.logs()}")
            time.sleep(0.3)

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=kw.pop("env", self.env), capture_output=True, text=True, check=False,
                              **kw)

    def wait_job(self, job_id: str, timeout: float) -> tuple[str, str]:
        """(state, exit code "status:signal") once the job has ended. Polled: ``sbatch
        --wait`` backs off to half a minute between its own polls."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.run(["scontrol", "-o", "show", "job", job_id], timeout=30).stdout
            fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
            state = fields.get("JobState", "")
            if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return state, fields.get("ExitCode", "")
            if time.monotonic() > deadline:
                self.run(["scancel", job_id], timeout=30)
                return f"still {state or 'unknown'} after {timeout:.0f} s (cancelled)", fields.get("ExitCode", "")
            time.sleep(0.5)

    def logs(self, tail: int = 1500) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                         for p in sorted((self.dir / "log").glob("*")) if p.is_file())

    def stop(self) -> None:
        # Jobs first (their steps run under slurmstepd, which outlives slurmd), then the
        # daemons, newest first, each by its own pid.
        if any(p.poll() is None for p in self.procs):
            self.run(["scancel", "--full", "--partition=test"], timeout=30)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.run(["squeue", "-h"], timeout=30).stdout.strip():
                time.sleep(0.5)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


@contextmanager
def slurm_cluster(folder: Path) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(folder)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
