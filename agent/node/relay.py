"""Which local ranks a coordinator CONTROL goes to, and what a late-joining rank must hear.

Pure logic: the daemon sends the frames. A pause or terminate is *sticky*: a rank that
registers after the cluster was paused gets the same command right after its id, so it
stops at its first step boundary like everybody else; ``resume`` clears it. A pause that
names its step (``args.at``, the job's consistent cut) holds the newcomer before that same
step, and a ``step`` that names one moves the cut, so it becomes the sticky frame. A
plain ``step N`` is not sticky (a newcomer has no N steps to catch up on; it is paused
instead).
"""
from __future__ import annotations

from rankscope.node.registry import ProcessState, RankEntry, RankRegistry
from rankscope.wire import job_config, job_state
from rankscope.wire.protocol import Message

_STICKY = ("pause", "terminate")


class ControlRelay:
    def __init__(self) -> None:
        self._sticky: dict[str, bytes] = {}  # job -> frame of the last pause/terminate
        self._terminated: set[str] = set()  # jobs ("*": every job) the coordinator terminated

    def targets(self, registry: RankRegistry, msg: Message) -> list[RankEntry]:
        """Live local ranks addressed by ``msg`` (its job, or every job when empty;
        ``target`` narrows to one assigned rank)."""
        target = msg.body.get("target")
        return [e for e in registry.entries()
                if e.state is ProcessState.LIVE and (not msg.job or e.job == msg.job)
                and (target is None or e.assigned_rank == target)]

    def gone(self, registry: RankRegistry, msg: Message) -> list[RankEntry]:
        """Ranks addressed by ``msg`` whose process is gone (lost or finished): the agent
        answers an export for them. Only the newest entry per assigned id counts (a
        restarted rank's earlier incarnation is history, not a rank of the job now)."""
        target = msg.body.get("target")
        live = {(e.job, e.assigned_rank) for e in registry.entries() if e.state is ProcessState.LIVE}
        newest: dict[tuple[str, int | None], RankEntry] = {}
        for e in registry.entries():
            if (e.state in (ProcessState.LOST, ProcessState.FINISHED) and (not msg.job or e.job == msg.job)
                    and (target is None or e.assigned_rank == target) and (e.job, e.assigned_rank) not in live):
                newest[(e.job, e.assigned_rank)] = e
        return list(newest.values())

    def remember(self, msg: Message, frame: bytes) -> None:
        if msg.body.get("target") is not None:
            return  # a command for one rank says nothing about newcomers
        command = msg.body["command"]
        jobs = [msg.job] if msg.job else ["*"]
        for job in jobs:
            if command == "terminate":
                self._terminated.add(job)
            if command in _STICKY or (command == "step" and (msg.body.get("args") or {}).get("at") is not None):
                self._sticky[job] = frame
            elif command == "step" and job in self._sticky:
                pass  # still paused afterwards: keep the pause for newcomers
            elif command == "resume":
                if job == "*":
                    self._sticky.clear()
                else:
                    self._sticky.pop(job, None)

    def for_newcomer(self, job: str) -> bytes | None:
        return self._sticky.get(job) or self._sticky.get("*")

    def answer(self, msg: Message, config: dict | None) -> dict:
        """The STATUS body answering a question of launch --agent (:data:`QUESTIONS`)."""
        if msg.body["what"] == job_state.WHAT:
            return job_state.body(msg.job in self._terminated or "*" in self._terminated)
        return job_config.body(config)


#: What launch --agent asks this host's agent (a STATUS with no detail).
QUESTIONS = (job_config.WHAT, job_state.WHAT)
