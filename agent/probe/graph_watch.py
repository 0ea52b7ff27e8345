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

from rankscope.probe import compile_guard
from rankscope.probe.graph_steps import GraphSteps, loss_of
from rankscope.probe.watch import WatchReporter

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
        #: Set by autoattach: a compiled training step has ended (the session ends the
        #: step unless Model.train's callback does). A script's own debugger leaves it
        #: None: its own ``step()`` calls end the steps.
        self.on_step: Callable[[Any], None] | None = None
        self._graph_in_step = False

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
        try:
            atexit.unregister(self._at_exit)
        except Exception:  # noqa: BLE001
            pass
        self.report.say(self.dbg.rank, self.dbg.client, final=True)

    def _at_exit(self) -> None:
        """A run that never showed a step still says it was not watched, and an
        auto-attached rank registers first so ``rankscope launch`` hears it too."""
        r = self.report
        if r.said is not None or r.silent or self.dbg.closed:
            return
        try:
            if self.dbg.auto and not self.dbg._identified:  # noqa: SLF001
                self.dbg._identify(None)  # noqa: SLF001
            self.dbg.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            r.say(self.dbg.rank, None, final=True)

    # ------------------------------------------------------------------ events
    def _on_compile(self, kind: str, obj: Any) -> None:
        if kind == "jit" and not graph_mode():
            self.report.jit_compiles += 1

    def _before(self, cell: Any, optimizers: list) -> None:
        s = self.dbg.sentinels
        if not s.enabled:
            return
        for opt in optimizers:
            s.optimizers.add(opt)
            s.stepping.add(opt)
        s.snapshot()  # the values this step starts from, read between compiled steps

    def _after(self, cell: Any, output: Any) -> None:
        self._graph_in_step = True
        self.report.graph_steps += 1
        loss = loss_of(output)
        if loss is not None:
            self.dbg.sentinels.record_loss(loss)
        if self.on_step is not None:
            self.on_step(cell)

    def step_ended(self) -> None:
        """At every debugger step end: count the step's kind, say the watch line once."""
        if not self._graph_in_step:
            self.report.eager_steps += 1
        self._graph_in_step = False
        if self.report.said is None:
            self.report.say(self.dbg.rank, self.dbg.client)
