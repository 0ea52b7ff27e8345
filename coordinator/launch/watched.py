"""Which ranks ``rankscope launch`` actually watched, and the end-of-run line that says so
(the steps each was seen at are the coordinator's coverage, :mod:`rankscope.coordinator.logic.views.coverage`).

A verdict of "no divergence" is only worth what was watched: a rank that failed to
attach trains on unwatched, so launch warns the moment it learns of one, counts it, and
the closing line names how many ranks (and up to which step) were compared. All the
wording of that closing line lives in :func:`end_of_run_line`, so new ways of watching
(or of not watching) a rank are added in one place.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rankscope.wire.attach_report import read_failures, read_notes
from rankscope.text.spans import rank_span
from rankscope.text.watch_line import UNWATCHED

#: Exit status when the command succeeded but some or all of its ranks ran unwatched
#: (and the user did not pass --allow-unwatched): the run was not what was asked for.
UNWATCHED_EXIT = 87
#: Exit status when rankscope terminated the job, or an incident's policy was to.
INCIDENT_EXIT = 86


def loud(msg: str) -> None:
    """A warning a user must not miss: stderr, even under --quiet, never buffered."""
    print(f"[rankscope] WARNING: {msg}", file=sys.stderr, flush=True)


def rank_name(rank: Any, pid: Any = None) -> str:
    return f"rank {rank}" if rank is not None else f"process {pid} (no rank id)"


class AttachWatch:
    """Polls the folder ranks leave attach-failure notes in; warns once per process."""

    def __init__(self, folder: Path, warn: Callable[[str], None] = loud) -> None:
        self.folder = folder
        self.warn = warn
        self.failures: dict[int, dict[str, Any]] = {}
        self.notes_seen: set[str] = set()
        self.notes_said: set[str] = set()

    def poll(self) -> list[dict[str, Any]]:
        self._poll_notes()
        new = [n for pid, n in read_failures(self.folder).items() if pid not in self.failures]
        warned = {_who(n) for n in self.failures.values()}
        for note in new:
            self.failures[int(note["pid"])] = note
            if _who(note) in warned:
                continue  # another process of that rank (a data-loader worker, a restart)
            warned.add(_who(note))
            how = ("could not attach: the error went to its script, which stops there unless it catches it"
                   if note.get("raised") else "failed to attach and runs UNWATCHED")
            self.warn(f"{rank_name(note.get('rank'), note.get('pid'))} {how} "
                      f"(pid {note.get('pid')} on {note.get('host')}): {note.get('reason')}")
        return new


    def _poll_notes(self) -> None:
        """Notes about ranks' settings: each distinct text once, however many ranks left it."""
        for name, note in read_notes(self.folder).items():
            if name in self.notes_seen:
                continue
            self.notes_seen.add(name)
            if note["text"] not in self.notes_said:
                self.notes_said.add(note["text"])
                self.warn(f"{note['text']} (pid {note.get('pid')} on {note.get('host')})")


def heard_from(info: dict[str, Any]) -> bool:
    """A rank the coordinator has a registration or a step from (not merely expected
    because another rank's world size counts it)."""
    step = info.get("step")
    return info.get("pid") is not None or (isinstance(step, int) and step >= 0)


def attached_ranks(status: dict[str, Any] | None) -> list[int]:
    ranks = (status or {}).get("ranks") or {}
    return sorted(int(r) for r, info in ranks.items() if heard_from(info or {}))


#: How a rank missed the watch, as the closing line says it (a note's ``how``; a note
#: without one is an attach failure, whose ``reason`` is the failure's own text).
NEVER_ATTACHED = "never attached"
NO_STEP_SEEN = "attached, no step seen"
SAYS_UNWATCHED = "attached, not watched: its watch line says why"


def unseen_attached(status: dict[str, Any] | None) -> dict[int, str]:
    """Ranks that attached but were not watched, and how: the rank said so (its watch
    line), or it ran to its end without one step reaching the coordinator (its training
    step was never recognised). A rank lost before its first step is not among them:
    its death is what was seen of it."""
    out = {}
    for r, info in ((status or {}).get("ranks") or {}).items():
        info = info or {}
        if not heard_from(info):
            continue
        w, step = info.get("watch"), info.get("step")
        if isinstance(w, dict) and w.get("how") == UNWATCHED:
            out[int(r)] = SAYS_UNWATCHED
        elif info.get("state") == "finished" and not (isinstance(step, int) and step >= 0):
            out[int(r)] = NO_STEP_SEEN
    return out


def silent_ranks(status: dict[str, Any] | None) -> list[int]:
    """Ranks the job's world size promises that never said a word."""
    ranks = (status or {}).get("ranks") or {}
    return sorted(int(r) for r, info in ranks.items() if not heard_from(info or {}))


def still_live(status: dict[str, Any] | None) -> list[int]:
    """Ranks heard from that are not known to have ended yet (finished or lost)."""
    ranks = (status or {}).get("ranks") or {}
    return sorted(int(r) for r, info in ranks.items()
                  if heard_from(info or {}) and (info or {}).get("state") not in ("finished", "lost"))


def end_command_now(terminated_at: float | None, now: float, grace_s: float,
                    status: dict[str, Any] | None) -> str | None:
    """Why the command of a terminated job is killed now (None: not yet): its grace is
    over, or no rank of it is left (what still runs is the launcher's own teardown, which
    can wait on a peer that is gone for as long as the grace)."""
    if terminated_at is None:
        return None
    if now - terminated_at > grace_s:
        return f"job still running {grace_s:.0f} s after terminate: killing it"
    if status is not None and (status.get("ranks") or {}) and not still_live(status):
        return "job terminated and none of its ranks is left: ending the launcher's teardown now"
    return None


def partly_seen(status: dict[str, Any] | None, watched: list[int]) -> list[int]:
    """Watched ranks whose reported way of watching carries a reason (something unseen)."""
    ranks = (status or {}).get("ranks") or {}
    out = []
    for r in watched:
        w = (ranks.get(str(r)) or ranks.get(r) or {}).get("watch")
        if isinstance(w, dict) and w.get("reason"):
            out.append(r)
    return out


def _who(note: dict[str, Any]) -> tuple[str, Any]:
    """One entry per rank; a process with no rank id is itself."""
    return ("rank", int(note["rank"])) if note.get("rank") is not None else ("pid", note.get("pid"))


@dataclass
class WatchedRanks:
    """What was watched: ranks the coordinator heard from, and the ones that never attached."""

    #: None when another process (the cluster's coordinator) knows which ranks it heard from.
    watched: list[int] | None = field(default_factory=list)
    unwatched: list[dict[str, Any]] = field(default_factory=list)  # attach-failure notes
    last_judged_step: int | None = None
    #: Watched ranks whose watch line names something it could not see (its reason).
    partly: list[int] = field(default_factory=list)
    #: Watched ranks compared with no other rank: the job's layout said nothing of them.
    uncompared: list[int] = field(default_factory=list)
    #: Data-parallel ranks seen reading the same data (detectors.same_data), per set.
    same_data: list[list[int]] = field(default_factory=list)

    @classmethod
    def of(cls, status: dict[str, Any] | None, failures: dict[int, dict[str, Any]]) -> "WatchedRanks":
        status = status or {}
        blind = unseen_attached(status)
        watched = [r for r in attached_ranks(status) if r not in blind]
        # A process that failed once and attached later (a restarted worker) is watched.
        unwatched = list({_who(n): n for n in failures.values()
                          if n.get("rank") is None or int(n["rank"]) not in watched}.values())
        noted = {n.get("rank") for n in unwatched}
        unwatched += [{"rank": r, "how": NEVER_ATTACHED} for r in silent_ranks(status) if r not in noted]
        unwatched += [{"rank": r, "how": how} for r, how in sorted(blind.items()) if r not in noted]
        judged = status.get("last_judged_step")
        alone = sorted({int(r) for j in (status.get("jobs") or {}).values()
                        for r in ((j.get("layout") or {}).get("uncompared") or []) if int(r) in watched})
        same = [list(g) for j in (status.get("jobs") or {}).values() for g in ((j.get("same_data") or {}).get("sets")
                                                                             or [])]
        return cls(watched, unwatched, judged if isinstance(judged, int) and judged >= 0 else None,
                   partly_seen(status, watched), alone, same)

    @property
    def complete(self) -> bool:
        return (self.watched is None or bool(self.watched)) and not self.unwatched

    def ranks_text(self, word: str = "watched") -> str:
        watched = self.watched or []
        ids = rank_span(watched)
        return f"{len(watched)} of {len(watched) + len(self.unwatched)} rank(s) {word}" + (f" ({ids})" if ids else "")


NONE_ATTACHED = ("no rank attached (did the command start MindSpore processes, and wait for them rather than "
                 "start them in the background?)")


def end_of_run_line(cov: WatchedRanks, rc: int, found_divergence: bool) -> str:
    """The closing line; claims nothing about ranks or steps that were not watched."""
    tail = f"command exited with {rc}"
    missed = _missed_text(cov.unwatched)
    if not cov.watched:
        why = f"UNWATCHED: {missed}" if missed else NONE_ATTACHED
        return f"NOTHING WAS WATCHED: {why}; {tail}"
    missed = f"; UNWATCHED: {missed}" if missed else ""
    if cov.last_judged_step is None:
        # Ranks that attached and died before any step of theirs was compared: attached
        # (their deaths were seen), not "watched" next to a coverage line saying nothing was.
        said = f"{cov.ranks_text('attached')}, no step was compared{missed}"
        return said if found_divergence else f"no divergence judged: {said}; {tail}"
    steps = f", steps through {cov.last_judged_step} compared"
    if found_divergence:
        return f"{cov.ranks_text()}{steps}{missed}"
    # "No divergence" covers only what was seen: a rank whose watch line names a blind
    # spot (local gradients, a jit body, the kernels) is named here as well.
    partly = f"; NOT ALL SEEN on {rank_span(cov.partly)} (their watch line says what)" if cov.partly else ""
    if cov.uncompared:
        partly += (f"; NOT COMPARED: {rank_span(cov.uncompared)} (no rank shares their role: the layout line "
                   "says why)")
    if cov.same_data:
        partly += "; SAME DATA on " + ", ".join(rank_span(g) for g in cov.same_data) + " (the warning above says why)"
    return f"no divergence found in {cov.ranks_text()}{steps}{partly}{missed}; {tail}"


def _how_missed(note: dict[str, Any]) -> str:
    return note.get("how") or "failed to attach"


def _missed_text(notes: list[dict[str, Any]]) -> str:
    """The unwatched, ranks missed the same way as one span (``ranks 0-3 (never
    attached)``), so a large job's line stays short; a process without a rank id alone."""
    by_how: dict[str, list[int]] = {}
    parts = []
    for n in notes:
        if n.get("rank") is None:
            parts.append(f"{rank_name(None, n.get('pid'))} ({_how_missed(n)})")
        else:
            by_how.setdefault(_how_missed(n), []).append(int(n["rank"]))
    return ", ".join([f"{rank_span(ranks)} ({how})" for how, ranks in by_how.items()] + parts)


def shell_status(returncode: int) -> int:
    """A command killed by signal N is 128+N, as a shell says it (exiting with Popen's -N
    would show as 256-N: 247 for SIGKILL)."""
    return 128 - returncode if returncode < 0 else returncode


def exit_status(cov: WatchedRanks, rc: int, allow_unwatched: bool) -> int:
    """The command's own failure wins; a success with unwatched ranks is not one."""
    if rc != 0 or allow_unwatched or cov.complete:
        return rc
    return UNWATCHED_EXIT


def launch_exit(cov: WatchedRanks, rc: int, allow_unwatched: bool, incidents: list[dict],
                terminated: bool = False) -> int:
    """launch's exit status. ``terminated``: the coordinator says the job was terminated
    (an incident, or ``rankscope terminate``)."""
    if incidents:
        # A job that failed after rankscope terminated it failed *because* of the incident.
        # One that ended cleanly before the terminate reached it (the verdict came after
        # its last step) still diverged, and the user asked a divergence to stop it: the
        # status must not hang on that race.
        stop = any(inc.get("policy") == "terminate" or inc.get("state") == "terminated" for inc in incidents)
        return INCIDENT_EXIT if stop else rc
    if rc != 0 and terminated:
        return INCIDENT_EXIT  # `rankscope terminate` with no incident: still rankscope's doing
    return exit_status(cov, rc, allow_unwatched)
