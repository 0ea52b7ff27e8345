"""The process-wide patches the step sentinels need: optimizer and gradient-reducer
constructors (so instances made after attach are hooked) and ``value_and_grad`` /
``grad`` (the loss sentinel, the model autoattach looks for, and the re-run of an
anomalous step, :mod:`rankscope.probe.rerun.rerun`).
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

from rankscope.probe.graph import compile_guard
from rankscope.probe.vitals.probe_clock import CLOCK

if TYPE_CHECKING:
    from rankscope.probe.vitals.sentinels import Sentinels

# ---------------------------------------------------------------------- patches
# Process-wide, because the patched callables are: one set of patches however many
# debuggers exist (a script's own after autoattach's, tests), always feeding the newest
# attached Sentinels, and removed when the last one detaches.
_active: list["Sentinels"] = []
_patches: list[tuple[Any, str, Any]] = []
_reducer_names: "weakref.WeakKeyDictionary[Any, list[str]]" = weakref.WeakKeyDictionary()


def _current() -> "Sentinels | None":
    return _active[-1] if _active else None


def _install_patches() -> None:
    import mindspore as ms
    from mindspore import nn, ops
    from mindspore.ops.function.grad import grad_func
    _patch_init(nn.Optimizer, "_hook_optimizer")
    _patch_init(nn.DistributedGradReducer, "_hook_reducer", remember_params=True)
    for owner in {id(m): m for m in (ms, ops, grad_func)}.values():
        for name, with_loss in (("value_and_grad", True), ("grad", False)):
            orig = getattr(owner, name, None)
            if orig is not None and not getattr(orig, "_rankscope", False):
                _patches.append((owner, name, orig))
                setattr(owner, name, _wrap_value_and_grad(orig, with_loss))


def _restore_patches() -> None:
    compile_guard.restore_patches(_patches)


def _patch_init(cls: type, hook_method: str, remember_params: bool = False) -> None:
    orig = cls.__init__

    def __init__(obj, *args, **kwargs):  # noqa: N807, ANN001
        orig(obj, *args, **kwargs)
        s = _current()
        try:
            if remember_params:
                params = args[0] if args else kwargs.get("parameters")
                _reducer_names[obj] = [getattr(p, "name", str(i)) for i, p in enumerate(params)]
            if s is not None and s.enabled:
                getattr(s, hook_method)(obj)
        except Exception as exc:  # noqa: BLE001
            if s is not None:
                s.rec.error(f"sentinel {cls.__name__} init", exc)

    __init__.__wrapped__ = orig  # type: ignore[attr-defined]
    _patches.append((cls, "__init__", orig))
    cls.__init__ = __init__


def _wrap_value_and_grad(orig: Callable, with_loss: bool = True) -> Callable:
    """Wrap ``value_and_grad`` (loss sentinel + model discovery) or ``grad`` (discovery)."""
    def value_and_grad(fn, grad_position=0, weights=None, has_aux=False, return_ids=False,
                       sens_param=False):  # noqa: ANN001
        inner = orig(fn, grad_position, weights, has_aux, return_ids, sens_param)
        s = _current()
        if s is not None:
            s.grad_fns_seen += 1
            if s.on_grad_fn is not None:
                try:
                    s.on_grad_fn(fn, weights)
                except Exception as exc:  # noqa: BLE001
                    s.rec.error("finding the model", exc)

        if not with_loss:
            return inner

        names = _names_of(weights)

        def grad_fn(*args, **kwargs):  # noqa: ANN002
            cur = _current()
            rerun = cur.rerun if cur is not None and cur.enabled and cur.record else None
            with CLOCK:
                token = rerun.before((fn, weights, names)) if rerun is not None else None
            out = inner(*args, **kwargs)
            with CLOCK:
                if cur is not None and cur.enabled:
                    try:
                        value = out[0]
                        if isinstance(value, (tuple, list)):  # has_aux / multiple outputs
                            value = value[0]
                        cur.record_loss(value)
                    except Exception as exc:  # noqa: BLE001
                        cur.rec.error("loss sentinel", exc)
                if rerun is not None:
                    out = rerun.after(inner, args, kwargs, (fn, weights, names), out, token)
            return out

        def graph_form(*args, **kwargs):  # noqa: ANN002 - what a compile of grad_fn sees
            return inner(*args, **kwargs)
            print(fn, weights, names)  # unreachable: keeps grad_fn's free variables

        grad_fn.__wrapped__ = inner  # type: ignore[attr-defined]
        compile_guard.passthrough(grad_fn, graph_form)
        return grad_fn

    def graph_form(fn, grad_position=0, weights=None, has_aux=False, return_ids=False,
                   sens_param=False):  # noqa: ANN001 - what a compile of value_and_grad sees
        if with_loss:
            return orig(fn, grad_position, weights, has_aux, return_ids, sens_param)
        return orig(fn, grad_position, weights, has_aux, return_ids, sens_param)

    compile_guard.passthrough(value_and_grad, graph_form)
    value_and_grad._rankscope = True  # type: ignore[attr-defined]
    value_and_grad.__wrapped__ = orig  # type: ignore[attr-defined]
    value_and_grad.__doc__ = orig.__doc__
    return value_and_grad


def _names_of(weights: Any) -> list[str]:
    """The names of the parameters a gradient function differentiates for, read once."""
    try:
        return [str(getattr(p, "name", i)) for i, p in enumerate(weights or ())]
    except Exception:  # noqa: BLE001 - a single Parameter, or an odd container
        return [str(getattr(weights, "name", "0"))]
