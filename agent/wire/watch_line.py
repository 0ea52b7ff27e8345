"""How a rank's watch status (STATUS ``watch``) reads to a person: one spelling, used by
the rank's own log line and by ``rankscope launch``."""
from __future__ import annotations

from typing import Any

#: ``how`` when nothing is seen: the line then reads "not watched: <reason>".
UNWATCHED = "not watched"


def watch_line(rank: Any, mode: str, how: str, reason: str = "", who: str | None = None) -> str:
    """``who`` names several ranks at once (``ranks 0-3``) in place of ``rank``."""
    who = who or (f"rank {rank}" if rank is not None else "this process")
    if how == UNWATCHED:
        return f"{who}: not watched: {reason or 'no training step was recognised'}"
    text = f"{who}: {mode} mode, watched through {how}"
    return f"{text} ({reason})" if reason else text
