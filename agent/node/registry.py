"""Which process is which rank: registrations, deterministic remap, the rank map.

Data-parallel inference workers (SGLang/vLLM style) all call themselves rank 0. Their
dump folders would collide, and the coordinator could not tell them apart. The registry
gives every live process of a job a unique id:

- a claim nobody else holds is kept as is; "holds" means alive, or finished cleanly:
  a process that finished keeps its id for the job (a later worker claiming it would
  write into its dump folder), while a *lost* rank's id may be taken by its restart;
- a data-parallel worker that is alone in its world (world size 1 or unknown, rank 0 or
  none) and reports a DP index asks for that index as its id, so ids follow the
  server's worker order even when the workers register seconds apart;
- claimants of one id are ordered by (DP index, device id, pid) -- what they report,
  so the order does not depend on who connected first -- the first keeps the id, the
  others get the lowest ids that no process claims or ever held.

Registrations are collected for ``settle_s`` before they are answered, so processes
started together are ordered together; later arrivals that clash take fresh ids (an id
already answered is never taken back: the rank's dump folder is named by it).

Pure logic (``rank_map.json`` itself is written with :mod:`rankscope.wire.rank_map`).
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Callable

from rankscope.wire.layout import dump_label


class ProcessState(str, enum.Enum):
    """PENDING: registered, id not answered yet. LIVE: answered, process running.
    FINISHED: said goodbye (normal end). LOST: process gone (or silent) without goodbye."""

    PENDING = "pending"
    LIVE = "live"
    FINISHED = "finished"
    LOST = "lost"


@dataclass
class RankEntry:
    job: str
    host: str
    pid: int
    claimed_rank: int | None
    identity: bytes
    world_size: int | None = None
    dp_index: int | None = None
    dp_size: int | None = None
    device_id: int | None = None
    local_rank: int | None = None
    label: str = ""
    assigned_rank: int | None = None
    remapped: bool = False
    state: ProcessState = ProcessState.PENDING
    registered_at: float = 0.0
    last_step: int = -1
    exit_status: int | None = None
    reason: str = ""
    #: The id a rank already uses (it re-registers with it after an agent restart): it
    #: asks for that id rather than its original claim, so its dump folder stays valid.
    prefer: int | None = None
    extra: dict = field(default_factory=dict)

    def register_body(self) -> dict:
        """The REGISTER this agent forwards for the rank, with the id it proposes."""
        body = {k: getattr(self, k) for k in ("host", "pid", "claimed_rank", "world_size", "dp_index", "dp_size",
                                              "device_id", "local_rank", "label", "assigned_rank")}
        if "versions" in self.extra:
            body["versions"] = self.extra["versions"]
        if self.extra.get("layout") is True:
            body["layout"] = True  # its layout facts follow; its first step waits for them
        return body

    @property
    def wanted(self) -> int | None:
        if self.prefer is not None:
            return self.prefer
        if self.dp_index is not None and self.claimed_rank in (0, None) and (self.world_size or 1) == 1:
            # A data-parallel worker alone in its own world (every one says rank 0): its
            # index in the server's worker order is its id, whenever it registers.
            return self.dp_index
        return self.claimed_rank

    def sort_key(self) -> tuple:
        # Reported placement first (absent sorts last), pid breaks ties.
        return (self.dp_index is None, self.dp_index or 0,
                self.device_id is None, self.device_id or 0, self.pid)

    def folder_label(self) -> str:
        """The dump folder the rank writes once answered: its id names it (``label`` as
        registered is the folder it had before, ``proc{pid}``)."""
        return dump_label(self.assigned_rank) if self.assigned_rank is not None else self.label

    def map_entry(self) -> dict:
        """One rank_map.json row: the original claim next to what was assigned."""
        return {"job": self.job, "claimed_rank": self.claimed_rank, "assigned_rank": self.assigned_rank,
                "remapped": self.remapped, "host": self.host, "pid": self.pid,
                "device_id": self.device_id, "dp_index": self.dp_index, "local_rank": self.local_rank,
                "world_size": self.world_size, "label": self.folder_label(), "claimed_label": self.label,
                "state": self.state.value,
                "last_step": self.last_step, "exit_status": self.exit_status, "reason": self.reason}


def _non_negative(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


_INFO_FIELDS = ("world_size", "dp_index", "dp_size", "device_id", "local_rank", "label")


class RankRegistry:
    def __init__(self, settle_s: float = 0.3, clock: Callable[[], float] = time.monotonic) -> None:
        if settle_s < 0:
            raise ValueError(f"settle_s must be >= 0, got {settle_s}")
        self.settle_s = settle_s
        self._clock = clock
        self._entries: dict[tuple[str, str, int], RankEntry] = {}
        self._by_identity: dict[bytes, RankEntry] = {}  # looked up for every frame
        self._ever_assigned: dict[str, set[int]] = {}
        self._pending_since: dict[str, float] = {}

    # --- registration --------------------------------------------------------------
    def claim(self, identity: bytes, job: str, info: dict) -> RankEntry:
        """Record a REGISTER body. A process registering again (client reconnect) gets
        its existing entry back, with the new routing identity."""
        key = (job, info["host"], int(info["pid"]))
        entry = self._entries.get(key)
        if entry is not None and entry.state in (ProcessState.PENDING, ProcessState.LIVE):
            self._by_identity.pop(entry.identity, None)
            entry.identity = identity
            self._by_identity[identity] = entry
            return entry
        entry = RankEntry(job=job, host=info["host"], pid=int(info["pid"]),
                          claimed_rank=info.get("claimed_rank"), identity=identity,
                          registered_at=self._clock(),
                          prefer=_non_negative(info.get("assigned_rank")),
                          **{k: info[k] for k in _INFO_FIELDS if info.get(k) is not None})
        if isinstance(info.get("versions"), dict):
            entry.extra["versions"] = info["versions"]
        if isinstance(info.get("stacks_file"), str) and info["stacks_file"]:
            entry.extra["stacks_file"] = info["stacks_file"]
        if info.get("layout") is True:
            entry.extra["layout"] = True
        self._entries[key] = entry
        self._by_identity[identity] = entry
        self._pending_since.setdefault(job, entry.registered_at)
        return entry

    def due(self, now: float | None = None) -> list[RankEntry]:
        """Assign ids to every job whose settle window has passed; return the entries
        that just got one (the daemon answers them)."""
        now = self._clock() if now is None else now
        done: list[RankEntry] = []
        for job, since in list(self._pending_since.items()):
            if now - since >= self.settle_s or self._complete(job):
                done += self._assign(job)
                del self._pending_since[job]
        return done

    def _complete(self, job: str) -> bool:
        """Every rank of a known world size is here and no two claim the same id: no
        reason to wait for anyone else."""
        active = [e for e in self.entries(job) if e.state in (ProcessState.PENDING, ProcessState.LIVE)]
        sizes = {e.world_size for e in active if e.world_size}
        claims = [e.wanted if e.state is ProcessState.PENDING else e.assigned_rank for e in active]
        return (len(sizes) == 1 and len(active) == sizes.pop() and None not in claims
                and len(set(claims)) == len(claims))

    def _assign(self, job: str) -> list[RankEntry]:
        entries = self.entries(job)
        pending = sorted((e for e in entries if e.state is ProcessState.PENDING), key=RankEntry.sort_key)
        held = {e.assigned_rank for e in entries if e.state in (ProcessState.LIVE, ProcessState.FINISHED)}
        ever = self._ever_assigned.setdefault(job, set())
        claimed = {e.wanted for e in pending if e.wanted is not None}
        blocked = held | ever | claimed

        def fresh() -> int:
            n = 0
            while n in blocked:
                n += 1
            blocked.add(n)
            return n

        by_claim: dict[int | None, list[RankEntry]] = {}
        for e in pending:
            by_claim.setdefault(e.wanted, []).append(e)
        order = sorted(by_claim, key=lambda c: (c is None, c or 0))
        # Keepers first so a clash's fresh ids never take an id someone claims outright.
        for claim in order:
            first = by_claim[claim][0]
            if claim is not None and claim not in held:
                self._set(first, claim)
                held.add(claim)
        for claim in order:
            for e in by_claim[claim]:
                if e.assigned_rank is None:
                    self._set(e, fresh())
        ever.update(e.assigned_rank for e in pending)  # type: ignore[misc]
        return pending

    @staticmethod
    def _set(entry: RankEntry, rank: int) -> None:
        entry.assigned_rank, entry.state = rank, ProcessState.LIVE
        entry.remapped = entry.claimed_rank is not None and rank != entry.claimed_rank

    def reassign(self, entry: RankEntry, rank: int) -> None:
        """The coordinator's job-wide id replaces the one this host proposed."""
        if entry.assigned_rank != rank:
            self._ever_assigned.setdefault(entry.job, set()).add(rank)
            entry.assigned_rank = rank
            entry.remapped = entry.claimed_rank is not None and rank != entry.claimed_rank

    # --- state changes -------------------------------------------------------------
    def finish(self, entry: RankEntry) -> None:
        entry.state = ProcessState.FINISHED

    def lose(self, entry: RankEntry, exit_status: int | None, reason: str) -> None:
        entry.state, entry.exit_status, entry.reason = ProcessState.LOST, exit_status, reason

    # --- queries -------------------------------------------------------------------
    def entries(self, job: str | None = None) -> list[RankEntry]:
        return [e for e in self._entries.values() if job is None or e.job == job]

    def live(self) -> list[RankEntry]:
        return [e for e in self._entries.values() if e.state is ProcessState.LIVE]

    def by_identity(self, identity: bytes) -> RankEntry | None:
        e = self._by_identity.get(identity)
        return e if e is not None and e.state in (ProcessState.PENDING, ProcessState.LIVE) else None

    def by_rank(self, job: str, rank: int) -> list[RankEntry]:
        """Every entry (live or not) that was assigned ``rank`` in ``job``, newest last."""
        return [e for e in self._entries.values() if e.job == job and e.assigned_rank == rank]

    def rank_map(self, job: str | None = None) -> list[dict]:
        rows = [e.map_entry() for e in self.entries(job) if e.assigned_rank is not None]
        return sorted(rows, key=lambda r: (r["job"], r["assigned_rank"], r["pid"]))
