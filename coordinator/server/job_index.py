"""Which rankscope jobs run on this machine, and the Ray cluster that reaches each one.

``rankscope launch`` starts a private Ray per job; a control verb run later (status,
pause, export, ...) must reach that job's cluster and no other, even with several jobs
on one machine. Each launch and each ``rankscope coordinator`` records its job here for
as long as it runs; a control verb without ``--address`` picks the one record that
matches (``--job``, or the only one there is) and refuses ambiguity by naming them all.
Ray's own "auto" address (the last cluster started) is never used: it is whichever job
happened to start last.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from rankscope.files.atomic import atomic_write_bytes
from rankscope.wire.layout import safe_id


def index_dir() -> Path:
    base = os.environ.get("RANKSCOPE_HOME") or os.path.join(os.path.expanduser("~"), ".rankscope")
    return Path(base) / "jobs"


@dataclass(frozen=True)
class JobRecord:
    job: str
    address: str  # Ray GCS address
    namespace: str
    name: str  # coordinator actor name
    pid: int  # the process that owns the record (launch or coordinator)
    export_dir: str

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def record(rec: JobRecord) -> Path:
    path = index_dir() / f"{safe_id(rec.job, 'job')}.{rec.pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(asdict(rec)).encode())
    return path


def forget(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def running(job: str | None = None) -> list[JobRecord]:
    """Live records (stale ones, whose owner died, are removed on the way)."""
    out = []
    folder = index_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = JobRecord(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if not rec.alive():
            path.unlink(missing_ok=True)
            continue
        if job is None or rec.job in (job, "*"):  # "*": a coordinator serving any job
            out.append(rec)
    return out


class NoSuchJob(LookupError):
    """No single running job matches; the message says what there is."""


def pick(job: str | None) -> JobRecord:
    found = running(job)
    if len(found) == 1:
        return found[0]
    if not found:
        what = f"job {job!r}" if job else "rankscope job"
        others = running() if job else []
        hint = f" (running here: {', '.join(r.job for r in others)})" if others else ""
        raise NoSuchJob(f"no running {what} on this machine{hint}; give --address of its Ray cluster")
    names = "; ".join(f"{r.job} (export dir {r.export_dir}, Ray {r.address})" for r in found)
    raise NoSuchJob(f"{len(found)} rankscope jobs run on this machine: {names}; pick one with --job")
