"""What a debugger does about compiled code: keep its hooks out of compiles, find the
compiled training steps, feed them to the sentinels, and say how the rank is watched.

One per debugger. The debugger calls :meth:`attach` at construction, :meth:`step_ended`
at every step end and :meth:`close` when it closes; everything else arrives from
MindSpore's compile entry points (compile_guard) and compiled step calls (graph_steps).
"""
from __future__ import annotations

import atexit
import logging
from typing import Any, Callable

from rankscope.probe.graph import compile_guard, kernel_config
from rankscope.probe.comm.collectives import note_cell_collectives
from rankscope.probe.graph.graph_steps import JIT_STEP, PIJIT_STEP, GraphSteps, loss_of
from rankscope.probe.tensors.stats import wait_for_device
from rankscope.probe.watch import PIJIT_UNSEEN, WatchReporter

log = logging.getLogger("rankscope.probe")


def graph_mode() -> bool:
    try:
        from mindspore import context
        return context._get_mode() == context.GRAPH_MODE  # noqa: SLF001
    except Exception:  # noqa: BLE001
        return False


class GraphWatch:
    def __init__(self, dbg: Any) -> None:
        self.dbg = dbg
        self.report = WatchReporter()
        self.steps = GraphSteps(dbg.sync, self._before, self._after, dbg.recorder.error)
        self.steps.known_optimizers = lambda: list(dbg.sentinels.optimizers)
        self.steps.scale_state = dbg.sentinels.loss_scales.state
        self.steps.before_learning = dbg.sentinels.loss_scales.record_now
        dbg.sentinels.loss_scales.on_unclaimed_overflow = self.steps.claim_overflow
        #: Set by autoattach: a compiled training step has ended (the session ends the
        #: step unless Model.train's callback does). A script's own debugger leaves it
        #: None: its own ``step()`` calls end the steps.
        self.on_step: Callable[[Any], None] | None = None
        self._graph_in_step = False
        self.kernels: Any = None  # KernelReader once something is compiled
        self._kernels_tried = False
        self._owed: Any = None  # a compiled step whose end is not settled yet
        self._names_for: Any = None
        self._exit_late = False
        self._stamp: str | None = None

    def attach(self) -> None:
        compile_guard.install()
        if self._on_compile not in compile_guard.listeners:
            compile_guard.listeners.append(self._on_compile)
        self.steps.attach()
        atexit.register(self._at_exit)

    def close(self) -> None:
        if self._on_compile in compile_guard.listeners:
            compile_guard.listeners.remove(self._on_compile)
        self.steps.detach()
        self._owed = None  # a closing session flushes its partial step itself
        try:
            atexit.unregister(self._at_exit)
        except Exception:  # noqa: BLE001
            pass
        self.report.say(self.dbg.rank, self.dbg.client, final=True)
        if self.kernels is not None:
            self.kernels.close()

    def step_cells(self) -> list:
        """The compiled training Cell seen last (its parameter layouts, under semi/auto parallel)."""
        cell = self._names_for
        return [] if cell is None or cell is JIT_STEP or cell is PIJIT_STEP else [cell]

    def _at_exit(self) -> None:
        """Settle the last compiled step; a rank that never showed a step still says
        it was not watched."""
        r = self.report
        if r.silent or self.dbg.closed:
            return
        try:
            self.dbg.gate.closing = True
            self._settle()  # the last step, whether or not the watch line was said at an earlier one
            if self.kernels is not None:
                self.kernels.close()  # every step is read: its scratch folder goes
            if r.said is not None:
                return
            if not self.dbg._identified:  # noqa: SLF001
                # Never trained. msrun's scheduler imports MindSpore too: only a process
                # that compiled something says (locally) that it was not watched, and
                # none registers, which would count it as a rank.
                if compile_guard.compiles:
                    r.say(None, None, final=True)
                return
            self.dbg.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            r.say(self.dbg.rank, None, final=True)

    # ------------------------------------------------------------------ events
    def _on_compile(self, kind: str, obj: Any) -> None:
        graph = graph_mode()
        if kind == "pijit":  # no kernel dump: its files do not follow PIJit's graph runs
            self.report.pijit_calls += 1
            if not self.report.kernel_dump:
                self.report.kernel_problem = PIJIT_UNSEEN
            return
        if kind == "jit" and _mindsporeish(obj):
            return  # MindSpore's own jit functions (an eager optimizer's kernels): not the user's code
        if kind == "jit" and not graph:
            self.report.jit_compiles += 1
        if not self._kernels_tried and (graph or kind == "jit"):
            self._kernels_tried = True
            self._start_kernels()

    def _start_kernels(self) -> None:
        """Before MindSpore's first compile reads it: point it at a kernel dump config."""
        from rankscope.probe.graph.kernel_reader import KernelReader
        r = self.report
        try:
            import mindspore as ms
            dump = kernel_config.install(self.dbg.config.dump_path, self.dbg.config.cluster.graph_kernels,
                                         str(ms.get_context("device_target")))
        except Exception as exc:  # noqa: BLE001 - the job runs on, watched by sentinels only
            r.kernel_problem = f"kernel dump not configured: {exc}"[:200]
            self.dbg.recorder.error("configuring the kernel dump", exc)
            return
        if dump is None:
            r.kernel_problem = "kernel dump off (cluster.graph_kernels)"
            return
        self.kernels = KernelReader(dump, self.dbg.recorder.error)
        r.kernel_dump = dump.describe()

    def _before(self, cell: Any, optimizers: list) -> None:
        self._settle()  # the previous step ends here: its kernel files were read meanwhile
        if cell is not None and cell is not JIT_STEP and cell is not PIJIT_STEP and self._names_for is not cell:
            self._names_for = cell
            note_cell_collectives(cell)
            if self.kernels is not None:
                self.kernels.grad_names = _grad_names(cell, optimizers)
        s = self.dbg.sentinels
        if not s.enabled:
            return
        s.loss_scales.record_now()  # the scale this compiled step multiplies its loss by
        for opt in optimizers:
            s.optimizers.add(opt)
            s.note_stepping(opt)
        # The values this step starts from, read between compiled steps. Parameters only:
        # optimizer state doubles the reads, and a replica's drift shows in its weights.
        s.snapshot(state=False)

    def _after(self, cell: Any, output: Any) -> None:
        self._graph_in_step = True
        if cell is PIJIT_STEP or (cell is JIT_STEP and not graph_mode()):  # a jit step inside PyNative
            self.report.jit_steps += 1
        else:
            self.report.graph_steps += 1
        self._say_what_the_level_gets()
        loss = loss_of(output)
        if loss is not None:
            self.dbg.sentinels.record_loss(loss)
        self.dbg.sentinels.snapshot_end(now=True)  # what the compiled update left
        if self.kernels is not None:
            self._submit(self._keep_dir())
        if self.on_step is not None:
            self._owed = cell  # settled at the next step's start (or at exit)

    def _say_what_the_level_gets(self) -> None:
        """A script's own debugger asked for Cells or APIs, which compiled code never runs
        in Python: say once what its dump holds instead."""
        cfg = self.dbg.config
        if self.dbg.auto or cfg.level not in ("L0", "L1", "mix"):
            return
        from rankscope.wire.attach_report import say_once
        instead = ("its kernels' tensor files, in msProbe's static-graph L2 layout (rank*/<time>/step*/)"
                   if cfg.task == "tensor" and self.kernels is not None else
                   "no files: its kernels' statistics stream to the coordinator, and MindSpore's statistic "
                   "kernel dump is GPU/Ascend only" if self.kernels is not None else
                   "no files: the kernel dump is not available here")
        say_once(f"level {cfg.level} dumps Cells and APIs run from Python; this step runs compiled, so the "
                 f"dump of its steps holds {instead}")

    def _submit(self, keep_in: Any) -> None:
        """Hand the step's dump folders to the reader once MindSpore has run the step.
        PyNative runs an @ms.jit graph asynchronously: the call returns (and its folder
        exists) while kernels still run and write there, and a folder read and deleted
        then fails the user's step when MindSpore writes its next file."""
        try:
            wait_for_device()
        except Exception as exc:  # noqa: BLE001 - not listed this step: read at the next one
            self.dbg.recorder.error("waiting for MindSpore to finish the step before reading its kernel dump", exc)
            return
        self.kernels.submit(keep_in)

    def _keep_dir(self) -> Any:
        """task "tensor" on a selected step and rank: keep the kernel tensors, in
        msProbe's static-graph L2 layout, for ``rankscope collect``."""
        dbg, cfg = self.dbg, self.dbg.config
        if cfg.task != "tensor" or not cfg.step_selected(dbg.current_step) or not cfg.rank_selected(dbg.rank):
            return None
        from pathlib import Path

        from rankscope.wire.layout import graph_step_dir
        if self._stamp is None:
            import time
            self._stamp = time.strftime("%Y%m%d%H%M%S")
        label = dbg._label  # noqa: SLF001
        return Path(cfg.dump_path).absolute() / graph_step_dir(label, self._stamp, dbg.current_step)

    def _settle(self) -> None:
        cell, self._owed = self._owed, None
        if cell is not None and self.on_step is not None:
            self.on_step(cell)

    def collect(self) -> None:
        """At a step's end, before its records leave: the step's kernel rows."""
        if self.kernels is None:
            return
        if not self._graph_in_step:  # an eager step that ran jit graphs: read them now
            self._submit(None)
        rows = self.kernels.collect()
        if rows:
            self.dbg.recorder.insert_known([(r.name, r.kind, r.stats) for r in rows])

    def step_ended(self) -> None:
        """At every debugger step end: count the step's kind, say the watch line once."""
        if not self._graph_in_step:
            self.report.eager_steps += 1
        self._graph_in_step = False
        if self.report.said is None:
            self.report.say(self.dbg.rank, self.dbg.client)
        else:
            self.report.say_cost(self.dbg.rank, self.dbg.client)
        if not self._exit_late and self.dbg.client is not None:
            # Run before the node-agent client's own exit handler, which closes it: the
            # last compiled step is settled (sent) at exit.
            self._exit_late = True
            atexit.unregister(self._at_exit)
            atexit.register(self._at_exit)


def _grad_names(cell: Any, optimizers: list) -> list[tuple[str, tuple]]:
    """(parameter name, shape) in the gradient reducer's order, for naming its AllReduce."""
    from rankscope.probe.vitals.sentinel_patches import _reducer_names
    shapes = {p.name: tuple(p.shape) for opt in optimizers for p in getattr(opt, "parameters", ())}
    for _, sub in cell.cells_and_names():
        names = _reducer_names.get(sub) if type(sub).__name__ == "DistributedGradReducer" else None
        if names:
            return [(n, shapes.get(n, ())) for n in names]
    return [(p.name, tuple(p.shape)) for p in getattr(optimizers[0], "parameters", ())] if optimizers else []


def _mindsporeish(executor: Any) -> bool:
    fn = getattr(executor, "fn", None)
    fn = getattr(fn, "__func__", fn)
    return str(getattr(fn, "__module__", "")).startswith("mindspore.")

