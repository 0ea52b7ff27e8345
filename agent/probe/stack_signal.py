"""Every thread's Python stack on demand, even while the training thread is stuck.

``faulthandler.register`` installs a C-level handler: on SIGUSR2 it writes every thread's
stack to a file without needing the GIL or a responsive interpreter, so a rank blocked in
a collective (or in a deadlock) can still say where it is. The node agent sends the signal
when a rank of the job dies or when the coordinator declares a hang, and puts the file into
the rank's bundle. The file's path travels in the rank's registration; only a rank that
installed the handler is ever signalled (SIGUSR2's default action would end the process).
"""
from __future__ import annotations

import faulthandler
import os
import signal
import tempfile
from typing import IO

from rankscope.wire.layout import safe_id

SIGNAL = signal.SIGUSR2
_file: IO[str] | None = None


def install(job: str) -> str | None:
    """Register the handler; the file's path, or None when SIGUSR2 belongs to someone else."""
    global _file
    if _file is not None:
        return _file.name
    if signal.getsignal(SIGNAL) not in (signal.SIG_DFL, None):
        return None  # the program handles SIGUSR2 itself: leave it alone
    folder = os.path.join(tempfile.gettempdir(), "rankscope-stacks", safe_id(job))
    try:
        os.makedirs(folder, exist_ok=True)
        _file = open(os.path.join(folder, f"{os.getpid()}.txt"), "w")  # noqa: SIM115 - lives with the process
        faulthandler.register(SIGNAL, file=_file, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError):
        _file = None
        return None
    return _file.name
