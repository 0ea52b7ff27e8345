"""The node agent's connection to the coordinator: nothing recorded is lost on a restart.

Durable frames (steps, registrations, rank loss, bundle chunks) go through the
:class:`~rankscope.node.spool.SpoolLog`; the uplink sends from it while the connection is up
and tracks what it sent until it is confirmed:

- by an acknowledgement from the coordinator -- a ``STATUS`` message with
  ``what == "ack"`` and ``detail == {"high": {src: seq}}`` (its ReplayFilter's state);
- or, for a coordinator that does not acknowledge, once a frame was sent more than
  ``replay_window_s`` ago (or more than ``replay_bytes`` were sent after it) on a
  connection that did not drop in between.

A disconnect (socket monitor event) rewinds the spool to the first unconfirmed frame, so
what died in the old coordinator's buffers is sent again, in order. Heartbeats are
*volatile*: sent only when the link is up and the backlog is empty, never spooled.
"""
from __future__ import annotations

import collections
import logging
import time
from typing import Callable

import zmq

from rankscope.node.spool import Pos, SpoolLog
from rankscope.wire.transport import CurveKeys, connect_watched_dealer

log = logging.getLogger(__name__)

Key = tuple[str, int]  # ("job|src", seq) of a frame, for acknowledgements
#: A frame's keys: one, or every part's of a packed frame (confirmed when all are acked).
Keys = Key | list[Key]


class Uplink:
    def __init__(self, ctx: zmq.Context, endpoint: str, identity: bytes, spool: SpoolLog, *,
                 curve: CurveKeys | None = None, replay_window_s: float = 10.0,
                 replay_bytes: int = 64 << 20, clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoint = endpoint
        self.sock, self.watch = connect_watched_dealer(ctx, endpoint, identity, curve)
        self.spool = spool
        self.replay_window_s = replay_window_s
        self.replay_bytes = replay_bytes
        self._clock = clock
        # Sent, not yet confirmed: (start, position after the frame, send time, size).
        self._inflight: collections.deque[tuple[Pos, Pos, float, int]] = collections.deque()
        self._inflight_bytes = 0
        # Start position -> the key(s) of every unconfirmed frame appended in this run
        # (frames left by an earlier run have none and are confirmed by age only).
        self._keys: dict[Pos, Keys] = {}
        self._acked: dict[str, int] = {}
        #: Called with each frame just before it is sent (the daemon re-attaches name
        #: tables after a reconnect); returns the frame to send.
        self.rewrite: Callable[[bytes], bytes] | None = None
        self.sent = 0
        self.resent = 0
        self.volatile_dropped = 0

    @property
    def connected(self) -> bool:
        return self.watch.connected

    # --- sending -------------------------------------------------------------------
    def send(self, frame: bytes, key: Keys | None = None) -> bool:
        """Queue a durable frame (spool first, then sent by :meth:`pump`). False when the
        spool is full and the frame was dropped."""
        pos = self.spool.append(frame)
        if pos is None:
            return False
        if key is not None:
            self._keys[pos] = key
        self.pump()
        return True

    def send_volatile(self, frame: bytes) -> bool:
        if not self.connected or self.spool.has_unsent():
            self.volatile_dropped += 1
            return False
        try:
            self.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            self.volatile_dropped += 1
            return False
        return True

    def pump(self, max_frames: int = 512) -> int:
        """Send unsent spool frames while the link takes them; returns how many went."""
        n = 0
        while n < max_frames and self.connected:
            item = self.spool.peek()
            if item is None:
                break
            after, frame = item
            start = self.spool.sent
            out = self.rewrite(frame) if self.rewrite is not None else frame
            try:
                self.sock.send(out, zmq.NOBLOCK)
            except zmq.Again:
                break  # high-water mark or link just went down: try again next pump
            self.spool.advance(after)
            self._inflight.append((start, after, self._clock(), len(frame)))
            self._inflight_bytes += len(frame)
            n += 1
        self.sent += n
        return n

    # --- connection and confirmation -----------------------------------------------
    def poll_link(self) -> list[bool]:
        """Process monitor events; on a drop rewind to the first unconfirmed frame."""
        changes = self.watch.changes()
        for up in changes:
            if not up:
                self._rewind()
            else:
                log.info("coordinator %s connected", self.endpoint)
        return changes

    def _rewind(self) -> None:
        if not self._inflight:
            return
        log.warning("coordinator %s disconnected; %d sent frames not confirmed will be sent again",
                    self.endpoint, len(self._inflight))
        self.resent += len(self._inflight)
        self._inflight.clear()
        self._inflight_bytes = 0
        self.spool.rewind()

    def on_ack(self, high: dict) -> None:
        for src, seq in high.items():
            if isinstance(src, str) and isinstance(seq, int) and seq > self._acked.get(src, -1):
                self._acked[src] = seq
        self.confirm()

    def confirm(self) -> None:
        """Trim confirmed frames from the spool (acked, or old enough on a live link)."""
        if not self._inflight or not self.connected:
            return  # age counts only on a link that stayed up
        now = self._clock()
        upto: Pos | None = None
        while self._inflight:
            start, after, t, size = self._inflight[0]
            key = self._keys.get(start)
            acked = key is not None and (self._acked.get(key[0], -1) >= key[1] if type(key) is tuple
                                         else all(self._acked.get(k, -1) >= q for k, q in key))
            if not (acked or now - t > self.replay_window_s or self._inflight_bytes > self.replay_bytes):
                break
            self._inflight.popleft()
            self._keys.pop(start, None)
            self._inflight_bytes -= size
            upto = after
        if upto is not None:
            self.spool.confirm(upto)

    def recv(self) -> bytes | None:
        try:
            return self.sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None

    @property
    def backlog(self) -> bool:
        """Whether frames wait in the spool (the coordinator is behind or away)."""
        return self.spool.has_unsent()

    def close(self) -> None:
        self.watch.close()
        self.sock.close(0)
        self.spool.close()
