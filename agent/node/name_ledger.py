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
        """The frame to send: unchanged, or a STEP carrying its rank's whole table (a
        STEPS frame: each owed part carrying its rank's)."""
        if not self._owed:
            return frame
        msg = self._decoder.decode(frame)
        if msg is None:
            return frame
        if msg.type == protocol.STEP:
            if not self._pay(f"{msg.job}|{msg.src}", msg.body["new_names"]):
                return frame
        elif msg.type == protocol.STEPS:
            # A list, not a generator: every owed part is paid, not only the first.
            head = msg.body["parts"]
            if not any([self._pay(f"{msg.job}|{src}", names) for src, names in zip(head["src"], head["names"])]):
                return frame
        else:
            return frame
        return encode(msg)

    def _pay(self, key: str, new_names: dict) -> bool:
        """Merge ``key``'s whole table into ``new_names`` if it is owed."""
        if key not in self._owed:
            return False
        self._owed.discard(key)
        sent = dict(new_names)
        new_names.update(self._names.get(key, {}))
        new_names.update(sent)  # what the frame itself says wins
        return True
