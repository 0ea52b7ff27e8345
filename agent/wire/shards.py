"""Which coordinator ingest shard judges which records: the shard map node agents route by.

Records are split by kind, never inside one kind: the outlier detector pools the spread it
learns over every column of a kind, so a kind judged in two places would learn two
different floors and could name a different rank than one coordinator. Kinds are dealt out
round-robin in an order that keeps the shards' columns even for a data-parallel model
(activations, local grads, parameters, reduced grads are about the same count each).

Every shard receives a batch from every rank for every step, empty when none of the rank's
records are its kinds: a shard decides "rank r reported step s" on its own, so a missing
rank is found identically by each.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rankscope.wire.records import Kind, StepBatch

#: Kinds in the order they are dealt to shards (kind i goes to shard i % count).
DEAL_ORDER = (Kind.FORWARD, Kind.GRAD_LOCAL, Kind.PARAM, Kind.GRAD_REDUCED,
              Kind.BACKWARD, Kind.OPT_STATE, Kind.LOSS, Kind.SAVED)
MAX_SHARDS = len(DEAL_ORDER)
#: The shard count a coordinator uses when its cluster section does not name one.
SHARDS_ENV = "RANKSCOPE_SHARDS"
_ARRAYS = ("name_ids", "kinds", "exec_index", "stats", "nan_count", "inf_count", "numel", "crc32")


def check_shard_count(value: Any, where: str = "shards") -> int:
    """The shard count as a setting: an int from 1 to MAX_SHARDS, else a clear error."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SHARDS:
        raise ValueError(f"{where}: must be an integer from 1 to {MAX_SHARDS} (records are split by kind, "
                         f"and there are {MAX_SHARDS} kinds), got {value!r}")
    return value


class ShardMap:
    def __init__(self, count: int = 1) -> None:
        self.count = check_shard_count(count)
        self.of_kind = np.zeros(256, np.int64)  # kind byte -> shard; an unknown kind goes to shard 0
        for i, k in enumerate(DEAL_ORDER):
            self.of_kind[int(k)] = i % self.count
        self._cache: dict[tuple[str, int], tuple[bytes, list[np.ndarray | None]]] = {}

    def to_wire(self) -> dict[str, Any]:
        return {"count": self.count}

    @classmethod
    def from_wire(cls, d: Any) -> "ShardMap":
        if not isinstance(d, dict) or "count" not in d:
            raise ValueError(f"shard map: expected {{'count': N}}, got {d!r}")
        return cls(check_shard_count(d["count"], "shard map count"))

    def owner(self, kind: str | None) -> int | None:
        """The shard that holds records of ``kind`` (its lower-case name, as a verdict
        names it); None when no kind is named or the name is unknown."""
        try:
            return int(self.of_kind[int(Kind[str(kind).upper()])]) if kind else None
        except KeyError:
            return None

    def kinds_of(self, shard: int) -> list[Kind]:
        return [k for k in DEAL_ORDER if self.of_kind[int(k)] == shard]

    def split(self, b: StepBatch) -> list[StepBatch]:
        """One batch per shard (index = shard id), each with the rank's records of its kinds."""
        if self.count == 1:
            return [b]
        rows = self._rows(b)
        out = []
        for sel in rows:
            if sel is None:  # every row of the batch
                names = b.new_names
                part = b
            else:
                part = dataclasses.replace(b, packed=None, **{a: getattr(b, a)[sel] for a in _ARRAYS})
                names = self._names_for(b, part)
            out.append(part if names is part.new_names else dataclasses.replace(part, new_names=names))
        return out

    def _rows(self, b: StepBatch) -> list[np.ndarray | None]:
        # A rank records the same kinds in the same order every step: reuse the split.
        raw = b.kinds.tobytes()
        hit = self._cache.get((b.job, b.rank))
        if hit is not None and hit[0] == raw:
            return hit[1]
        shard = self.of_kind[b.kinds]
        rows: list[np.ndarray | None] = []
        for s in range(self.count):
            sel = np.flatnonzero(shard == s)
            rows.append(None if sel.shape[0] == shard.shape[0] else sel)
        if len(self._cache) > 1 << 16:  # a node agent serves a few ranks; a bound all the same
            self._cache.clear()
        self._cache[(b.job, b.rank)] = (raw, rows)
        return rows

    @staticmethod
    def _names_for(b: StepBatch, part: StepBatch) -> dict[int, str]:
        # A name goes where its records go, so a shard's column table holds only its own
        # columns; a name announced without a record in this batch goes to every shard.
        if not b.new_names:
            return {}
        here = set(part.name_ids.tolist())
        recorded = set(b.name_ids.tolist())
        return {k: v for k, v in b.new_names.items() if k in here or k not in recorded}
