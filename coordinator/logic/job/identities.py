"""Job-wide rank ids: the coordinator is the authority when node agents are many.

Each node agent gives its own processes unique ids (``rankscope.node.registry``), but it
sees one host only: data-parallel inference workers on two hosts that all say rank 0
get id 0 from both agents. The agent forwards every registration with the id it
proposes; here the first process to propose an id keeps it, and any other process
proposing an id already held job-wide gets the lowest id nobody holds or ever held.
The agent answers its rank with the id decided here, so every step already carries it.

- a process registering again (agent reconnect, coordinator restart) gets its id back;
- a finished process keeps its id for the job (its dump folder is named by it);
- a lost process's id may be taken by its restart (same id proposed, new pid, same host:
  the agent that lost it restarts it there). A process of another host proposing that id
  gets a fresh one: a worker that ended before another host's first worker registered
  is reported lost by its agent, and two live ids must never be one.

Pure logic: no sockets, no clock.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Job:
    #: id -> (host, pid) of the process holding it
    holder: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: (host, pid) -> its id
    ids: dict[tuple[str, int], int] = field(default_factory=dict)
    lost: set[int] = field(default_factory=set)
    ever: set[int] = field(default_factory=set)


class JobIdentities:
    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}

    def assign(self, job: str, host: str, pid: int, proposed: int | None) -> int:
        """The job-wide id of the process (host, pid) whose agent proposed ``proposed``."""
        j = self._jobs.setdefault(job, _Job())
        proc = (host, int(pid))
        if proc in j.ids:
            return j.ids[proc]
        if proposed is not None and proposed >= 0 and (
                proposed not in j.holder or (proposed in j.lost and j.holder[proposed][0] == host)):
            rank = proposed
        else:
            rank = 0
            while rank in j.holder or rank in j.ever:
                rank += 1
        old = j.holder.get(rank)
        if old is not None:
            j.ids.pop(old, None)  # a restart takes over its lost predecessor's id
        j.holder[rank], j.ids[proc] = proc, rank
        j.lost.discard(rank)
        j.ever.add(rank)
        return rank

    def lose(self, job: str, rank: int) -> None:
        """The process holding ``rank`` died: a restart may take the id over."""
        j = self._jobs.get(job)
        if j is not None and rank in j.holder:
            j.lost.add(rank)

    def holder(self, job: str, rank: int) -> tuple[str, int] | None:
        j = self._jobs.get(job)
        return None if j is None else j.holder.get(rank)


def merge_rank_maps(old: list[dict], new: list[dict]) -> list[dict]:
    """One job-wide rank map from every agent's: rows keyed by (host, pid), the newest
    row of a process winning, ordered by id."""
    rows = {(r.get("host"), r.get("pid")): r for r in old}
    rows.update({(r.get("host"), r.get("pid")): r for r in new})
    return sorted(rows.values(), key=lambda r: (r.get("assigned_rank") is None, r.get("assigned_rank") or 0,
                                                str(r.get("host")), r.get("pid") or 0))
