"""Who probes this process: the auto-attached session, or the script's own debugger.

Under ``rankscope launch`` an auto session starts when MindSpore is imported. A script
that then builds its own ``PrecisionDebugger`` takes over: the session detaches and hands
its (already registered) node-agent connection over, so nothing is hooked or registered
twice. The session registers how to stand down here; the debugger asks here, so neither
module imports the other.
"""
from __future__ import annotations

from typing import Any, Callable

#: (client, rank, dump label) the new debugger adopts, or None when nothing was running.
Handover = tuple[Any, "int | None", str]

_stand_down: Callable[[Any], Handover | None] | None = None


def register(stand_down: Callable[[Any], Handover | None] | None) -> None:
    global _stand_down
    _stand_down = stand_down


def take_over(debugger: Any) -> Handover | None:
    fn = _stand_down
    return fn(debugger) if fn is not None else None
