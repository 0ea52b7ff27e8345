"""The grid the pages draw, kept on the console's side: the coordinator sends only the
judged steps the console does not hold yet, and each step's column is encoded to JSON
once, when it arrives. A poll then costs the coordinator one step's column and the
console one column's encoding, not the whole ranks x steps window (130 KB of JSON at 256
ranks x 64 steps, every second)."""
from __future__ import annotations

import collections
import json
import threading
from typing import Any


def _json(value: Any) -> bytes:
    return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()


class _Group:
    def __init__(self, ranks: list[int], steps: int) -> None:
        self.ranks = list(ranks)
        self.ranks_json = _json(self.ranks)
        self.columns: collections.deque = collections.deque(maxlen=steps)  # (step, deviation JSON)


class GridWindow:
    """The newest ``steps`` judged steps per group. ``since()`` is what to ask the
    coordinator for; ``merge(part)`` takes its answer; ``encoded()`` is the grid as the
    page reads it (``{group: {ranks, steps, deviation}}``), as JSON bytes. Thread-safe:
    the feed's own reads and the launch's status poll both merge."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self._groups: dict[str, _Group] = {}
        self._lock = threading.Lock()

    def since(self) -> dict[str, int]:
        with self._lock:
            return {label: g.columns[-1][0] for label, g in self._groups.items() if g.columns}

    def merge(self, part: dict[str, Any]) -> None:
        """A coordinator's grid, whole or only its new steps. A group whose ranks changed
        (ranks joined, or the coordinator restarted) starts over from this answer; a group
        the answer lacks is gone (its steps aged out of the coordinator's series)."""
        with self._lock:
            for label in [k for k in self._groups if k not in part]:
                del self._groups[label]
            for label, g in part.items():
                held = self._groups.get(label)
                if held is None or held.ranks != list(g["ranks"]):
                    held = self._groups[label] = _Group(g["ranks"], self.steps)
                newest = held.columns[-1][0] if held.columns else None
                for step, dev in zip(g["steps"], g["deviation"]):
                    if newest is None or step > newest:
                        held.columns.append((step, _json(dev)))
                        newest = step

    def encoded(self) -> bytes:
        with self._lock:
            parts = []
            for label, g in self._groups.items():
                steps = _json([s for s, _ in g.columns])
                devs = b"[" + b",".join(d for _, d in g.columns) + b"]"
                parts.append(_json(label) + b':{"ranks":' + g.ranks_json + b',"steps":' + steps
                             + b',"deviation":' + devs + b"}")
            return b"{" + b",".join(parts) + b"}"


def with_grid(encoded: bytes, grid: bytes) -> bytes:
    """A snapshot's JSON object (``encoded``, without a grid) with ``"grid"`` added."""
    if not (encoded.startswith(b"{") and encoded.endswith(b"}")):
        raise ValueError("a snapshot must encode as a JSON object")
    return encoded[:-1] + (b"," if len(encoded) > 2 else b"") + b'"grid":' + grid + b"}"
