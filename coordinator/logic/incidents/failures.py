"""Crashes and hangs: name the rank that failed first, not the ranks taken down with it.

When one rank of a data-parallel job dies, the launcher (msrun: SIGKILL within a second)
or the collective's own timeout takes the others down: the last to die, or the first to
report a timeout, is usually a victim. Two facts decide instead:

- **When** each rank died, on one clock (the agent's death time moved by its measured
  offset to the coordinator). Deaths that arrive within ``settle_s`` of the first are
  judged together; the earliest is the cause, the others are followers with their delay.
- **Where** each rank stood relative to the newest collective any of them reached (its
  last sync point, :mod:`rankscope.wire.sync`). In PyNative a collective is launched
  asynchronously: a rank that reached it may already be past the call and blocked at its
  next read of a value, so "reached" is what counts, not "inside". A rank that never
  reached the collective its peers reached is the cause, whether it died (a crash before
  the AllReduce) or is alive but stuck (a deadlock, a long sleep, SIGSTOP); ranks that died
  waiting for it (a collective timeout) are its followers. With nobody dead, peers held at
  one collective for ``hang_timeout_s`` while a rank never reached it is a hang.

The step named is the first step the rank did not complete. A peer that reached step s's
collective finished step s-1, which needs every rank (the probe reads each step's values
at its end, so the step's collectives have completed by then): the dead rank completed
step s-1 too, even when its own step-end records died with it.

Pure logic: deaths and sync points in, verdicts out, times on the coordinator's clock.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any, Callable

from rankscope.coordinator.logic.align.aligner import LIVE_STATES, Group, RankRecord, RankState
from rankscope.coordinator.logic.detectors.common import MAX_EVIDENCE_RANKS
from rankscope.coordinator.logic.align.pace import Pace
from rankscope.coordinator.logic.incidents.stops import is_stop
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.sync import SyncPoint, point_name

#: Deaths this close together are ties unless one of them is a launcher's kill.
TIE_S = 0.05
#: Signals a launcher uses to take a job down: a death by one of them after another
#: rank's death is a consequence.
_TEARDOWN_SIGNALS = (signal.SIGKILL, signal.SIGTERM)


@dataclass
class Death:
    rank: int
    died_at: float  # coordinator wall clock
    exit_status: int | None
    signal: int | None
    reason: str
    exception: str | None
    last_step: int
    sync: SyncPoint | None
    #: (step, token) the rank last began, from the file its node agent read (inference).
    position: tuple[int, int] | None = None

    def summary(self) -> dict[str, Any]:
        return {"rank": self.rank, "exit_status": self.exit_status, "signal": _signal_name(self.signal),
                "reason": self.reason, "exception": self.exception}


@dataclass
class Episode:
    """The deaths of one group judged together, and the verdict they gave."""

    opened: float  # coordinator monotonic clock, when the first death arrived
    deaths: list[Death] = field(default_factory=list)
    verdict: Verdict | None = None
    stopped: bool = False  # judged a stop from outside (:mod:`.stops`): no verdict


class FailureJudge:
    def __init__(self, settle_s: float = 0.5, teardown_s: float = 10.0, hang_timeout_s: float = 120.0) -> None:
        self.settle_s, self.teardown_s, self.hang_timeout_s = settle_s, teardown_s, hang_timeout_s
        self.episodes: dict[str, Episode] = {}  # group label -> the open episode
        self._hung: set[tuple[str, tuple[int, int]]] = set()  # (group, collective) already judged
        self._hang_scan = Pace()  # per group label: its members' sync points

    def death(self, group: Group, d: Death, now: float) -> None:
        ep = self.episodes.get(group.label)
        if ep is not None and ep.stopped:
            if d.died_at - min(x.died_at for x in ep.deaths) <= self.teardown_s:
                ep.deaths.append(d)  # one more rank of the stopped job
                return
            ep = None
        if ep is not None and ep.verdict is not None:
            cause_at = ep.verdict.evidence.get("failed_at")
            if cause_at is None or d.died_at - cause_at <= self.teardown_s:
                _add_follower(ep.verdict, d, cause_at)  # the teardown goes on: listed, not judged again
                return
            ep = None  # a new failure, long after the last one
        if ep is None:
            ep = self.episodes[group.label] = Episode(now)
        ep.deaths.append(d)

    def judge(self, group: Group, now: float, wall_now: float, force: bool = False) -> list[Verdict]:
        """Verdicts due now: an episode whose settle time passed (or any, with ``force``:
        the job is over), or a hang."""
        ep = self.episodes.get(group.label)
        if ep is not None and ep.verdict is None and not ep.stopped and (force or now - ep.opened >= self.settle_s):
            ep.verdict = self._decide(group, ep.deaths, lambda t: wall_now - (now - t))
            if ep.verdict is None:
                ep.stopped = True
                return []
            return [ep.verdict]
        if (ep is None or (ep.verdict is None and not ep.stopped)) and (force or self._hang_scan.due(group.label, now)):
            hung = self._hang(group, wall_now)
            if hung is not None:
                return [hung]
        return []

    # --- deciding -----------------------------------------------------------------------
    def _decide(self, group: Group, deaths: list[Death], to_wall: Callable[[float], float]) -> Verdict | None:
        """``to_wall``: a time on the ingest clock (last heard) on the wall clock deaths use."""
        by_rank = {d.rank: d for d in deaths}
        syncs = _sync_points(group, by_rank)
        blocking = _blocking(syncs)
        cause: Death | None = None
        hung: list[RankRecord] = []
        if blocking is not None:
            absent = _never_entered(group, syncs, blocking, _began(group, by_rank))
            dead_absent = sorted((by_rank[r] for r in absent if r in by_rank), key=lambda d: d.died_at)
            if dead_absent:
                cause = dead_absent[0]
            else:
                hung = [m for m in group.members if m.rank in absent and m.state in _WAITED_ON]
        if cause is None and not hung:
            if is_stop(((d.rank, d.signal, d.died_at) for d in deaths), group.members):
                return None  # stopped from outside: nobody failed first
            cause = _earliest(deaths)
        if cause is not None:
            return self._death_verdict(group, cause, deaths, syncs, blocking, to_wall)
        return self._hang_verdict(group, hung, syncs, blocking, deaths)

    def _death_verdict(self, group: Group, cause: Death, deaths: list[Death], syncs: dict[int, SyncPoint],
                       blocking: SyncPoint | None, to_wall: Callable[[float], float]) -> Verdict:
        pos = cause.position
        if blocking is not None and _before(syncs.get(cause.rank), blocking):
            step = blocking.step  # it never reached the collective of that step
        else:
            step = _completed(group, cause, syncs) + 1
        if pos is not None and pos[0] > step:
            step = pos[0]  # it began that step; the steps before it died unsent
        what = cause.exception or _manner(cause)
        after = _after_the_last_step(group, cause, step)
        if after is not None:
            step, what = after, f"{what}, after its last step ({after}): every other rank had finished there"
        ev: dict[str, Any] = {
            "rule": "first to fail", "reason": cause.reason, "after_last_step": after, "exit_status": cause.exit_status,
            "signal": _signal_name(cause.signal), "exception": cause.exception, "failed_at": cause.died_at,
            "manner": what, "followers": [], "group_newest_step": group.newest_step(),
        }
        if blocking is not None:
            ev["collective"] = _collective(group, syncs, blocking, _began(group, {d.rank: d for d in deaths}))
        token = pos[1] if pos is not None and pos[0] == step else None
        if token is not None:
            ev["manner"] = f"{what} while at token {token} (forward call {token} of step {step})"
        ev["others"] = _others(group, cause, deaths, to_wall)
        v = Verdict(detector="progress", rank=cause.rank, step=step, tensor=None, exec_index=None, kind=None,
                    group=group.label, evidence=ev, ties=_ties(cause, deaths), job=group.job, urgent=True,
                    token=token)
        for d in sorted(deaths, key=lambda d: d.died_at):
            if d is not cause:
                _add_follower(v, d, cause.died_at)
        return v

    def _hang_verdict(self, group: Group, hung: list[RankRecord], syncs: dict[int, SyncPoint],
                      blocking: SyncPoint, deaths: list[Death]) -> Verdict:
        coll = _collective(group, syncs, blocking, _began(group, {d.rank: d for d in deaths}))
        ranks = sorted(m.rank for m in hung)
        ev: dict[str, Any] = {
            "rule": f"never reached {point_name(blocking.what, blocking.seq, blocking.step)}",
            "manner": f"never reached {point_name(blocking.what, blocking.seq, blocking.step)}; "
                      f"rank(s) {', '.join(map(str, coll['entered']))} waited there",
            "reason": "hang", "collective": coll, "failed_at": coll["waiting_since"], "followers": [],
            "last_sync": {str(r): syncs[r].to_wire() if r in syncs else None for r in ranks[:MAX_EVIDENCE_RANKS]},
            "group_newest_step": group.newest_step(),
        }
        v = Verdict(detector="progress", rank=ranks[0], step=blocking.step, tensor=None, exec_index=None, kind=None,
                    group=group.label, evidence=ev, ties=ranks[1:], job=group.job, urgent=True)
        for d in sorted(deaths, key=lambda d: d.died_at):
            _add_follower(v, d, coll["waiting_since"])
        self._hung.add((group.label, blocking.key()))
        return v

    def behind(self, group: Group, missing: list[int]) -> Verdict | None:
        """At a step's deadline, the ranks missing from it, when they are stuck before a
        collective their peers wait in: the hang rule, the deadline being the wait. A
        compiled step's records leave when the next step begins, so a rank stuck between
        steps is missing from the step it completed; the collective names the step it did
        not reach."""
        stuck = self._stuck(group)
        if stuck is None or not {m.rank for m in stuck[2]} <= set(missing):
            return None
        return self._hang_verdict(group, stuck[2], stuck[1], stuck[0], [])

    def _hang(self, group: Group, wall_now: float) -> Verdict | None:
        """With nobody dead: live ranks inside one collective for ``hang_timeout_s`` while
        a peer never entered it."""
        stuck = self._stuck(group)
        if stuck is None or wall_now - stuck[0].at < self.hang_timeout_s:
            return None
        return self._hang_verdict(group, stuck[2], stuck[1], stuck[0], [])

    def _stuck(self, group: Group) -> tuple[SyncPoint, dict[int, SyncPoint], list[RankRecord]] | None:
        """The newest collective some live ranks wait in, not yet named, and the live ranks
        that never reached it: (collective, sync points, those ranks)."""
        if not group.synced:
            return None
        syncs = {m.rank: m.sync for m in group.members if m.sync is not None and m.state in _WAITED_ON}
        blocking = _blocking(syncs)
        if blocking is None or (group.label, blocking.key()) in self._hung:
            return None
        absent = _never_entered(group, syncs, blocking, _began(group, {}))
        hung = [m for m in group.members if m.rank in absent and m.state in _WAITED_ON]
        return (blocking, syncs, hung) if hung else None


# --- helpers ------------------------------------------------------------------------------
#: Ranks that can be inside a collective (a stalled one is: it is what a hang looks like).
_WAITED_ON = LIVE_STATES | {RankState.STALLED}


def _sync_points(group: Group, deaths: dict[int, Death]) -> dict[int, SyncPoint]:
    """Each member's newest known sync point: from its heartbeats, or from its agent's
    report of its death, whichever is newer."""
    out: dict[int, SyncPoint] = {}
    for m in group.members:
        pts = [p for p in (m.sync, deaths[m.rank].sync if m.rank in deaths else None) if p is not None]
        if pts:
            out[m.rank] = max(pts, key=lambda p: (p.key(), p.phase == "out", p.at))
    return out


def _blocking(syncs: dict[int, SyncPoint]) -> SyncPoint | None:
    """The newest collective some rank reached while another had not (what the ones that
    reached it wait on); None when every rank stands at the same one."""
    if not syncs:
        return None
    newest = max(syncs.values(), key=lambda s: s.key())
    if all(s.key() == newest.key() for s in syncs.values()):
        return None
    return min((s for s in syncs.values() if s.key() == newest.key()), key=lambda s: s.at)


def _before(point: SyncPoint | None, blocking: SyncPoint) -> bool:
    return point is None or point.key() < blocking.key()


def _never_entered(group: Group, syncs: dict[int, SyncPoint], blocking: SyncPoint,
                   began: dict[int, int] | None = None) -> list[int]:
    # A rank that never reported a sync point says nothing about collectives (its
    # collectives are not watched): it is not blamed for one. Nor is a rank that began a
    # later step: it ended the collective's step, which needs every rank, so it reached
    # the collective, whatever its last heartbeat (sent at most every few tenths of a
    # second, later on a loaded node) last said.
    # Nor is a rank that reported the collective's step whole (its records are sent once the
    # step is over): a rank that ran to its end and exited before its last sync point was
    # heard had passed every collective its peers still waited in.
    began = began or {}
    return [m.rank for m in group.members if m.rank in syncs and _before(syncs[m.rank], blocking)
            and began.get(m.rank, -1) <= blocking.step and m.last_step < blocking.step]


def _began(group: Group, deaths: dict[int, Death]) -> dict[int, int]:
    """Per member, the newest step it is known to have begun: from its heartbeats, and for
    a dead rank from the position its node agent read after the death (written at every
    step boundary, so it is current where the last heartbeat may not be)."""
    out: dict[int, int] = {}
    for m in group.members:
        steps = [s for s in (m.started, deaths[m.rank].position[0] if m.rank in deaths
                             and deaths[m.rank].position is not None else None) if s is not None]
        if steps:
            out[m.rank] = max(steps)
    return out


def _after_the_last_step(group: Group, cause: Death, step: int) -> int | None:
    """The step the job ended at, when ``cause`` died after it: every other rank finished
    (ended its training normally) with no step past ``step - 1``. "The first step it did
    not complete" would then name a step that never existed."""
    others = [m for m in group.members if m.rank != cause.rank]
    if step < 1 or not others or any(m.state is not RankState.FINISHED or m.last_step >= step for m in others):
        return None
    return step - 1


def _completed(group: Group, d: Death, syncs: dict[int, SyncPoint]) -> int:
    """The last step the dead rank completed: what it reported, what its agent saw, and
    the step before any collective some rank reached."""
    done = max(d.last_step, next((m.last_step for m in group.members if m.rank == d.rank), -1))
    return max([done, *(p.step - 1 for p in syncs.values())])


def _collective(group: Group, syncs: dict[int, SyncPoint], blocking: SyncPoint,
                began: dict[int, int] | None = None) -> dict[str, Any]:
    never = _never_entered(group, syncs, blocking, began)
    entered = sorted(r for r in syncs if r not in never)
    since = min(p.at for p in syncs.values() if p.key() == blocking.key())
    return {"what": blocking.what, "step": blocking.step, "seq": blocking.seq,
            "entered": entered[:MAX_EVIDENCE_RANKS], "never_entered": sorted(never)[:MAX_EVIDENCE_RANKS],
            "waiting_since": since}


def _others(group: Group, cause: Death, deaths: list[Death],
            to_wall: Callable[[float], float]) -> list[dict[str, Any]]:
    """Where the other members stood when the cause was judged: their state, the newest
    step each handed over and the one each said it began (a serving worker's request batch),
    as last heard: ``heard_s`` is how long before the death that was (a fast loop may be a
    step further by then)."""
    dead = {d.rank: d for d in deaths}
    out = []
    for m in sorted(group.members, key=lambda m: m.rank):
        if m.rank == cause.rank:
            continue
        row: dict[str, Any] = {"rank": m.rank, "state": m.state.value, "last_step": m.last_step,
                               "started": m.started}
        if m.last_seen is not None:
            row["heard_s"] = round(max(0.0, cause.died_at - to_wall(m.last_seen)), 3)
        d = dead.get(m.rank)
        if d is not None and d.position is not None:
            row["position"] = {"step": d.position[0], "token": d.position[1]}
        out.append(row)
        if len(out) >= MAX_EVIDENCE_RANKS:
            break
    return out


def _earliest(deaths: list[Death]) -> Death:
    # A launcher's kill that lands at the same instant as a rank's own failure is still
    # the consequence.
    return min(deaths, key=lambda d: (d.died_at, d.signal in _TEARDOWN_SIGNALS, d.rank))


def _ties(cause: Death, deaths: list[Death]) -> list[int]:
    return sorted(d.rank for d in deaths if d is not cause and abs(d.died_at - cause.died_at) <= TIE_S
                  and (d.signal in _TEARDOWN_SIGNALS) == (cause.signal in _TEARDOWN_SIGNALS))


def _add_follower(v: Verdict, d: Death, cause_at: float | None) -> None:
    followers = v.evidence.setdefault("followers", [])
    if any(f["rank"] == d.rank for f in followers) or d.rank == v.rank:
        return
    delay = None if cause_at is None else round(d.died_at - cause_at, 3)
    followers.append({**d.summary(), "delay_s": delay})


def _manner(d: Death) -> str:
    if d.signal:
        return f"killed by {_signal_name(d.signal)}"
    if d.exit_status is not None:
        return f"exited with status {d.exit_status}"
    if d.reason == "exited":
        # The pid is gone but was reaped (by its own parent, e.g. a server's Popen.poll)
        # before its node agent read the zombie's status: a kill and a plain exit look alike.
        return "ended, exit status unknown (reaped by its parent before the agent read it)"
    return d.reason or "ended (exit status unknown)"


def _signal_name(sig: int | None) -> str | None:
    if not sig:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
