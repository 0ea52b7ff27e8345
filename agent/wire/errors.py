"""The one error a frame is refused with (its own module: every wire checker raises it)."""
from __future__ import annotations


class ProtocolError(ValueError):
    """A frame that must be rejected; ``reason`` is a short stable tag for counters."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def check_map(detail: object, where: str, fields: dict[str, type | tuple[type, ...]],
              required: tuple[str, ...]) -> dict:
    """A STATUS detail checked field by field: a map, no unknown field, the required ones
    there, each of its type (a bool only where a bool is wanted). Every error names the
    field as ``where.field``; the caller checks values."""
    if not isinstance(detail, dict):
        raise ProtocolError("bad_field", f"{where} needs a detail map")
    for key in detail:
        if key not in fields:
            raise ProtocolError("bad_field", f"{where}.{key!s:.40} is not a known field")
    for key in required:
        if key not in detail:
            raise ProtocolError("missing_field", f"{where}.{key}")
    for key, val in detail.items():
        want = fields[key]
        if isinstance(val, bool) != (want is bool) or not isinstance(val, want):
            raise ProtocolError("bad_field", f"{where}.{key} is {type(val).__name__}")
    return detail
