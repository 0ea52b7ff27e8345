"""A free TCP port to hand a process that binds it later (msrun's master port).

Tried below Linux's ephemeral range (32768-60999): a port the kernel hands out for
bind(0) can be handed out again, to Ray's workers or a ZeroMQ socket, between this check
and the other process's bind. msrun's scheduler then dies of "Address already in use"
and its workers wait for it until their cluster timeout.
"""
from __future__ import annotations

import random
import socket

_PORTS = range(20000, 32000)


def free_port() -> int:
    """A TCP port nothing on this host listens on now, outside the ephemeral range."""
    pick = random.SystemRandom()
    for _ in range(100):
        port = pick.choice(_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every one tried was taken: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
