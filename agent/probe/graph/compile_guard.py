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

PIJit (``jit(capture_mode="bytecode")``) has no compile call: it traces the Python
frames it runs, rankscope's hooks and API wrappers included, and compiles around them
differently (other float results). So for the whole of a PIJit call everything above
is hidden too, and the API wrappers put back to MindSpore's own functions: the frames
PIJit captures hold nothing of rankscope. Its step is watched from outside the call
(``around``), like an AST jit step.
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
#: (owner, attribute) -> (rankscope's wrapper, MindSpore's original), while wrapped.
_apis: dict[tuple[int, str], tuple[Any, str, Any, Any]] = {}
_unwrapped: list[tuple[Any, str, Any]] = []
#: (enter(ctx), leave(ctx, ok)) pairs called around each PIJit call, outside its capture.
around: list[tuple[Callable[[Any], None], Callable[[Any, bool], None]]] = []


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


def graph_safe_hook(impl: Callable[[Any], None]) -> Callable[[Any], None]:
    """A gradient hook that calls ``impl(grad)`` eagerly and never changes the gradient.

    A tensor hook goes wherever its tensor goes: a hooked activation handed to the user's
    own ``@ms.jit`` helper (a fused activation, a loss, amp's gradient scaling) gets the
    hook parsed into that graph, where the ``try`` that keeps ``impl``'s errors out of
    training cannot compile. While MindSpore compiles, the hook wears an identity body,
    so the graph holds ``return grad``; eager backward still runs the real one."""
    def hook(grad):  # noqa: ANN001
        try:
            impl(grad)
        except Exception:  # noqa: BLE001 - impl reports its own errors; none reaches training
            pass
        return None  # never replace the gradient

    def graph_form(grad):  # noqa: ANN001
        return grad
        impl(grad)  # unreachable: keeps hook's free variables
    passthrough(hook, graph_form)
    return hook


def api_wrapped(owner: Any, attr: str, wrapper: Any, orig: Any) -> None:
    """``owner.attr`` is rankscope's ``wrapper`` of ``orig``: put back inside PIJit calls."""
    with _lock:
        _apis[(id(owner), attr)] = (owner, attr, wrapper, orig)


def api_restored(owner: Any, attr: str) -> None:
    with _lock:
        _apis.pop((id(owner), attr), None)


def restore_patches(patches: list[tuple[Any, str, Any]]) -> None:
    """Put back every (owner, attribute, original) of a module's process-wide patches,
    newest first, and forget them here; ``patches`` is emptied."""
    for owner, attr, orig in reversed(patches):
        api_restored(owner, attr)
        setattr(owner, attr, orig)
    patches.clear()


class _TensorHook:
    """A parameter's gradient hook, taken off for the length of each PIJit call (a
    hook, even one that does nothing, is part of the graph PIJit builds)."""

    def __init__(self, tensor: Any, fn: Any) -> None:
        self.tensor, self.fn = tensor, fn
        self.handle = tensor.register_hook(fn)

    def remove(self) -> None:
        with _lock:
            _tensor_hooks.pop(id(self), None)
            if self.handle is not None:
                self.handle.remove()
                self.handle = None


_tensor_hooks: dict[int, _TensorHook] = {}
#: (namespace dict or closure cell, name or None, rankscope's wrapper) rebound for a PIJit call.
_rebound: list[tuple[Any, Any, Any]] = []
_lifted: list[_TensorHook] = []


def register_tensor_hook(tensor: Any, fn: Any) -> _TensorHook:
    """``tensor.register_hook(fn)``, taken off inside PIJit calls; ``.remove()`` as usual."""
    hook = _TensorHook(tensor, fn)
    with _lock:
        _tensor_hooks[id(hook)] = hook
    return hook


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
        api_wrapped(cls, "compile", cls.compile, orig)  # PIJit compiles without us
    try:  # PIJit (jit(capture_mode="bytecode")) has no compile call: it is seen on entry
        from mindspore.graph._utils.pijit_context import PIJitCaptureContext
    except Exception:  # noqa: BLE001 - another MindSpore layout: PIJit simply is not noticed
        return
    enter, leave = PIJitCaptureContext.__enter__, PIJitCaptureContext.__exit__

    def __enter__(self):  # noqa: ANN001, N807
        for fn in list(listeners):
            try:
                fn("pijit", self)
            except Exception:  # noqa: BLE001
                pass
        for before, _ in list(around):
            before(self)  # may raise a terminate: the call then never starts
        _hide(apis=True)
        if _depth == 1:  # a nested call's names were unbound by the outer one
            _unbind(getattr(self, "fn", None))
        try:
            return enter(self)
        except BaseException:
            if _depth == 1:
                _rebind()
            _restore()
            raise

    def __exit__(self, exc_type, exc, tb):  # noqa: ANN001, N807
        try:
            return leave(self, exc_type, exc, tb)
        finally:
            if _depth == 1:
                _rebind()
            _restore()
            for _, after in list(around):
                after(self, exc_type is None)
    __enter__.__wrapped__ = enter  # type: ignore[attr-defined]
    __exit__.__wrapped__ = leave  # type: ignore[attr-defined]
    _patches.append((PIJitCaptureContext, "__enter__", enter))
    _patches.append((PIJitCaptureContext, "__exit__", leave))
    PIJitCaptureContext.__enter__ = __enter__
    PIJitCaptureContext.__exit__ = __exit__


def _unbind(fn: Any) -> None:
    """The user's names (globals, closure variables) that the PIJit function reads and
    that hold a rankscope wrapper are bound to the wrapped function for the call: a
    pass-through frame, however plain, makes PIJit build a different graph."""
    code = getattr(fn, "__code__", None)
    if code is None or not _wrappers:
        return
    try:
        g = fn.__globals__
        for name in code.co_names:
            val = g.get(name)
            if _is_wrapper(val):
                g[name] = val.__wrapped__
                _rebound.append((g, name, val))
        for cell in fn.__closure__ or ():
            val = cell.cell_contents
            if _is_wrapper(val):
                cell.cell_contents = val.__wrapped__
                _rebound.append((cell, None, val))
    except Exception:  # noqa: BLE001 - an empty cell, an odd namespace: left as it is
        pass


def _is_wrapper(val: Any) -> bool:
    try:
        return val in _wrappers and getattr(val, "__wrapped__", None) is not None
    except TypeError:
        return False


def _rebind() -> None:
    for where, name, val in reversed(_rebound):
        if name is None:
            where.cell_contents = val
        else:
            where[name] = val
    _rebound.clear()


def uninstall() -> None:
    restore_patches(_patches)


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


def _hide(apis: bool = False) -> bool:
    """Take our hooks off every tracked Cell (``apis``: and our API wrappers off their
    modules); nested compiles share the outer hiding."""
    global _depth
    with _lock:
        _depth += 1
        if _depth > 1:
            return True
        for owner, attr, wrapper, orig in list(_apis.values()) if apis else ():
            if owner.__dict__.get(attr) is wrapper:
                setattr(owner, attr, orig)
                _unwrapped.append((owner, attr, wrapper))
        for hook in list(_tensor_hooks.values()) if apis else ():
            if hook.handle is not None:
                hook.handle.remove()
                hook.handle = None
                _lifted.append(hook)
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
        for owner, attr, wrapper in _unwrapped:
            if (id(owner), attr) in _apis:
                setattr(owner, attr, wrapper)
        _unwrapped.clear()
        for hook in _lifted:
            if id(hook) in _tensor_hooks:
                hook.handle = hook.tensor.register_hook(hook.fn)
        _lifted.clear()
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
