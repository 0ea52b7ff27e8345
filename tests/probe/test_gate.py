"""The StepGate's pause at a named step: ranks behind run on, the rank at the step holds,
a later step releases it, and what it began is always known."""
from __future__ import annotations

import threading
import time

from rankscope.probe.gate import GateState, StepGate


def _train(gate: StepGate, steps: int, log: list[int]) -> threading.Thread:
    def loop() -> None:
        for s in range(steps):
            log.append(s)  # step s runs
            gate.at_step_boundary(s)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def _wait(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred() and time.monotonic() < end:
        time.sleep(0.005)
    assert pred()


def test_pause_at_a_step_holds_before_it_and_a_later_step_moves_it() -> None:
    gate, log = StepGate(), []
    gate.pause("inc", at=4)
    t = _train(gate, 10, log)
    _wait(lambda: gate.waiting_at is not None)
    assert gate.waiting_at == 3 and log == [0, 1, 2, 3] and gate.started == 3
    gate.pause("inc", at=6)  # the cut moved: run steps 4 and 5, hold before 6
    _wait(lambda: gate.waiting_at == 5)
    assert log == list(range(6)) and gate.started == 5 and gate.incident == "inc"
    gate.resume()
    t.join(10)
    assert log == list(range(10)) and gate.started == 10 and gate.hold_at is None


def test_a_rank_already_past_the_step_holds_at_its_next_boundary() -> None:
    gate, log = StepGate(), []
    for s in range(5):
        gate.at_step_boundary(s)
    assert gate.started == 5
    gate.pause(at=3)  # arrived late: this rank began step 5 already
    t = _train_from(gate, 5, log)
    _wait(lambda: gate.waiting_at is not None)
    assert gate.waiting_at == 5 and gate.started == 5 and gate.state is GateState.PAUSED
    gate.resume()
    t.join(10)


def _train_from(gate: StepGate, first: int, log: list[int]) -> threading.Thread:
    def loop() -> None:
        for s in range(first, first + 3):
            log.append(s)
            gate.at_step_boundary(s)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def test_running_gate_costs_nothing_and_counts_steps_begun() -> None:
    gate = StepGate()
    assert gate.started is None
    for s in range(3):
        gate.at_step_boundary(s)
    assert gate.started == 3 and gate.waiting_at is None


_UNCAUGHT = """
import sys
from rankscope.probe.gate import StepGate
prev_seen = []
sys.excepthook = lambda *a: prev_seen.append(a[0].__name__) or sys.__excepthook__(*a)
g = StepGate()
g.who = lambda: "rank 2"  # what the debugger sets once it knows its rank
g.terminate("inc-7", "replica at step 3")
try:
    g.at_step_boundary(3)
finally:
    print("cleanup ran", flush=True)
"""


def test_a_termination_nobody_catches_ends_the_rank_with_one_line_not_a_traceback(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(_UNCAUGHT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cleanup ran" in out.stdout
    assert out.stderr.strip().splitlines() == [
        "[rankscope] rankscope terminated rank 2 on incident inc-7: replica at step 3"]
    # Any other uncaught error still prints its traceback through the script's own hook.
    script.write_text("import sys\nfrom rankscope.probe.gate import StepGate\ng = StepGate()\n"
                      "g.terminate(None)\ntry:\n    g.at_step_boundary(0)\nexcept Exception:\n    pass\n"
                      "raise ValueError('bad batch')\n")
    other = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert other.returncode == 1 and "Traceback" in other.stderr and "ValueError: bad batch" in other.stderr


def test_a_leaving_process_is_never_held_nor_terminated_at_its_last_boundary() -> None:
    # The last step of a compiled job ends in an exit handler, often after an error (a
    # collective that timed out): held there, the rank would never exit and its launcher
    # would never tear the job down.
    for order in (lambda g: g.pause("inc", at=2), lambda g: g.pause("inc"), lambda g: g.terminate("inc")):
        gate = StepGate()
        for s in range(3):
            gate.at_step_boundary(s)
        order(gate)
        gate.closing = True
        done = threading.Event()
        t = threading.Thread(target=lambda: (gate.at_step_boundary(3), done.set()), daemon=True)
        t.start()
        assert done.wait(5), "the leaving process was held at its last boundary"
        assert gate.started == 3 and gate.waiting_at is None
    # A live rank at the same boundary still holds.
    gate = StepGate()
    gate.pause("inc", at=4)
    t = _train(gate, 6, log := [])
    _wait(lambda: gate.waiting_at == 3)
    gate.resume()
    t.join(10)
    assert log == list(range(6))
