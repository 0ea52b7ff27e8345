"""The one error a frame is refused with (its own module: every wire checker raises it)."""
from __future__ import annotations


class ProtocolError(ValueError):
    """A frame that must be rejected; ``reason`` is a short stable tag for counters."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
