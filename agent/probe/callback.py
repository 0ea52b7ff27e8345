"""MsprobeStep: the ``mindspore.train.Callback`` that drives the debugger under Model.train.

start() at each step begin, stop() + step() at each step end (msProbe's MsprobeStep),
and the step's loss handed to the loss sentinel. The Callback base class is resolved
when the class is first used, so importing ``agent`` stays MindSpore-free.
"""
from __future__ import annotations

from typing import Any

_cls: type | None = None


def _build() -> type:
    from mindspore.train import Callback

    class MsprobeStep(Callback):
        """``MsprobeStep(debugger)`` as in msProbe."""

        def __init__(self, debugger: Any) -> None:
            super().__init__()
            self.debugger = debugger

        def on_train_step_begin(self, run_context: Any) -> None:
            self.debugger.start()

        def on_train_step_end(self, run_context: Any) -> None:
            dbg = self.debugger
            try:
                loss = getattr(run_context.original_args(), "net_outputs", None)
                if isinstance(loss, (tuple, list)) and loss:
                    loss = loss[0]
                if loss is not None and hasattr(loss, "asnumpy"):
                    dbg.sentinels.record_loss(loss)
            except Exception as exc:  # noqa: BLE001 - the probe never breaks training
                dbg.recorder.error("MsprobeStep loss", exc)
            dbg.stop()
            dbg.step()

        # msProbe's older callback names, for Model versions that call them
        step_begin = on_train_step_begin
        step_end = on_train_step_end

    return MsprobeStep


def __getattr__(name: str) -> Any:
    global _cls
    if name in ("MsprobeStep", "StepCallback"):
        if _cls is None:
            _cls = _build()
        return _cls
    raise AttributeError(name)
