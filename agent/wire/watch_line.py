"""How a rank's watch status (STATUS ``watch``) reads to a person: one spelling, used by
the rank's own log line and by ``rankscope launch``."""
from __future__ import annotations

import os
from typing import Any

#: ``how`` when nothing is seen: the line then reads "not watched: <reason>".
UNWATCHED = "not watched"
#: The modes a rank's steps run in (``mode``).
PYNATIVE = "PyNative"
GRAPH = "GRAPH"
JIT = "PyNative+jit"


def watch_line(rank: Any, mode: str, how: str, reason: str = "", who: str | None = None,
               rerun: str = "") -> str:
    """``who`` names several ranks at once (``ranks 0-3``) in place of ``rank``; ``rerun``
    says where an anomalous step cannot be re-run."""
    who = who or (f"rank {rank}" if rank is not None else "this process")
    if how == UNWATCHED:
        return f"{who}: not watched: {reason or 'no training step was recognised'}"
    text = f"{who}: {mode} mode, watched through {how}"
    text = f"{text} ({reason})" if reason else text
    return f"{text}; {rerun}" if rerun else text


#: Set by ``rankscope launch`` to the file its own progress lines go to ("dev:inode"):
#: a rank whose stderr is that same file (a script run directly, not under msrun's log
#: files) leaves its watch line to launch, which prints it from the rank's status.
LAUNCH_OUTPUT_ENV = "RANKSCOPE_LAUNCH_OUTPUT"


def stream_id(stream: Any) -> str:
    """"dev:inode" of an open descriptor or file object; "" when it has none."""
    try:
        st = os.fstat(stream if isinstance(stream, int) else stream.fileno())
    except (AttributeError, OSError, ValueError):
        return ""
    return f"{st.st_dev}:{st.st_ino}"


def launch_prints_it(stream: Any) -> bool:
    """True when ``rankscope launch`` prints to the very file ``stream`` writes to."""
    want = os.environ.get(LAUNCH_OUTPUT_ENV, "")
    return bool(want) and stream_id(stream) == want
