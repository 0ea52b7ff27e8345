"""The watch's tier in one debugger: what ``cluster.watch`` turns on, what it costs, and
the deep capture an anomalous step gets when the per-Cell hooks are off.

- ``full``: every parameter, optimizer state and gradient in full, every step (the
  sentinels' own path), and msProbe's whole L0 dump.
- ``default``: the vital signs and rotating fingerprints (rankscope.probe.vitals.vital) within
  ``cluster.budget``; under launch the Cells' copies of weights and weight gradients are
  left to the sentinels, and the per-Cell hooks are kept only where they fit the budget
  (rankscope.probe.vitals.cell_plan) or where no re-run could bring them back (a loop with no
  ``value_and_grad`` function: Model.train, a TrainOneStepCell; a forward that runs
  collectives, as tensor parallelism does). Where they were taken
  off, a re-run of an anomalous step puts them back for that re-run and records it: the
  deep capture that names the Cell.
"""
from __future__ import annotations

import atexit
from typing import Any, Callable

from rankscope.probe.comm import layout_probe
from rankscope.probe.vitals.cell_plan import DROPPED, KEPT, RESUME, SUSPEND, CellPlan
from rankscope.probe.vitals.vital import VitalSigns
from rankscope.text.watch_line import DEFAULT_TIER, FULL_TIER


class Tier:
    def __init__(self, dbg: Any) -> None:
        self.dbg = dbg
        c = dbg.config.cluster
        self.name = c.watch
        self.vital: VitalSigns | None = None
        self.cells: CellPlan | None = None
        if c.watch == DEFAULT_TIER:
            self.vital = dbg.sentinels.vital = VitalSigns(dbg.recorder, c.budget, dbg.recorder.device_side)
            if dbg.auto:
                # Under launch the weights and their gradients are the sentinels' rows: the
                # Cells' copies of them would cost a pass over the model each.
                dbg.recorder.lean_cells = True
                self.cells = CellPlan(c.budget)
                # The local dump's files cost what the disk costs, not what the step does:
                # written behind the step, they stay out of its budget.
                dbg.writer.write_behind()
        dbg.graph.report.cost_of = self.cost
        rerun = dbg.sentinels.rerun
        if rerun is not None:
            rerun.deep = self.deep_capture
        self._final_said = False
        # A zero-code rank is not closed at its exit: its last measured cost is said then.
        atexit.register(self.say_final)

    def say_final(self) -> None:
        """The watch's last measured cost, once: to the node agent, or as one line."""
        if self._final_said:
            return
        self._final_said = True
        try:
            self.dbg.graph.report.say_cost(self.dbg.rank, self.dbg.client, final=True)
        except Exception as exc:  # noqa: BLE001 - a report at exit is never worth a traceback
            self.dbg.recorder.error("saying the watch's cost", exc)

    def step_ended(self) -> None:
        """After the step's sentinels are told: take the Cell hooks off or put them back."""
        dbg = self.dbg
        if self.cells is None or self.vital is None or not dbg.cells.attached and not dbg.cells.suspended:
            return
        if not any(True for _ in dbg.sentinels.stepping):
            return  # serving, or no optimizer yet: a forward-only record is all there is
        rerun = dbg.sentinels.rerun
        if rerun is None or not rerun.enabled or not dbg.sentinels.grad_fns_seen or rerun.collective_calls \
                or layout_probe.collectives_in_own_groups():
            return  # nothing could put the hooks back for an anomalous step: they stay
        if dbg.sentinels.loss_scales.active:
            # Under a loss scale an overflowing step is the scaler's to skip, never re-run, so
            # a fault that overflows one rank (a NaN or a huge value in its batch) would reach
            # no record of the Cells on any rank: the hooks stay.
            if self.cells.keep():
                dbg.cells.resume()
            return
        b = self.vital.budget
        action = self.cells.note_step(b.last_wall_s, b.last_probe_s)
        if action == SUSPEND:
            dbg.cells.suspend()
        elif action == RESUME:
            dbg.cells.resume()

    def deep_capture(self) -> Callable[[], None] | None:
        """Before a re-run: the Cell hooks, on and recording, if they were taken off; returns
        what puts things back after it (None when the hooks are on and the re-run stays muted)."""
        dbg = self.dbg
        if not dbg.cells.suspended:
            return None
        rec = dbg.recorder
        dumping = rec.dumping
        release = rec.hold_loss()  # the re-run's records go where a full watch has them
        dbg.cells.resume()
        rec.dumping = True

        def undo() -> None:
            release()
            rec.dumping = dumping
            dbg.cells.suspend()
        return undo

    def cost(self) -> dict | None:
        if not self.dbg.sentinels.record:
            return None
        if self.vital is None:
            return {"tier": FULL_TIER}
        out = self.vital.cost()
        if self.cells is not None and self.dbg.cells._given:  # noqa: SLF001 - hooks were ever attached
            out["cells"] = self.cells.state if self.cells.state in (KEPT, DROPPED) else None
            out["cells_share"] = None if self.cells.share is None else round(self.cells.share, 4)
            if self.cells.state == KEPT and out["cells_share"] is not None and out.get("share") is not None:
                out["share"] = round(out["share"] + out["cells_share"], 4)  # kept hooks are part of the cost
        return out
