"""What the training thread and the client's I/O thread share, and nothing else.

The training thread appends steps to ``queue`` (bounded, never blocking); the I/O thread
takes them, learns the assigned id and applies control. Fields are written by one side
only (noted per field), except ``lost_names``, which is guarded by ``lock``.
"""
from __future__ import annotations

import collections
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from rankscope.client.claim import RankClaim
from rankscope.probe.gate import StepGate
from rankscope.probe.comm.sync_tracker import SyncTracker


@dataclass
class ClientState:
    job: str
    src: str
    gate: StepGate
    queue_max: int
    heartbeat_s: float
    queue_max_bytes: int = 64 << 20
    on_export: Callable[[str | None], Iterable[Path]] | None = None
    #: For ``rankscope collect``: where this rank's msProbe-layout dump is.
    dump_path: str | None = None
    pid: int = field(default_factory=os.getpid)
    #: Training thread -> I/O thread: finished steps waiting to be sent.
    queue: collections.deque = field(default_factory=collections.deque)
    #: Names of steps that were dropped, to be sent with the next step that goes out.
    lost_names: dict[int, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Export/collect threads -> I/O thread: ("chunk"|"status", body) items.
    outbox: queue.Queue = field(default_factory=lambda: queue.Queue(maxsize=16))
    dropped: int = 0  # training thread: oldest steps dropped because the queue was full
    sent: int = 0  # I/O thread
    last_step: int = -1  # training thread: the newest step handed to the client
    claim: RankClaim | None = None  # set by register()
    want_register: bool = False  # register() sets it, the I/O thread clears it once sent
    assigned: int | None = None  # I/O thread: the node agent's answer
    remapped: bool = False  # I/O thread
    registered: threading.Event = field(default_factory=threading.Event)
    connected: threading.Event = field(default_factory=threading.Event)
    closing: threading.Event = field(default_factory=threading.Event)
    #: An uncaught exception is ending the rank: the goodbye goes out before the exit.
    dying: threading.Event = field(default_factory=threading.Event)
    bye_sent: threading.Event = field(default_factory=threading.Event)
    bye: dict = field(default_factory=lambda: {"ok": True, "error": ""})
    #: The training thread's collective positions, reported with every heartbeat.
    sync: SyncTracker | None = None
    #: Training thread -> I/O thread (under ``lock``): a STATUS body that must go out
    #: before any step queued after it (the layout facts the coordinator waits for).
    first: dict | None = None
    #: The probe's rankscope.probe.tensors.capture.Captures, once a step has ended: the I/O thread
    #: hands it the capture requests naming this rank.
    captures: Any = None

    @property
    def rank(self) -> int | None:
        if self.assigned is not None:
            return self.assigned
        return self.claim.claimed_rank if self.claim is not None else None
