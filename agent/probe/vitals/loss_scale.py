"""The job's loss scale, found without config, as one record per step.

Float16 training multiplies the loss by a scale; gradients that overflow to Inf make
every rank skip that step's update and the scale is lowered. The coordinator can only
tell such an overflow from a fault if it knows the job runs under a scale, and what the
scale was: ``Sentinel.loss_scale`` (:data:`rankscope.wire.records.LOSS_SCALE_RECORD`,
an OPT_STATE row, identical on every replica) is the scale the step's loss was
multiplied by.

Where the scale lives:
- ``mindspore.amp.DynamicLossScaler`` / ``StaticLossScaler`` (and any ``amp.LossScaler``
  with a ``scale_value`` Parameter): instances are found by a constructor patch; in an
  eager step the value is read where ``scale()`` is called (a copy taken on the device,
  read with the step's other records, since ``adjust()`` rewrites it later in the step).
- ``nn.TrainOneStepWithLossScaleCell`` and what is built on it (``amp.build_train_network``
  and ``Model(..., loss_scale_manager=...)`` with a Dynamic/Fixed manager, mindformers'
  wrappers): its ``scale_sense`` Parameter.
- A compiled step (GRAPH mode, an ``@ms.jit`` step): every holder is read just before
  the call, between steps.

An eager loop whose update is skipped calls no optimizer, so the optimizer's call cannot
end that step: ``adjust()`` with non-finite gradients ends it instead (the scaler is told
once per step whatever happened to the update).

``scale``/``adjust`` are wrapped on the class; inside a compiled graph the wrappers wear
a pass-through body (compile_guard), so nothing of ours is compiled into the user's graph.
"""
from __future__ import annotations

import gc
import weakref
from typing import Any, Callable

from rankscope.probe.graph import compile_guard
from rankscope.wire.records import LOSS_SCALE_RECORD, Kind

#: Attributes that hold a loss scale Parameter: amp's scalers, TrainOneStepWithLossScaleCell.
SCALE_ATTRS = ("scale_value", "scale_sense")
_patches: list[tuple[Any, str, Any]] = []
_active: list["LossScales"] = []


class LossScales:
    def __init__(self, rec: Any, on_update_skipped: Callable[[], None] | None = None) -> None:
        self.rec = rec
        #: Ends the step when an eager update was skipped for non-finite gradients.
        self.on_update_skipped = on_update_skipped
        #: Claims the last jit call that moved nothing as a step (GraphSteps.claim_overflow).
        self.on_unclaimed_overflow: Callable[[], bool] | None = None
        self.holders: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.enabled = False
        self._recorded = False
        self._scaled = False  # scale() ran in this step

    @property
    def active(self) -> bool:
        """The job runs under a loss scale."""
        return any(True for _ in self.holders)

    def attach(self) -> None:
        self.enabled = True
        if self not in _active:
            _active.append(self)
        if not _patches:
            _install()
        for obj in gc.get_objects():  # scalers made before the attach
            try:
                if _holds_scale(obj):
                    self.holders.add(obj)
            except ReferenceError:
                continue
            except Exception:  # noqa: BLE001 - an object that cannot be asked: not a scaler
                continue

    def detach(self) -> None:
        self.enabled = False
        if self in _active:
            _active.remove(self)
        if not _active:
            _restore()

    def new_step(self) -> None:
        self._recorded = False
        self._scaled = False

    # ------------------------------------------------------------------ events
    def on_scale(self, scaler: Any) -> None:
        """Eager ``scale()``: the value this step's loss is multiplied by."""
        self.holders.add(scaler)
        self._scaled = True
        if self._recorded:
            return
        value = _scale_param(scaler)
        if value is not None:
            self.rec.row(LOSS_SCALE_RECORD, Kind.OPT_STATE, value.copy(), crc=False)
            self._recorded = True

    def on_adjust(self, scaler: Any, grads_finite: Any) -> None:
        """Eager ``adjust()``: a step whose gradients were not finite skipped its update
        and called no optimizer; it ends here. Where the loss was scaled inside a jit
        function, that call was the step (``on_unclaimed_overflow``)."""
        if not self._scaled and self.on_unclaimed_overflow is None:
            return
        try:
            finite = bool(grads_finite.asnumpy()) if hasattr(grads_finite, "asnumpy") else bool(grads_finite)
        except Exception:  # noqa: BLE001 - an unreadable flag: the optimizer's call decides
            return
        if finite:
            return  # the optimizer ends (or ended) this step
        if self._scaled:
            if self.on_update_skipped is not None:
                self.on_update_skipped()
        elif self.on_unclaimed_overflow is not None:
            self.on_unclaimed_overflow()

    def record_now(self) -> None:
        """Before a compiled step: every holder's scale, read between steps."""
        if self._recorded:
            return
        for holder in list(self.holders):
            value = _scale_param(holder)
            if value is not None:
                self.rec.row(LOSS_SCALE_RECORD, Kind.OPT_STATE, value.copy(), crc=False)
                self._recorded = True
                return

    def state(self) -> tuple:
        """Every holder's scale and counter as plain numbers: a compiled function that
        changes them is a training step even when its update was skipped."""
        out = []
        for holder in list(self.holders):
            for attr in (*SCALE_ATTRS, "counter"):
                p = getattr(holder, attr, None)
                if p is not None and hasattr(p, "asnumpy"):
                    try:
                        out.append(float(p.asnumpy().reshape(-1)[0]))
                    except Exception:  # noqa: BLE001
                        continue
        return tuple(out)


def _current() -> "LossScales | None":
    return _active[-1] if _active else None


def _scale_param(holder: Any) -> Any:
    for attr in SCALE_ATTRS:
        p = getattr(holder, attr, None)
        if p is not None and hasattr(p, "asnumpy") and hasattr(p, "copy"):
            return p
    return None


def _holds_scale(obj: Any) -> bool:
    from mindspore import amp, nn
    return isinstance(obj, (amp.LossScaler, nn.TrainOneStepWithLossScaleCell)) and _scale_param(obj) is not None


def _install() -> None:
    from mindspore import amp, nn
    scalers = [c for c in (amp.LossScaler, amp.DynamicLossScaler, amp.StaticLossScaler) if isinstance(c, type)]
    for cls in (*scalers, nn.TrainOneStepWithLossScaleCell):
        _patch_init(cls)
    for cls in scalers:
        for name in ("scale", "adjust"):
            if name in cls.__dict__:
                _patch_method(cls, name)


def _restore() -> None:
    compile_guard.restore_patches(_patches)


def _patch_init(cls: type) -> None:
    if "__init__" not in cls.__dict__:
        return
    orig = cls.__init__

    def __init__(obj, *args, **kwargs):  # noqa: N807, ANN001
        orig(obj, *args, **kwargs)
        cur = _current()
        if cur is not None and cur.enabled and _scale_param(obj) is not None:
            cur.holders.add(obj)

    __init__.__wrapped__ = orig  # type: ignore[attr-defined]
    _patches.append((cls, "__init__", orig))
    cls.__init__ = __init__


def _patch_method(cls: type, name: str) -> None:
    orig = cls.__dict__[name]
    seen = "on_scale" if name == "scale" else "on_adjust"

    def method(self, arg):  # noqa: ANN001
        out = orig(self, arg)
        cur = _current()
        if cur is not None and cur.enabled:
            try:
                if seen == "on_scale":
                    cur.on_scale(self)
                else:
                    cur.on_adjust(self, arg)
            except Exception as exc:  # noqa: BLE001
                from rankscope.probe.gate import RankscopeTerminated
                if isinstance(exc, RankscopeTerminated):
                    raise
                cur.rec.error(f"loss scale {name}", exc)
        return out

    def graph_form(self, arg):  # noqa: ANN001 - what a compile of method sees
        return orig(self, arg)
        print(name, seen)  # unreachable: keeps method's free variables

    method.__wrapped__ = orig  # type: ignore[attr-defined]
    compile_guard.passthrough(method, graph_form)
    _patches.append((cls, name, orig))
    setattr(cls, name, method)
    compile_guard.api_wrapped(cls, name, method, orig)
