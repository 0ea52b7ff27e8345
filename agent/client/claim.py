"""What a rank process says about itself when it registers with its node agent."""
from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass


@dataclass
class RankClaim:
    host: str
    pid: int
    claimed_rank: int | None
    world_size: int | None = None
    dp_index: int | None = None
    #: How many DP workers the server started (each alone in its world of 1).
    dp_size: int | None = None
    device_id: int | None = None
    local_rank: int | None = None
    label: str = ""
    #: Where this rank writes every thread's stack on SIGUSR2 (empty: it does not).
    stacks_file: str = ""
    #: It will say what it sees of the job's parallel layout before its first step.
    layout: bool = False

    @classmethod
    def here(cls, claimed_rank: int | None, **fields) -> "RankClaim":
        return cls(host=socket.gethostname(), pid=os.getpid(), claimed_rank=claimed_rank, **fields)

    def body(self) -> dict:
        body = {k: v for k, v in asdict(self).items()
                if (v is not None and v != "" and v is not False) or k == "claimed_rank"}
        body["versions"] = versions()
        return body


def versions() -> dict:
    """What this rank runs, for the coordinator's report (mismatched builds are a classic)."""
    import importlib.metadata
    import platform

    out = {"python": platform.python_version()}
    for dist in ("rankscope", "mindspore", "numpy", "pyzmq"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except Exception:  # not installed (or broken metadata): leave it out
            pass
    return out
