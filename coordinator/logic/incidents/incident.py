"""Incident data model and state machine (a transition table; no I/O, no clocks).

An incident opens on the first verdict of a job and walks::

    DETECTED -> PAUSING -> EXPORTING -> WRITTEN -> RESUMED | TERMINATED | CONTINUED

as events arrive; each transition yields the actions the coordinator service must
perform (send pause/export/resume/terminate to every node agent, write incident.json).
Which path is taken depends on ``on_divergence``:

* pause: pause, export, write, then hold the cluster paused until an operator resumes
  or terminates (MindInsight's behaviour at a watchpoint hit).
* export: pause, export, write, resume on its own.
* terminate: pause, export, write, terminate.
* continue: export without pausing (flight recorders still hold the last steps),
  write, keep training.

A pause names one step for the whole job (the consistent cut, :mod:`.cut`); when a rank
turns out to be past it already, CUT_MOVED sends the pause again with a later step, in
any state where ranks are (or are being) held. An operator TERMINATE ends any unfinished
incident. Events that are not in the
table raise :class:`IncidentTransitionError`, so a stray event never moves state.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from rankscope.config.cluster import OnDivergence
from rankscope.coordinator.logic.verdict import Verdict


class IncidentState(str, enum.Enum):
    """DETECTED: verdict recorded, nothing done yet. PAUSING: pause sent, waiting for
    every live rank to block at a step boundary. EXPORTING: export sent, waiting for
    every rank's bundle. WRITTEN: incident.json written (policy pause: the cluster is
    held here). RESUMED / TERMINATED / CONTINUED: final."""

    DETECTED = "detected"
    PAUSING = "pausing"
    EXPORTING = "exporting"
    WRITTEN = "written"
    RESUMED = "resumed"
    TERMINATED = "terminated"
    CONTINUED = "continued"


FINAL_STATES = frozenset({IncidentState.RESUMED, IncidentState.TERMINATED, IncidentState.CONTINUED})


class IncidentEvent(str, enum.Enum):
    START = "start"
    ALL_PAUSED = "all_paused"
    PAUSE_TIMEOUT = "pause_timeout"
    CUT_MOVED = "cut_moved"  # a rank was past the pause step: pause again at a later one
    BUNDLES_RECEIVED = "bundles_received"
    EXPORT_TIMEOUT = "export_timeout"
    WRITE_DONE = "write_done"
    RESUME = "resume"  # operator
    TERMINATE = "terminate"  # operator


class ActionKind(str, enum.Enum):
    PAUSE = "pause"
    EXPORT = "export"
    WRITE_INCIDENT = "write_incident"
    RESUME = "resume"
    TERMINATE = "terminate"
    STEP = "step"
    STACKS = "stacks"  # every rank writes all its threads' stacks (the suspects first)


class IncidentTransitionError(ValueError):
    pass


S, E, A, P = IncidentState, IncidentEvent, ActionKind, OnDivergence
_Row = tuple[IncidentState, tuple[ActionKind, ...]]


def _table() -> dict[tuple[OnDivergence, IncidentState, IncidentEvent], _Row]:
    t: dict[tuple[OnDivergence, IncidentState, IncidentEvent], _Row] = {}
    paused_policies = (P.PAUSE, P.EXPORT, P.TERMINATE)
    after_write = {P.PAUSE: (S.WRITTEN, ()), P.EXPORT: (S.RESUMED, (A.RESUME,)),
                   P.TERMINATE: (S.TERMINATED, (A.TERMINATE,)), P.CONTINUE: (S.CONTINUED, ())}
    for pol in P:
        if pol in paused_policies:
            t[(pol, S.DETECTED, E.START)] = (S.PAUSING, (A.PAUSE,))
            t[(pol, S.PAUSING, E.ALL_PAUSED)] = (S.EXPORTING, (A.EXPORT,))
            # A rank that never pauses (hung) must not block the export of the others.
            t[(pol, S.PAUSING, E.PAUSE_TIMEOUT)] = (S.EXPORTING, (A.EXPORT,))
            for st in (S.PAUSING, S.EXPORTING, S.WRITTEN):
                t[(pol, st, E.CUT_MOVED)] = (st, (A.PAUSE,))
        else:
            t[(pol, S.DETECTED, E.START)] = (S.EXPORTING, (A.EXPORT,))
        t[(pol, S.EXPORTING, E.BUNDLES_RECEIVED)] = (S.WRITTEN, (A.WRITE_INCIDENT,))
        t[(pol, S.EXPORTING, E.EXPORT_TIMEOUT)] = (S.WRITTEN, (A.WRITE_INCIDENT,))
        t[(pol, S.WRITTEN, E.WRITE_DONE)] = after_write[pol]
        for st in S:
            if st not in FINAL_STATES:
                t[(pol, st, E.TERMINATE)] = (S.TERMINATED, (A.TERMINATE,))
    # Only a held (pause policy) incident waits for the operator's resume.
    t[(P.PAUSE, S.WRITTEN, E.RESUME)] = (S.RESUMED, (A.RESUME,))
    return t


TRANSITIONS = _table()


def transition(policy: OnDivergence, state: IncidentState, event: IncidentEvent) -> _Row:
    row = TRANSITIONS.get((policy, state, event))
    if row is None:
        raise IncidentTransitionError(f"incident in state {state.value} (policy {policy.value}) "
                                      f"does not accept event {event.value}")
    return row


@dataclass
class Action:
    """Something the coordinator service must do; ``incident_id`` is None for plain
    operator control (pause/resume/step without an incident)."""

    kind: ActionKind
    job: str
    incident_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Incident:
    incident_id: str
    job: str
    policy: OnDivergence
    verdict: Verdict
    detected_at: float  # wall clock (epoch seconds)
    state: IncidentState = IncidentState.DETECTED
    related: list[dict[str, Any]] = field(default_factory=list)  # later verdicts, bounded
    bundles: dict[int, str] = field(default_factory=dict)  # rank -> path
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> state/step at pause
    history: list[tuple[str, str, float]] = field(default_factory=list)  # (event, new state, wall)
    incident_json: str | None = None
    #: The consistent cut (:meth:`CutKeeper.report`): the step every rank holds before,
    #: and why any rank is not there.
    cut: dict[str, Any] | None = None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def apply(self, event: IncidentEvent, wall: float) -> list[Action]:
        """Move by the table; return the actions the transition asks for."""
        new, kinds = transition(self.policy, self.state, event)
        self.state = new
        self.history.append((event.value, new.value, wall))
        return [Action(k, self.job, self.incident_id) for k in kinds]

    def to_dict(self) -> dict[str, Any]:
        return {
            "incident_id": self.incident_id, "job": self.job, "policy": self.policy.value,
            "verdict": self.verdict.to_dict(), "detected_at": self.detected_at, "state": self.state.value,
            "related": self.related, "bundles": {str(r): p for r, p in self.bundles.items()},
            "ranks": {str(r): v for r, v in self.ranks.items()},
            "history": [list(h) for h in self.history], "incident_json": self.incident_json,
            "cut": self.cut,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Incident":
        return cls(
            incident_id=d["incident_id"], job=d["job"], policy=OnDivergence(d["policy"]),
            verdict=Verdict.from_dict(d["verdict"]), detected_at=float(d["detected_at"]),
            state=IncidentState(d["state"]), related=list(d.get("related", [])),
            bundles={int(r): p for r, p in d.get("bundles", {}).items()},
            ranks={int(r): v for r, v in d.get("ranks", {}).items()},
            history=[tuple(h) for h in d.get("history", [])],  # type: ignore[misc]
            incident_json=d.get("incident_json"), cut=d.get("cut"),
        )
