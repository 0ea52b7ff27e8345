"""What the node agent's decisions ask its socket loop to send (NodeCore -> daemon)."""
from __future__ import annotations

from dataclasses import dataclass, field

Key = tuple[str, int]  # ("job|src", seq) of a durable frame, for acknowledgements


@dataclass
class Outbox:
    """What the loop must send: to ranks by routing identity, and to the coordinator
    (durable frames go through the spool, volatile ones only when the link is idle)."""

    to_ranks: list[tuple[bytes, bytes]] = field(default_factory=list)
    up: list[tuple[bytes, Key | None]] = field(default_factory=list)
    up_volatile: list[bytes] = field(default_factory=list)
    #: Packed STEP parts for the ingest shards: (shard, frame, every part's key), see :mod:`.shard_route`.
    shards: list[tuple[int, bytes, list[Key]]] = field(default_factory=list)
    #: The coordinator's acknowledgements: {"job|src": seq} high-water marks.
    acks: list[dict] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.to_ranks or self.up or self.shards or self.up_volatile or self.acks)
