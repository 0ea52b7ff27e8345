"""The one error every config.json problem raises, wherever it is found."""
from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config field is unknown, ill-typed or out of range.

    ``field`` is its dotted path (``cluster.detectors.outlier.z``), ``value`` what was
    given, ``reason`` what was expected: config.json is hand-written, so the message
    must point at the exact spot.
    """

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"config field {field!r} = {value!r}: {reason}")
