"""How one node agent runs (``rankscope agent`` flags, or a test's choice)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rankscope.wire.transport import CurveKeys


@dataclass
class AgentSettings:
    listen: str
    coordinator: str | None = None
    job: str | None = None  # None: serve any job
    spool_dir: Path = Path("rankscope-spool")
    bundle_dir: Path = Path("rankscope-agent-bundles")
    flight_recorder_steps: int = 8
    spool_max_bytes: int = 1 << 30
    heartbeat_timeout_s: float = 15.0
    settle_s: float = 0.3
    replay_window_s: float = 10.0
    listen_curve: CurveKeys | None = None  # CURVE server keys when --listen is not local
    coordinator_curve: CurveKeys | None = None  # CURVE client keys for a non-local coordinator
    host: str | None = None  # default: socket.gethostname()
    drain_s: float = 5.0  # on stop, how long to keep sending the backlog
    #: How long a registration waits for the coordinator's job-wide id before the rank is
    #: answered with this host's (0: at once; ranks wait 2 s for their answer).
    assign_wait_s: float = 0.0
    #: Send steps straight to the coordinator's ingest shards when it names them (False:
    #: every step to the coordinator, which relays them; the bench compares the two).
    route_steps: bool = True
