"""Collectives the script calls from Python, recorded around the call.

A tensor-parallel layer's AllReduce, a pipeline stage's hand-over, a loss averaged for a
log line: each call's inputs and outputs become records named
``Sentinel.collective.<group>.<Op>.<n>.<input|output>.<slot>``
(:mod:`rankscope.wire.collective_names`), in the step's record order, so the coordinator
sees what a rank made apart from what its group handed it (a NaN one shard made reaches
its peers only through such a call), and the outputs every rank of a group must share.
The call is also a sync point (the rank entered / left it) and its group a layout fact.

Wrapped: the collective primitives' ``__call__`` (``ops.AllReduce(group=...)``, what a
hand-written tensor-parallel Cell calls; their ``__init__`` only notes the group) and the
functional collectives of
``mindspore.ops.communication``, ``mindspore.communication.comm_func`` and
``mindspore.mint.distributed``. A compiled graph never runs a wrapper (compile_guard puts
MindSpore's own back for PIJit; AST compiles read primitives, not their ``__call__``),
and a gradient reducer's AllReduce runs inside its own jit graph: it is the sentinels'.
Functional collectives work in place: their tensor arguments are read before the call.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys
from typing import Any, Callable

from rankscope.probe.comm import layout_probe
from rankscope.probe.graph import compile_guard
from rankscope.probe.tensors.stats import is_tensor
from rankscope.wire.collective_names import collective_record
from rankscope.wire.records import Kind

PRIMITIVES = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AlltoAll", "AlltoAllV", "NeighborExchange",
              "NeighborExchangeV2", "Send", "Receive", "Reduce", "CollectiveScatter", "CollectiveGather",
              "AllGatherV", "ReduceScatterV")
FUNCTIONS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
             "reduce", "send", "recv")
MODULES = ("mindspore.ops.communication", "mindspore.communication.comm_func", "mindspore.mint.distributed")
#: Function name -> the op name its records carry.
_OP_OF = {"all_reduce": "AllReduce", "broadcast": "Broadcast", "all_gather_into_tensor": "AllGather",
          "reduce_scatter_tensor": "ReduceScatter", "all_to_all_single": "AlltoAll", "reduce": "Reduce",
          "send": "Send", "recv": "Receive"}

_active: list["CollectiveHooks"] = []
_patches: list[tuple[Any, str, Any, bool]] = []


def _world() -> str:
    try:
        from mindspore.communication import GlobalComm
        return str(GlobalComm.WORLD_COMM_GROUP)
    except Exception:  # noqa: BLE001
        return "world"


class CollectiveHooks:
    """Feeds one debugger's recorder and sync tracker; ``enabled`` follows the sentinels."""

    def __init__(self, rec: Any, sync: Any = None) -> None:
        self.rec, self.sync = rec, sync
        self.enabled = False
        self.depth = 0
        self._count: dict[tuple[str, str], int] = {}

    def attach(self) -> None:
        self.enabled = True
        if self not in _active:
            _active.append(self)
        if not _patches:
            _install()

    def detach(self) -> None:
        self.enabled = False
        if self in _active:
            _active.remove(self)
        if not _active:
            _uninstall()

    def new_step(self) -> None:
        self._count.clear()

    def call(self, orig: Callable, op: str, group: str, inputs: tuple, args: tuple, kwargs: dict,
             in_place: bool) -> Any:
        layout_probe.note_collective(op, group)
        if self.depth or not self.enabled:
            return orig(*args, **kwargs)
        n = self._count.get((group, op), 0)
        self._count[(group, op)] = n + 1
        r = self.rec
        ins = [t for t in inputs if is_tensor(t)]
        try:
            for i, t in enumerate(ins):
                name = collective_record(group, op, n, "input", i)
                if in_place:
                    r.row_known(name, Kind.FORWARD, r.stats(t))  # the call overwrites it
                else:
                    r.row(name, Kind.FORWARD, t)
        except Exception as exc:  # noqa: BLE001
            r.error(f"{op} input record", exc)
        if self.sync is not None:
            self.sync.enter(op)
        self.depth += 1
        try:
            out = orig(*args, **kwargs)
        finally:
            self.depth -= 1
        if self.sync is not None:
            self.sync.leave(op)
        try:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            got = [t for t in outs if is_tensor(t)] or (ins[:1] if in_place else [])
            for i, t in enumerate(got):
                r.row(collective_record(group, op, n, "output", i), Kind.FORWARD, t)
        except Exception as exc:  # noqa: BLE001
            r.error(f"{op} output record", exc)
        return out


def note_cell_collectives(root: Any) -> None:
    """The collectives a compiled network holds outside its gradient reducers and
    optimizers (a tensor-parallel layer's AllReduce), as layout facts: compiled code never
    calls them from Python."""
    from mindspore import nn
    for _, cell in root.cells_and_names():
        if isinstance(cell, (nn.DistributedGradReducer, nn.Optimizer)):
            continue
        for prim in (getattr(cell, "_primitives", None) or {}).values():
            op = type(prim).__name__
            if op in PRIMITIVES:
                layout_probe.note_collective(op, str(getattr(prim, "group", None) or _world()))


def _current() -> CollectiveHooks | None:
    return _active[-1] if _active else None


def _install() -> None:
    try:
        from mindspore.ops import operations as P
    except Exception:  # noqa: BLE001
        return
    for name in PRIMITIVES:
        cls = getattr(P, name, None)
        if cls is not None:
            _wrap(cls, "__call__", _primitive_wrapper(cls.__call__, name), own=True)
            _wrap(cls, "__init__", _constructor_wrapper(cls.__init__, name), own=True)
    for module_path in MODULES:
        try:
            module = importlib.import_module(module_path)
        except Exception:  # noqa: BLE001 - absent in this MindSpore build
            continue
        for fn in FUNCTIONS:
            orig = getattr(module, fn, None)
            if callable(orig) and not getattr(orig, "_rankscope_collective", False):
                _wrap(module, fn, _function_wrapper(orig, _OP_OF[fn]), own=False)


def _wrap(owner: Any, attr: str, wrapper: Any, own: bool) -> None:
    orig = getattr(owner, attr)
    _patches.append((owner, attr, orig, attr in vars(owner) if own else True))
    setattr(owner, attr, wrapper)
    compile_guard.api_wrapped(owner, attr, wrapper, orig)


def _uninstall() -> None:
    for owner, attr, orig, had_own in reversed(_patches):
        compile_guard.api_restored(owner, attr)
        if had_own:
            setattr(owner, attr, orig)
        else:
            try:
                delattr(owner, attr)  # it was inherited: expose the base class's again
            except AttributeError:
                setattr(owner, attr, orig)
    _patches.clear()


def _primitive_wrapper(orig: Callable, op: str) -> Callable:
    @functools.wraps(orig)
    def __call__(prim, *args, **kwargs):  # noqa: ANN001, N807
        cur = _current()
        if cur is None:
            return orig(prim, *args, **kwargs)
        group = str(getattr(prim, "group", None) or _world())
        return cur.call(orig, op, group, args, (prim, *args), kwargs, in_place=False)

    __call__._rankscope_collective = True  # type: ignore[attr-defined]
    return __call__


def _constructor_wrapper(orig: Callable, op: str) -> Callable:
    """A collective made by the script's own code (not by MindSpore's gradient reducer or
    optimizer) is a layout fact when it is made: inside a compiled step nothing calls it
    from Python."""
    @functools.wraps(orig)
    def __init__(prim, *args, **kwargs):  # noqa: ANN001, N807
        orig(prim, *args, **kwargs)
        try:
            caller = sys._getframe(1).f_globals.get("__name__", "")  # noqa: SLF001 - cheap, once per op made
            if not str(caller).startswith("mindspore."):
                layout_probe.note_collective(op, str(getattr(prim, "group", None) or _world()))
        except Exception:  # noqa: BLE001 - a fact not noted is never an error in training
            pass

    return __init__


def _function_wrapper(orig: Callable, op: str) -> Callable:
    try:
        params = list(inspect.signature(orig).parameters)
    except (TypeError, ValueError):
        params = []
    group_at = params.index("group") if "group" in params else None
    # all_gather_into_tensor(output_tensor, input_tensor, ...): the input is the second.
    input_at = 1 if params[:2] == ["output_tensor", "input_tensor"] else 0

    @functools.wraps(orig)
    def collective(*args, **kwargs):  # noqa: ANN002
        cur = _current()
        if cur is None:
            return orig(*args, **kwargs)
        group = kwargs.get("group", args[group_at] if group_at is not None and len(args) > group_at else None)
        inputs = args[input_at:input_at + 1] if len(args) > input_at else ()
        return cur.call(orig, op, str(group or _world()), inputs, args, kwargs, in_place=True)

    collective._rankscope_collective = True  # type: ignore[attr-defined]
    return collective
