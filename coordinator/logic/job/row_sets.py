"""The job's layout laid over one step view's rows: which rows must agree, which compare.

A view's rows are its group's members; :func:`row_sets` numbers each row's replica set
and role set (:mod:`.layout`) so detectors can work set by set with array operations.
Plain data parallelism is one set of every row (``whole``): the detectors then take the
path they always took, at no extra cost.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rankscope.coordinator.logic.job.layout import JobLayout


@dataclass
class RowSets:
    whole: bool
    replica_of: np.ndarray  # (R,) int64 set id per row
    role_of: np.ndarray  # (R,) int64 set id per row
    #: (R,) which data-parallel replica a row is (its place in its role set), -1 unknown:
    #: rows of one replica read the same data, whatever shard or stage they hold.
    data_index: np.ndarray
    opt_state_replicated: bool = True
    #: (R,) which part of the model a row holds (its parameters' names and shapes), -1
    #: unknown: rows of one stage hold pieces of the same weights.
    stage_of: np.ndarray | None = None
    _groups: dict[str, list[np.ndarray]] = field(default_factory=dict, repr=False)

    @classmethod
    def everyone(cls, rows: int) -> RowSets:
        zeros = np.zeros(rows, np.int64)
        return cls(True, zeros, zeros, np.arange(rows, dtype=np.int64))

    def replica_groups(self) -> list[np.ndarray]:
        """Rows of each replica set of two or more rows (a whole view: all rows)."""
        return self._sets("replica", self.replica_of)

    def role_groups(self) -> list[np.ndarray]:
        return self._sets("role", self.role_of)

    def _sets(self, which: str, of: np.ndarray) -> list[np.ndarray]:
        got = self._groups.get(which)
        if got is None:
            order = np.argsort(of, kind="stable")
            _, starts = np.unique(of[order], return_index=True)
            parts = np.split(order, starts[1:])
            got = self._groups[which] = [p for p in parts if p.shape[0] >= 2]
        return got

    def tensor_parallel_groups(self) -> list[np.ndarray]:
        """Rows of each (data replica, stage) holding two or more tensor-parallel shards:
        they read one batch and hold pieces of the same weights."""
        if self.whole or self.stage_of is None:
            return []
        span = int(self.stage_of.max()) + 1
        known = (self.data_index >= 0) & (self.stage_of >= 0)
        return self._keyed("tensor_parallel", np.where(known, self.data_index * span + self.stage_of, -1))

    def pipeline_groups(self) -> list[np.ndarray]:
        """Rows of each data replica that span two or more pipeline stages."""
        got = self._groups.get("pipeline")
        if got is None:
            if self.whole or self.stage_of is None:
                return []
            known = (self.data_index >= 0) & (self.stage_of >= 0)
            rows = self._keyed("data_replica", np.where(known, self.data_index, -1))
            got = self._groups["pipeline"] = [g for g in rows if np.unique(self.stage_of[g]).shape[0] >= 2]
        return got

    def _keyed(self, which: str, key: np.ndarray) -> list[np.ndarray]:
        """Rows grouped by ``key`` (-1: in no group), groups of two or more, computed once."""
        got = self._groups.get(which)
        if got is None:
            got = self._groups[which] = [np.flatnonzero(key == k) for k in np.unique(key[key >= 0])
                                         if int((key == k).sum()) >= 2]
        return got

    def peers_in_replica(self, row: int) -> np.ndarray:
        """A row's tensor-parallel peers: rows of its data replica (they read the same
        batch) holding other shards of the same weights (same stage)."""
        d = self.data_index[row]
        st = self.stage_of
        if d < 0 or self.whole or st is None or st[row] < 0:
            return np.zeros(0, np.int64)
        return np.flatnonzero((self.data_index == d) & (self.role_of != self.role_of[row]) & (st == st[row]))


def row_sets(layout: JobLayout, ranks: np.ndarray) -> RowSets:
    """The sets of a view whose rows hold ``ranks`` (a rank the layout does not know is a
    set of its own: nothing is compared with it)."""
    n = ranks.shape[0]
    if layout.whole:
        out = RowSets.everyone(n)
        out.opt_state_replicated = layout.opt_state_replicated
        return out
    rep_ids: dict[tuple, int] = {}
    role_ids: dict[tuple, int] = {}
    replica_of = np.empty(n, np.int64)
    role_of = np.empty(n, np.int64)
    data_index = np.full(n, -1, np.int64)
    stage_of = np.full(n, -1, np.int64)
    stage_ids: dict[str, int] = {}
    for i, r in enumerate(ranks.tolist()):
        key = layout.stage_keys.get(r)
        if key is not None:
            stage_of[i] = stage_ids.setdefault(key, len(stage_ids))
        rep = layout.replicas.get(r, (r,))
        role = layout.roles.get(r, (r,))
        replica_of[i] = rep_ids.setdefault(rep if len(rep) > 1 else ("own", r), len(rep_ids))
        role_of[i] = role_ids.setdefault(role if len(role) > 1 else ("own", r), len(role_ids))
        if len(role) > 1:
            data_index[i] = role.index(r)
    return RowSets(False, replica_of, role_of, data_index, layout.opt_state_replicated, stage_of)
