"""Job-wide tensor keys: (name, call index) -> a dense integer column.

Each rank numbers its names itself (rankscope.wire.records.NameTable); the coordinator keeps,
per rank, a NumPy array mapping the rank's local id to the job-wide column, so a
batch is placed with one fancy-index (``key_of[batch.name_ids]``) instead of a dict
lookup per tensor. A name recorded twice in one step (a cell called twice) gets one
column per call index; that rare case is the only Python loop.
"""
from __future__ import annotations

import numpy as np

UNKNOWN = -1
#: Limits on a rank's name table as it arrives from the wire.
MAX_NAMES_PER_RANK = 1 << 20
MAX_NAME_CHARS = 4096
#: Distinct name tables remembered per job (a job whose ranks all name differently
#: learns the rest name by name).
MAX_TABLES = 1024
#: Column layouts remembered per job (KeyTable.layouts).
MAX_LAYOUTS = 4096


class KeyTable:
    def __init__(self) -> None:
        self._key: dict[tuple[str, int], int] = {}
        self.names: list[str] = []  # column -> display name ("name" or "name#call")
        self.kind = np.full(64, -1, np.int16)  # column -> Kind, -1 until a record shows it
        #: Name tables learned, by content -> (local ids, their columns, top id + 1). The
        #: ranks of a data-parallel job send the same table; at thousands of ranks learning
        #: each rank's table name by name was most of a shard's first step.
        self.tables: dict[tuple, tuple[np.ndarray, np.ndarray, int, int]] = {}
        #: Column layouts by (RankNames.sig, the batch's name-id bytes): ranks that learned
        #: the same tables and record the same ids land in the same columns.
        self.layouts: dict[tuple, object] = {}

    def __len__(self) -> int:
        return len(self.names)

    def key_for(self, name: str, call: int = 0) -> int:
        k = self._key.get((name, call))
        if k is None:
            k = len(self.names)
            self._key[(name, call)] = k
            self.names.append(name if call == 0 else f"{name}#{call}")
            if k >= self.kind.shape[0]:
                self.kind = np.concatenate([self.kind, np.full(self.kind.shape[0], -1, np.int16)])
        return k

    def base_name(self, key: int) -> str:
        return self.names[key].split("#", 1)[0]

    def learn_kinds(self, keys: np.ndarray, kinds: np.ndarray) -> None:
        known = self.kind[keys]
        if (known < 0).any():
            new = known < 0
            self.kind[keys[new]] = kinds[new]


class RankNames:
    """One rank's local name id -> job-wide column (call index 0)."""

    def __init__(self) -> None:
        self.key_of = np.full(64, UNKNOWN, np.int64)
        self.local_name: dict[int, str] = {}
        #: The KeyTable.tables entries learned, in order: equal for ranks whose mapping is
        #: equal; None once a table was learned name by name (this rank's own).
        self.sig: tuple | None = ()

    def learn(self, table: KeyTable, new_names: dict[int, str]) -> int:
        """Map the rank's new names; returns how many entries were refused as malformed.

        The table comes off the wire: an id must be a small non-negative int and a name a
        string, or a single bad frame could make us allocate an array of 2**32 entries.
        """
        try:
            content: tuple | None = tuple(new_names.items())
            known = table.tables.get(content)  # type: ignore[arg-type]
        except TypeError:  # an unhashable name: refused below
            content, known = None, None
        if known is not None:
            ids, keys, top, index = known
            self._grow(top)
            self.key_of[ids] = keys
            self.local_name.update(new_names)
            self.sig = None if self.sig is None else (*self.sig, index)
            return 0
        bad = [k for k, v in new_names.items()
               if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < MAX_NAMES_PER_RANK
               or not isinstance(v, str) or len(v) > MAX_NAME_CHARS]
        if bad:
            new_names = {k: v for k, v in new_names.items() if k not in set(bad)}
            if not new_names:
                return len(bad)
        top = max(new_names) + 1
        self._grow(top)
        ids = np.fromiter(new_names, np.int64, len(new_names))
        keys = np.fromiter(map(table.key_for, new_names.values()), np.int64, len(new_names))
        self.key_of[ids] = keys
        self.local_name.update(new_names)
        if not bad and content is not None and len(table.tables) < MAX_TABLES:
            table.tables[content] = (ids, keys, top, len(table.tables))
            self.sig = None if self.sig is None else (*self.sig, len(table.tables) - 1)
        else:
            self.sig = None
        return len(bad)

    def _grow(self, top: int) -> None:
        if top > self.key_of.shape[0]:
            grown = np.full(max(top, 2 * self.key_of.shape[0]), UNKNOWN, np.int64)
            grown[: self.key_of.shape[0]] = self.key_of
            self.key_of = grown

    def map(self, name_ids: np.ndarray) -> np.ndarray:
        """Columns for ``name_ids``; UNKNOWN for ids this rank never named."""
        if name_ids.shape[0] and int(name_ids.max()) >= self.key_of.shape[0]:
            out = np.full(name_ids.shape[0], UNKNOWN, np.int64)
            ok = name_ids < self.key_of.shape[0]
            out[ok] = self.key_of[name_ids[ok]]
            return out
        return self.key_of[name_ids]

    def with_calls(self, table: KeyTable, name_ids: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Give the 2nd, 3rd... occurrence of a name in one step its own call-index column."""
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        run_start = np.r_[0, np.flatnonzero(sk[1:] != sk[:-1]) + 1]
        starts = np.repeat(run_start, np.diff(np.r_[run_start, sk.shape[0]]))
        calls = np.empty_like(keys)
        calls[order] = np.arange(sk.shape[0]) - starts
        out = keys.copy()
        for i in np.flatnonzero(calls > 0):  # rare: only repeated calls
            out[i] = table.key_for(self.local_name[int(name_ids[i])], int(calls[i]))
        return out
