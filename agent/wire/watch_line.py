"""How a rank's watch status (STATUS ``watch``) reads to a person: one spelling, used by
the rank's own log line and by ``rankscope launch``."""
from __future__ import annotations

from typing import Any

#: ``how`` when nothing is seen: the line then reads "not watched: <reason>".
UNWATCHED = "not watched"


def watch_line(rank: Any, mode: str, how: str, reason: str = "") -> str:
    who = f"rank {rank}" if rank is not None else "this process"
    if how == UNWATCHED:
        return f"{who}: not watched: {reason or 'no training step was recognised'}"
    text = f"{who}: {mode} mode, watched through {how}"
    return f"{text} ({reason})" if reason else text
