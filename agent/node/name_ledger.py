"""Every rank's name table as the node agent saw it, for a coordinator that lost it.

Ranks send each tensor name once (``StepBatch.new_names``). A restarted coordinator
replays the spool from the first unconfirmed frame, which may be long after step 0: it
would get ids without names. After every (re)connect the agent therefore owes each live
rank its full table, and pays it by merging the table into that rank's next STEP frame on
its way out (same src/seq, so de-duplication is unaffected).
"""
from __future__ import annotations

import collections

from rankscope.wire import protocol
from rankscope.wire.protocol import encode


class NameLedger:
    def __init__(self) -> None:
        self._names: dict[str, dict[int, str]] = {}  # "job|src" -> id -> name
        self._owed: set[str] = set()
        self._retired: collections.deque[str] = collections.deque()
        self._decoder = protocol.Decoder(job=None)

    def note(self, key: str, new_names: dict[int, str]) -> None:
        if new_names:
            self._names.setdefault(key, {}).update(new_names)

    def owe_all(self) -> None:
        """After a (re)connect: every rank we know, gone ones too (their frames may be
        among those replayed), gets its table re-sent with its next STEP."""
        self._owed = set(self._names)

    def retire(self, key: str, keep: int = 64) -> None:
        """The rank is gone. Its table stays for replays, but only the last ``keep``
        gone ranks' tables are kept: a long-lived agent serves many jobs."""
        if key not in self._names or key in self._retired:
            return
        self._retired.append(key)
        while len(self._retired) > keep:
            old = self._retired.popleft()
            self._names.pop(old, None)
            self._owed.discard(old)

    def replay_done(self, everyone: bool = False) -> None:
        """Nothing unsent is left: a gone rank sends no more steps, so its debt is void
        (kept, it would make every later frame be decoded in :meth:`attach`). ``everyone``:
        steps no longer take this way (they go to the ingest shards), so nobody owes."""
        if everyone:
            self._owed.clear()
        else:
            self._owed.difference_update(self._retired)

    def seed(self, other: "NameLedger") -> None:
        """Start from ``other``'s tables (names sent before this ledger existed), its gone
        ranks gone here too."""
        for key, table in other._names.items():
            self.note(key, table)
        for key in other._retired:
            self.retire(key)

    @property
    def owed(self) -> bool:
        return bool(self._owed)

    def attach(self, frame: bytes) -> bytes:
        """The frame to send: unchanged, or a STEP carrying its rank's whole table."""
        if not self._owed:
            return frame
        msg = self._decoder.decode(frame)
        if msg is None or msg.type != protocol.STEP:
            return frame
        key = f"{msg.job}|{msg.src}"
        if key not in self._owed:
            return frame
        self._owed.discard(key)
        names = dict(self._names.get(key, {}))
        names.update(msg.body["new_names"])
        msg.body["new_names"] = names
        return encode(msg)
