"""Step boundaries of compiled training steps, seen from outside the compiled code.

In GRAPH mode a top-level Cell call goes through ``Cell.compile_and_run`` (Python), and
the whole step -- forward, backward, gradient AllReduce, optimizer -- runs inside the
compiled graph, where no Python hook may go (see compile_guard). The call itself is the
one place a step boundary can be observed: before it the parameters hold the values
this step starts from, after it the step's output (the loss) is known and the kernel
dump of that iteration is complete.

A compiled call is a training step when the Cell contains an ``nn.Optimizer``; other
compiled calls (evaluation, predict) pass through untouched. Around each step the
SyncTracker is told ``enter("graph")`` / ``leave("graph")``: a rank that dies or hangs
inside the compiled step is then known to have been inside its collectives.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

from rankscope.probe.graph import compile_guard
from rankscope.wire.sync import GRAPH

_patches: list[tuple[Any, str, Any]] = []
#: What ``after`` gets for the cell of a PIJit step: nothing of rankscope runs inside
#: the call, so its end is the step's end.
PIJIT_STEP = object()
#: The same for an @ms.jit step (a function, in PyNative or GRAPH mode): the optimizer
#: hooks that end an eager step are kept out of the compiled graph (compile_guard), so
#: the call's end is the step's.
JIT_STEP = object()
_active: list["GraphSteps"] = []
#: Calls of a jit function that stepped nothing under a loss scale before it is taken for
#: not a training step (a static scale's overflow steps move no state at all).
_ASK_AGAIN = 16


class GraphSteps:
    """Feeds one debugger from compiled step calls.

    ``before(cell, optimizers)`` runs just before the compiled step (parameter snapshot),
    ``after(cell, output)`` right after it (loss, kernel-dump iteration, step end).
    """

    def __init__(self, sync: Any, before: Callable[[Any, list], None],
                 after: Callable[[Any, Any], None], on_error: Callable[[str, Exception], None]) -> None:
        self.sync = sync
        self.before = before
        self.after = after
        self.on_error = on_error
        self.steps = 0
        self.enabled = True
        self._kinds: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()
        #: @ms.jit functions -> the optimizers they step ([] = not a step).
        self._jit_kinds: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()
        #: The optimizers the script made (the sentinels' constructor patch sees them).
        self.known_optimizers: Callable[[], list] = lambda: []
        #: The loss scalers' state as numbers (LossScales.state): an update skipped for an
        #: overflow advances no optimizer, but the scaler's scale or counter moves.
        self.scale_state: Callable[[], tuple] = lambda: ()
        #: Called before a jit function's first call under a loss scale (its scale record).
        self.before_learning: Callable[[], None] = lambda: None
        self._undecided: dict[int, int] = {}
        #: (fn, counters, output) of a jit call that moved neither an optimizer nor a scaler
        #: while a loss scale is known: a step whose update was skipped, if adjust() says so.
        self._unclaimed: tuple[Any, dict, Any] | None = None  # id(fn) -> calls that stepped nothing under a loss scale
        #: PIJit calls under way (outermost first): (fn, optimizers or None, counters).
        self._pijit: list[tuple[Any, Any, Any]] = []
        self._around = (self.pijit_enter, self.pijit_leave)

    def attach(self) -> None:
        if self not in _active:
            _active.append(self)
        if not _patches:
            _install()
        if self._around not in compile_guard.around:
            compile_guard.around.append(self._around)

    def detach(self) -> None:
        self.enabled = False
        if self._around in compile_guard.around:
            compile_guard.around.remove(self._around)
        if self in _active:
            _active.remove(self)
        if not _active:
            _restore()

    def optimizers_of(self, cell: Any) -> list:
        """The optimizers a compiled Cell runs (empty: not a training step), cached."""
        try:
            found = self._kinds.get(cell)
        except TypeError:
            return []
        if found is None:
            from mindspore import nn
            found = [c for _, c in cell.cells_and_names() if isinstance(c, nn.Optimizer)]
            self._kinds[cell] = found
        return found

    def run(self, cell: Any, orig: Callable, args: tuple, kwargs: dict) -> Any:
        try:
            opts = self.optimizers_of(cell) if self.enabled else []
        except Exception as exc:  # noqa: BLE001
            self.on_error("recognising a compiled step", exc)
            opts = []
        if not opts:
            return orig(cell, *args, **kwargs)
        self._before(cell, opts, "compiled")  # may end the previous step: a pause waits here
        self.sync.enter(GRAPH)
        out = orig(cell, *args, **kwargs)
        self.sync.leave(GRAPH)
        return self._after(cell, out, "compiled")

    def _before(self, cell: Any, opts: list, what: str) -> None:
        try:
            self.before(cell, opts)
        except Exception as exc:  # noqa: BLE001
            _reraise_terminate(exc)
            self.on_error(f"before a {what} step", exc)

    def _after(self, cell: Any, out: Any, what: str) -> Any:  # cell: JIT_STEP/PIJIT_STEP for a function
        self.steps += 1
        try:
            self.after(cell, out)
        except Exception as exc:  # noqa: BLE001
            _reraise_terminate(exc)
            self.on_error(f"after a {what} step", exc)
        return out

    def run_jit(self, ex: Any, orig: Callable, args: tuple, kwargs: dict) -> Any:
        """An @ms.jit function called from Python: a training step when it steps an
        optimizer. In GRAPH mode too: a script may set GRAPH mode and still drive its
        steps with a jit function, not a Cell (the call is compiled the same way).

        Whether it does is learnt on its first call, from the optimizers' step counters
        (``global_step``, advanced by every optimizer call): one scalar read, once."""
        fn = getattr(ex.fn, "__func__", ex.fn)
        if str(getattr(fn, "__module__", "")).startswith("mindspore."):
            return orig(ex, *args, **kwargs)  # MindSpore's own (an optimizer's kernels): part of a call
        try:
            opts = self._jit_kinds.get(fn) if self.enabled else []
        except TypeError:
            opts = []
        counters = None
        if opts is None:
            counters = _step_counters(self.known_optimizers())
            if not counters:
                return orig(ex, *args, **kwargs)
            scales = self.scale_state()
            if scales:
                self.before_learning()  # the scale it may step with, read before it moves
        elif not opts:
            return orig(ex, *args, **kwargs)
        else:
            self._before(None, opts, "jit")
            self.sync.enter(GRAPH)
        out = orig(ex, *args, **kwargs)
        if counters is not None:
            opts = self._learn_kinds(fn, counters, scales)
            self._unclaimed = (fn, counters, out) if not opts and scales and fn not in self._jit_kinds else None
            if not opts:
                return out
        else:
            self.sync.leave(GRAPH)
        return self._after(JIT_STEP, out, "jit")

    def claim_overflow(self) -> bool:
        """An eager ``adjust()`` saw non-finite gradients right after a jit call that moved
        nothing: that call was a training step whose update was skipped (the scaler is
        adjusted outside the jit function). It is learnt as a step and ends here."""
        got, self._unclaimed = self._unclaimed, None
        if got is None:
            return False
        fn, counters, out = got
        try:
            self._jit_kinds[fn] = list(counters)
        except TypeError:
            return False
        self._after(JIT_STEP, out, "jit")
        return True

    def _learn_kinds(self, fn: Any, counters: dict, scales: tuple = ()) -> list:
        """After a jit/PIJit function's first call: the optimizers it stepped (none: not a
        training step), remembered for its later calls.

        Under a loss scale a step may skip its update (an overflow, as the first steps of
        a float16 job do): the scaler's state moving says it was a step all the same. A
        static scale moves nothing, so a call that stepped nothing is asked again, a few
        times, before it is taken for not a step."""
        now = _step_counters(list(counters))
        opts = [o for o, v in counters.items() if now.get(o) != v]
        if not opts and scales:
            if self.scale_state() != scales:
                opts = list(counters)
            else:
                tries = self._undecided.get(id(fn), 0) + 1
                self._undecided[id(fn)] = tries
                if tries < _ASK_AGAIN:
                    return opts
        try:
            self._jit_kinds[fn] = opts
        except TypeError:  # an unhashable callable: asked again next call
            pass
        return opts

    def pijit_enter(self, ctx: Any) -> None:
        """A PIJit call begins (outside its capture): like ``run_jit`` before the call."""
        if self._pijit or not self.enabled:
            self._pijit.append((None, [], None))  # nested or off: part of the outer call
            return
        fn = getattr(ctx, "fn", None)
        try:
            opts = self._jit_kinds.get(fn)
        except TypeError:
            opts = []
        counters = None
        if opts is None:
            try:
                counters = _step_counters(self.known_optimizers())
            except Exception as exc:  # noqa: BLE001
                self.on_error("recognising a PIJit step", exc)
            opts = None if counters else []
        if opts:
            self._before(None, opts, "jit")  # may end the previous step: a pause waits here
            self.sync.enter(GRAPH)
        self._pijit.append((fn, opts, counters))

    def pijit_leave(self, ctx: Any, ok: bool) -> None:
        if not self._pijit:
            return
        fn, opts, counters = self._pijit.pop()
        if counters:
            if not ok:
                return
            opts = self._learn_kinds(fn, counters)
        elif opts:
            self.sync.leave(GRAPH)
        if opts and ok:
            self._after(PIJIT_STEP, getattr(ctx, "ret", None), "jit")


def _step_counters(optimizers: list) -> dict:
    out = {}
    for opt in optimizers:
        gs = getattr(opt, "global_step", None)
        if gs is not None and hasattr(gs, "asnumpy"):
            try:
                out[opt] = int(gs.asnumpy().reshape(-1)[0])
            except Exception:  # noqa: BLE001
                continue
    return out


def _reraise_terminate(exc: Exception) -> None:
    from rankscope.probe.gate import RankscopeTerminated
    if isinstance(exc, RankscopeTerminated):
        raise exc


def _install() -> None:
    from mindspore import nn
    orig = nn.Cell.compile_and_run

    def compile_and_run(cell, *args, **kwargs):  # noqa: ANN001
        cur = _active[-1] if _active else None
        if cur is None:
            return orig(cell, *args, **kwargs)
        return cur.run(cell, orig, args, kwargs)

    compile_and_run.__wrapped__ = orig  # type: ignore[attr-defined]
    _patches.append((nn.Cell, "compile_and_run", orig))
    nn.Cell.compile_and_run = compile_and_run
    compile_guard.api_wrapped(nn.Cell, "compile_and_run", compile_and_run, orig)

    from mindspore.graph.api import _JitExecutor
    orig_call = _JitExecutor.__call__

    def __call__(ex, *args, **kwargs):  # noqa: ANN001, N807
        cur = _active[-1] if _active else None
        if cur is None:
            return orig_call(ex, *args, **kwargs)
        return cur.run_jit(ex, orig_call, args, kwargs)

    __call__.__wrapped__ = orig_call  # type: ignore[attr-defined]
    _patches.append((_JitExecutor, "__call__", orig_call))
    _JitExecutor.__call__ = __call__
    compile_guard.api_wrapped(_JitExecutor, "__call__", __call__, orig_call)


def _restore() -> None:
    compile_guard.restore_patches(_patches)


def loss_of(output: Any) -> Any:
    """The loss in a training step's output: the output, or its first element."""
    while isinstance(output, (tuple, list)) and output:
        output = output[0]
    return output if hasattr(output, "asnumpy") else None
