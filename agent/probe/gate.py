"""Training control at step boundaries: pause, resume, run N steps, terminate.

The probe calls :meth:`StepGate.at_step_boundary` once per step (inside
``PrecisionDebugger.step()`` or the step callback); the node-agent client calls
``pause``/``resume``/``run_steps``/``terminate`` from its own thread when control
arrives. The states are MindInsight's training control (seeds/002) applied to every
rank at once.
"""
from __future__ import annotations

import enum
import threading
from typing import Callable


class GateState(str, enum.Enum):
    """RUNNING: steps pass. PAUSED: the next boundary blocks until resume/step/terminate.
    STEPPING: ``remaining`` more boundaries pass, then PAUSED. TERMINATED: the next
    boundary raises :class:`RankscopeTerminated` (or exits, per ``on_terminate``)."""

    RUNNING = "running"
    PAUSED = "paused"
    STEPPING = "stepping"
    TERMINATED = "terminated"


class RankscopeTerminated(RuntimeError):
    """Raised in the training thread when the coordinator terminates the job."""

    def __init__(self, incident: str | None, reason: str = "") -> None:
        self.incident = incident
        what = f"incident {incident}" if incident else "an operator request"
        super().__init__(f"rankscope terminated this rank on {what}" + (f": {reason}" if reason else ""))


class StepGate:
    def __init__(self, on_state: Callable[[GateState, int], None] | None = None,
                 exit_on_terminate: bool = False, exit_code: int = 86) -> None:
        self._cond = threading.Condition()
        self.state = GateState.RUNNING
        self.remaining = 0
        self.incident: str | None = None
        self.reason = ""
        self.waiting_at: int | None = None  # the step this rank is paused at, if any
        self._on_state = on_state  # told when the rank blocks/unblocks, for status
        self.exit_on_terminate = exit_on_terminate
        self.exit_code = exit_code

    # --- driven by the control thread -------------------------------------------
    def pause(self, incident: str | None = None) -> None:
        with self._cond:
            if self.state != GateState.TERMINATED:
                self.state, self.incident = GateState.PAUSED, incident or self.incident
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            if self.state != GateState.TERMINATED:
                self.state = GateState.RUNNING
            self._cond.notify_all()

    def run_steps(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"step count must be >= 1, got {n}")
        with self._cond:
            if self.state != GateState.TERMINATED:
                self.state, self.remaining = GateState.STEPPING, n
            self._cond.notify_all()

    def terminate(self, incident: str | None = None, reason: str = "") -> None:
        with self._cond:
            self.state, self.incident, self.reason = GateState.TERMINATED, incident or self.incident, reason
            self._cond.notify_all()

    # --- called by the training thread ------------------------------------------
    def at_step_boundary(self, step: int) -> None:
        """Return at once when running; block while paused. Cheap in the common case:
        one attribute read without the lock."""
        if self.state is GateState.RUNNING:
            return
        with self._cond:
            if self.state is GateState.STEPPING:
                self.remaining -= 1
                if self.remaining > 0:
                    return
                self.state = GateState.PAUSED
            notified = False
            while self.state is GateState.PAUSED:
                if not notified:
                    self.waiting_at = step
                    self._notify(GateState.PAUSED, step)
                    notified = True
                self._cond.wait(timeout=1.0)
            self.waiting_at = None
            if notified:
                self._notify(self.state, step)
            if self.state is GateState.TERMINATED:
                self._terminate_now()

    def _terminate_now(self) -> None:
        if self.exit_on_terminate:
            import os
            os._exit(self.exit_code)  # noqa: SLF001 - the job asked to die without cleanup
        raise RankscopeTerminated(self.incident, self.reason)

    def _notify(self, state: GateState, step: int) -> None:
        if self._on_state is not None:
            try:
                self._on_state(state, step)
            except Exception:  # a status callback must never break training
                pass
