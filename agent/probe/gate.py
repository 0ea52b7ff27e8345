"""Training control at step boundaries: pause, resume, run N steps, terminate.

The probe calls :meth:`StepGate.at_step_boundary` once per step (inside
``PrecisionDebugger.step()`` or the step callback); the node-agent client calls
``pause``/``resume``/``run_steps``/``terminate`` from its own thread when control
arrives. The states are MindInsight's training control (seeds/002) applied to every
rank at once.

A pause may name the step to hold at (``pause(at=S)``): the rank runs on until the
boundary that would start step ``S`` and blocks there, so every rank of a data-parallel
job stops at the same step (the coordinator's consistent cut) and none is left inside a
collective the others will never enter. A rank that is already past ``S`` when the order
arrives blocks at its next boundary instead; :attr:`StepGate.started` tells the
coordinator, which then moves the cut for everybody.
"""
from __future__ import annotations

import enum
import io
import sys
import threading
from typing import Any, Callable


class GateState(str, enum.Enum):
    """RUNNING: steps pass. PAUSED: the boundary starting step ``hold_at`` (any boundary
    when it is None) blocks until resume/step/terminate.
    STEPPING: ``remaining`` more boundaries pass, then PAUSED. TERMINATED: the next
    boundary raises :class:`RankscopeTerminated` (or exits, per ``on_terminate``)."""

    RUNNING = "running"
    PAUSED = "paused"
    STEPPING = "stepping"
    TERMINATED = "terminated"


class RankscopeTerminated(RuntimeError):
    """Raised in the training thread when the coordinator terminates the job."""

    def __init__(self, incident: str | None, reason: str = "", who: str = "this rank") -> None:
        self.incident = incident
        what = f"incident {incident}" if incident else "an operator request"
        super().__init__(f"rankscope terminated {who} on {what}" + (f": {reason}" if reason else ""))


class StepGate:
    def __init__(self, on_state: Callable[[GateState, int], None] | None = None,
                 exit_on_terminate: bool = False, exit_code: int = 86) -> None:
        self._cond = threading.Condition()
        self.state = GateState.RUNNING
        self.remaining = 0
        self.incident: str | None = None
        #: Names the rank in the termination's message ("rank 2"), once it is known.
        self.who: Callable[[], str | None] | None = None
        self.reason = ""
        self.waiting_at: int | None = None  # the step this rank is paused at, if any
        self.hold_at: int | None = None  # PAUSED: block before this step starts (None: next boundary)
        #: The step this rank last began (training thread; one int store per boundary).
        self.started: int | None = None
        #: Set before a process's last boundary, ended from an exit handler (a compiled
        #: step settled at exit, a serving worker's final batch): no step begins after it,
        #: so ``started`` stays on the one that ended, and nothing holds it there.
        self.closing = False
        self._on_state = on_state  # told when the rank blocks/unblocks, for status
        self.exit_on_terminate = exit_on_terminate
        self.exit_code = exit_code

    # --- driven by the control thread -------------------------------------------
    def pause(self, incident: str | None = None, at: int | None = None) -> None:
        """Block at the next boundary, or (``at``) at the one that would start step ``at``.
        A new ``at`` replaces the old one: a rank held before an earlier step runs on."""
        with self._cond:
            if self.state != GateState.TERMINATED:
                self.state, self.incident = GateState.PAUSED, incident or self.incident
                self.hold_at = at
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            if self.state != GateState.TERMINATED:
                self.state, self.hold_at = GateState.RUNNING, None
            self._cond.notify_all()

    def run_steps(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"step count must be >= 1, got {n}")
        with self._cond:
            if self.state != GateState.TERMINATED:
                self.state, self.remaining, self.hold_at = GateState.STEPPING, n, None
            self._cond.notify_all()

    def terminate(self, incident: str | None = None, reason: str = "") -> None:
        with self._cond:
            self.state, self.incident, self.reason = GateState.TERMINATED, incident or self.incident, reason
            self._cond.notify_all()

    # --- called by the training thread ------------------------------------------
    def at_step_boundary(self, step: int) -> None:
        """``step`` has just ended. Return at once when running; block while paused.
        Cheap in the common case: one attribute read without the lock."""
        nxt = step if self.closing else step + 1
        if self.started is None:
            self.started = step  # the first boundary: this rank was inside ``step``
        if self.closing:
            # The process is leaving (often on an error: a collective that timed out). A
            # pause or a termination must not hold or re-route its exit: its launcher
            # tears the job down when a rank ends, and a rank held here keeps every
            # other rank of the job waiting on it.
            self.started = nxt
            return
        if self.state is GateState.RUNNING:
            self.started = nxt
            return
        with self._cond:
            if self.state is GateState.STEPPING:
                self.remaining -= 1
                if self.remaining > 0:
                    self.started = nxt
                    return
                self.state, self.hold_at = GateState.PAUSED, None
            notified = False
            while self.state is GateState.PAUSED and (self.hold_at is None or step + 1 >= self.hold_at):
                if not notified:
                    self.waiting_at = step
                    self._notify(GateState.PAUSED, step)
                    notified = True
                self._cond.wait(timeout=1.0)
            self.waiting_at = None
            if self.state is not GateState.TERMINATED:
                self.started = nxt
            if notified:
                self._notify(self.state, step)
            if self.state is GateState.TERMINATED:
                self._terminate_now()

    def _terminate_now(self) -> None:
        if self.exit_on_terminate:
            import os
            os._exit(self.exit_code)  # noqa: SLF001 - the job asked to die without cleanup
        _say_uncaught_termination_in_one_line()
        raise RankscopeTerminated(self.incident, self.reason, self._who())

    def _who(self) -> str:
        # Ranks share a terminal under most launchers: each line says whose it is.
        try:
            who = self.who() if self.who is not None else None
        except Exception:  # a label is not worth failing the termination over
            who = None
        return who or "this rank"

    def _notify(self, state: GateState, step: int) -> None:
        if self._on_state is not None:
            try:
                self._on_state(state, step)
            except Exception:  # a status callback must never break training
                pass


def _say_uncaught_termination_in_one_line() -> None:
    """The script's code gets the exception (its ``finally`` and ``except`` run), but one
    that nobody catches ends the rank with a one-line reason, not a traceback through the
    probe that reads like a crash of the job (every rank prints one at once)."""
    previous = sys.excepthook
    if getattr(previous, "rankscope_quiet", False):
        return

    def hook(kind: Any, value: Any, tb: Any) -> None:
        if not isinstance(value, RankscopeTerminated):
            previous(kind, value, tb)
            return
        # The hooks before this one still run (the crash recorder keeps its bundle); only
        # the traceback they would print is dropped.
        real, sys.stderr = sys.stderr, io.StringIO()
        try:
            previous(kind, value, tb)
        finally:
            sys.stderr = real
        real.write(f"[rankscope] {value}\n")
        real.flush()

    hook.rankscope_quiet = True  # type: ignore[attr-defined]
    sys.excepthook = hook
