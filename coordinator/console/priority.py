"""The console's threads yield the CPU to the job's own processes.

Ray starts its workers, the coordinator actor among them, at a raised niceness (15 here),
while the process serving the console (launch, or ``rankscope console``) runs at 0. On a
busy coordinator host the scheduler then gives the pages' JSON and sockets ~25 times the
coordinator's share, and a judged step waits behind a snapshot being encoded. Linux
applies niceness per thread, so the console's own threads alone are lowered; elsewhere
this does nothing.
"""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

#: The lowest priority: the console is served from whatever CPU the job leaves.
NICE = 19


def yield_cpu() -> None:
    """Lower the calling thread's priority to :data:`NICE` (Linux; once per thread)."""
    setp = getattr(os, "setpriority", None)
    if setp is None or not hasattr(threading, "get_native_id"):
        return
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < NICE:
            setp(os.PRIO_PROCESS, tid, NICE)
    except OSError as exc:  # a sandbox may refuse it: the console still works
        log.debug("console: thread priority left as it is (%s)", exc)
