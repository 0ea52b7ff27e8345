"""Keep rankscope's Python out of every graph MindSpore compiles.

MindSpore compiles a Cell's forward(-pre) hooks into the graph when the Cell is part of
something it compiles (GRAPH mode, an ``@ms.jit`` function or Cell inside PyNative): a
hook body that graph syntax cannot express (``try``, I/O, NumPy) then fails the user's
compile ("Unsupported statement 'Try'"). Hooks are a per-call question, not a per-Cell
one: the same Cell can run eagerly in one call and inside a jit graph in the next.

So every Cell rankscope hooks is remembered here, and while MindSpore compiles (its two
Python entry points, ``_CellGraphExecutor.compile`` and ``_JitExecutor.compile``)
rankscope's hooks are taken off those Cells and put back right after. The compiled
graph never contains them, eager calls still run them, and the user's own hooks are
left exactly where they were. A compiled graph never calls back into Python, so
removing them for the compile is the whole of it.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable

#: Cell -> ids of the hook functions rankscope registered on it.
_ours: "weakref.WeakKeyDictionary[Any, set[int]]" = weakref.WeakKeyDictionary()
_fns: dict[int, Any] = {}  # keeps the functions alive so their ids stay unique
_patches: list[tuple[Any, str, Any]] = []
_lock = threading.RLock()
_depth = 0
_hidden: list[tuple[Any, str, OrderedDict]] = []
#: Called with (kind, obj) once per compile: "cell" (GRAPH-mode Cell) or "jit".
listeners: list[Callable[[str, Any], None]] = []
compiles = 0

_HOOK_DICTS = ("_lazy_forward_pre_hook", "_lazy_forward_hook")
#: Wrapper functions rankscope hands to user code (value_and_grad's) -> the code of a
#: plain pass-through with the same free variables. A compile parses the source of
#: every function it meets, so while MindSpore compiles, a wrapper wears the
#: pass-through's code: the graph calls the user's function, nothing of ours.
_wrappers: "weakref.WeakKeyDictionary[Any, tuple[Any, Any]]" = weakref.WeakKeyDictionary()
_swapped: list[Any] = []


def track(cell: Any, fn: Any) -> None:
    """Remember that ``fn`` is a hook rankscope registered on ``cell``."""
    with _lock:
        _fns[id(fn)] = fn
        _ours.setdefault(cell, set()).add(id(fn))


def passthrough(wrapper: Any, plain: Any) -> None:
    """While compiling, ``wrapper`` runs ``plain``'s code (same free variables)."""
    if wrapper.__code__.co_freevars != plain.__code__.co_freevars:
        raise ValueError("a pass-through must close over the same variables as its wrapper")
    _wrappers[wrapper] = (wrapper.__code__, plain.__code__)


def forget(cell: Any) -> None:
    with _lock:
        ids = _ours.pop(cell, set())
        for i in ids:
            _fns.pop(i, None)


def hooked_cells() -> int:
    return len(_ours)


def install() -> None:
    """Wrap MindSpore's compile entry points (once per process)."""
    if _patches:
        return
    from mindspore.graph import api
    for cls, kind in ((api._CellGraphExecutor, "cell"), (api._JitExecutor, "jit")):  # noqa: SLF001
        orig = cls.compile
        cls.compile = _wrap(orig, kind)
        _patches.append((cls, "compile", orig))
    try:  # PIJit (jit(capture_mode="bytecode")) has no compile call: it is seen on entry
        from mindspore.graph._utils.pijit_context import PIJitCaptureContext
    except Exception:  # noqa: BLE001 - another MindSpore layout: PIJit simply is not noticed
        return
    enter = PIJitCaptureContext.__enter__

    def __enter__(self):  # noqa: ANN001, N807
        for fn in list(listeners):
            try:
                fn("pijit", self)
            except Exception:  # noqa: BLE001
                pass
        return enter(self)
    __enter__.__wrapped__ = enter  # type: ignore[attr-defined]
    _patches.append((PIJitCaptureContext, "__enter__", enter))
    PIJitCaptureContext.__enter__ = __enter__


def uninstall() -> None:
    for owner, attr, orig in reversed(_patches):
        setattr(owner, attr, orig)
    _patches.clear()


def _wrap(orig: Callable, kind: str) -> Callable:
    def compile(self, *args, **kwargs):  # noqa: ANN001, A001
        hidden = _hide()
        try:
            _tell(kind, args[0] if kind == "cell" and args else self)
            return orig(self, *args, **kwargs)
        finally:
            if hidden:
                _restore()
    compile.__wrapped__ = orig  # type: ignore[attr-defined]
    compile._rankscope = True  # type: ignore[attr-defined]
    return compile


def _tell(kind: str, obj: Any) -> None:
    global compiles
    compiles += 1
    for fn in list(listeners):
        try:
            fn(kind, obj)
        except Exception:  # noqa: BLE001 - a listener never breaks the user's compile
            pass


def _hide() -> bool:
    """Take our hooks off every tracked Cell; nested compiles share the outer hiding."""
    global _depth
    with _lock:
        _depth += 1
        if _depth > 1:
            return True
        for fn, (_, plain) in list(_wrappers.items()):
            fn.__code__ = plain
            _swapped.append(fn)
        for cell, ids in list(_ours.items()):
            for attr in _HOOK_DICTS:
                d = cell.__dict__.get(attr)
                if not d:
                    continue
                mine = [k for k, fn in d.items() if id(fn) in ids]
                if mine:
                    _hidden.append((cell, attr, OrderedDict(d)))
                    for k in mine:
                        del d[k]
        return True


def _restore() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth > 0:
            return
        for cell, attr, saved in _hidden:
            d = cell.__dict__.get(attr)
            if d is None:
                continue
            added = [(k, v) for k, v in d.items() if k not in saved]  # registered meanwhile
            d.clear()
            d.update(saved)
            d.update(added)
        _hidden.clear()
        for fn in _swapped:
            codes = _wrappers.get(fn)
            if codes is not None:
                fn.__code__ = codes[0]
        _swapped.clear()


def register(cell: Any, fn: Any, *, pre: bool = False, **kwargs: Any) -> Any:
    """``cell.register_forward(_pre)_hook(fn, **kwargs)``, remembered for hiding."""
    handle = cell.register_forward_pre_hook(fn, **kwargs) if pre else cell.register_forward_hook(fn, **kwargs)
    track(cell, fn)
    return handle
