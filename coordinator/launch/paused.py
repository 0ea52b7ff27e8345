"""What ``rankscope launch`` tells the operator while the job is paused.

A paused job looks exactly like a hung one from the terminal, so the launcher says
what happened (which step every rank holds before, and why a rank is not there), how
the export is going (rank bundles in / total, bytes), where the incident is, and the
exact commands that reach this job, then one short line every ``every_s`` seconds
until it goes on.
"""
from __future__ import annotations

from typing import Any, Callable

#: What each way on does, in the order an operator weighs them.
VERBS = (("resume", "train on"),
         ("step 1", "run 1 more step (any N), then pause again"),
         ("export", "write every rank's bundle now"),
         ("terminate", "stop the job (Ctrl-C here stops it too)"),
         ("status", "where every rank is"))


def reach_args(address: str | None, job: str, namespace: str | None = None) -> str:
    """The options that make a ``rankscope`` command from another terminal reach this job."""
    parts = [f"--address {address}"] if address else []
    if namespace and namespace != "rankscope":
        parts.append(f"--namespace {namespace}")
    parts.append(f"--job {job}")
    return " ".join(parts)


def held(cut: dict[str, Any] | None) -> bool:
    """Every rank that can take part holds before the cut's step (the others are named)."""
    if not cut or not cut.get("ranks"):
        return False
    want = f"paused before step {cut['step']}"
    partial = cut.get("partial") or {}
    return any(v == want for v in cut["ranks"].values()) and all(
        v == want or r in partial for r, v in cut["ranks"].items())


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"


def since(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def commands(reach: str, export: bool = True) -> list[str]:
    """``export=False``: an incident holds the pause and its bundles are written already
    (a second export of the job is refused while it is open)."""
    verbs = [(v, w) for v, w in VERBS if export or v != "export"]
    width = max(len(v) for v, _ in verbs)
    return [f"    rankscope {verb:<{width}} {reach}   # {what}" for verb, what in verbs]


class PausedNotice:
    def __init__(self, say: Callable[[str], None], job: str, reach: str, every_s: float = 30.0,
                 export_every_s: float = 2.0) -> None:
        self.say, self.job, self.reach = say, job, reach
        self.every_s, self.export_every_s = every_s, export_every_s
        self._held_at: tuple[int, float] | None = None  # (cut step, since when)
        self._next_beat = 0.0
        self._export: dict[str, tuple[tuple, float]] = {}  # incident -> (progress, said at)
        self._written: set[str] = set()
        self._told_commands: tuple | None = None

    def update(self, status: dict[str, Any], now: float) -> None:
        incidents = [i for i in status.get("incidents") or [] if i.get("job") in (None, self.job)]
        for inc in incidents:
            self._export_progress(inc, now)
        cut = ((status.get("jobs") or {}).get(self.job) or {}).get("cut")
        if held(cut):
            self._paused(cut, incidents, now)
        elif self._held_at is not None and cut is None:
            # A terminate also lifts the cut: the ranks leave their hold to exit, not to train.
            went = "terminated" if status.get("terminated") else "resumed: training goes on"
            self.say(f"{went} (was paused before step {self._held_at[0]} for {since(now - self._held_at[1])})")
            self._held_at, self._told_commands = None, None

    def _paused(self, cut: dict[str, Any], incidents: list[dict[str, Any]], now: float) -> None:
        step = cut["step"]
        if self._held_at is None or self._held_at[0] != step:
            self._held_at, self._next_beat = (step, now), now + self.every_s
            ranks = sorted(cut["ranks"], key=int)
            holding = [r for r in ranks if r not in (cut.get("partial") or {})]
            moved = f"; moved from step {cut['moved_from'][0]}, a rank was past it" if cut.get("moved_from") else ""
            self.say(f"PAUSED: {len(holding)} of {len(ranks)} rank(s) hold before step {step} "
                     f"(one consistent step; {cut.get('why', 'pause')}{moved})")
            for r, why in sorted((cut.get("partial") or {}).items(), key=lambda kv: int(kv[0])):
                self.say(f"  rank {r} is not paused: {why}")
        busy = [i for i in incidents if i.get("state") in ("detected", "pausing", "exporting")]
        if not busy:
            key = (step, tuple(sorted(i["incident_id"] for i in incidents if i.get("incident_id"))))
            if self._told_commands != key:
                self._told_commands = key
                held_inc = next((i for i in reversed(incidents) if i.get("state") == "written"), None)
                if held_inc is not None:
                    self.say(f"held on incident {held_inc.get('incident_id')}: {held_inc.get('summary', '')}")
                self.say("the job waits for you; go on with one of (from another terminal):")
                for line in commands(self.reach, export=held_inc is None):
                    self.say(line)
        if now >= self._next_beat:
            self._next_beat = now + self.every_s
            verbs = "resume|step N|terminate" if any(i.get("state") == "written" for i in incidents) \
                else "resume|step N|export|terminate"
            self.say(f"still paused before step {step} for {since(now - self._held_at[1])}; "
                     f"waiting for rankscope {verbs} {self.reach}")

    def _export_progress(self, inc: dict[str, Any], now: float) -> None:
        iid, state = inc.get("incident_id"), inc.get("state")
        if not iid:
            return
        if state == "exporting":
            total = len(inc.get("ranks") or {}) or len(inc.get("bundles") or {})
            progress = (len(inc.get("bundles") or {}), total, int(inc.get("bytes_received") or 0))
            last = self._export.get(iid)
            if last is None or (last[0] != progress and now - last[1] >= self.export_every_s):
                self._export[iid] = (progress, now)
                self.say(f"exporting {iid}: {progress[0]}/{progress[1]} rank bundle(s) in, {mib(progress[2])}")
        elif iid not in self._written and state in ("written", "resumed", "terminated", "continued"):
            self._written.add(iid)
            done = len(inc.get("bundles") or {})
            missing = inc.get("missing_bundles") or []
            self.say(f"incident written: {done} rank bundle(s), {mib(int(inc.get('bytes_received') or 0))}"
                     + (f", missing rank(s) {', '.join(map(str, missing))}" if missing else "")
                     + (f" -> {inc['dir']}" if inc.get("dir") else ""))
