"""When a rank's step is anomalous enough to re-run: its own loss and gradients against
its own recent history, before the gradients are reduced.

Pure logic over two numbers a step (the loss, the squared norm of the local gradients),
so it is testable without MindSpore. The gate triggers a re-run, it names nobody: a
needless trigger costs one more forward and backward, a missed one loses the
transient-or-deterministic line. So the rule is plain and wide:

- a value that is not finite (NaN or Inf) is anomalous at once;
- once ``warmup`` healthy steps are known, a loss further from the median of the last
  ``window`` losses than ``spike`` times that median's size (or its spread, whichever is
  larger), or a gradient norm more than ``spike`` times its median, is anomalous.

Anomalous steps are not learned, so one spike does not widen the bound for the next.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass


@dataclass
class GateSettings:
    window: int = 32
    warmup: int = 8
    spike: float = 10.0


#: The trigger of a finite loss with gradients that are not: under a loss scale, an overflow.
OVERFLOW = "gradients that are not finite before the reduction"


class AnomalyGate:
    def __init__(self, settings: GateSettings | None = None) -> None:
        self.settings = settings or GateSettings()
        self._loss: deque[float] = deque(maxlen=self.settings.window)
        self._gnorm: deque[float] = deque(maxlen=self.settings.window)

    def judge(self, loss: float | None, grad_norm: float | None) -> str:
        """Why this step is anomalous, in words, or "" when it is not."""
        if loss is not None and not math.isfinite(loss):
            return "a loss that is not finite"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return OVERFLOW
        s = self.settings
        if loss is not None and len(self._loss) >= s.warmup:
            # statistics.median: a window of a few dozen floats costs NumPy more in
            # array set-up than in the median, on every step.
            med = statistics.median(self._loss)
            spread = 1.4826 * statistics.median([abs(v - med) for v in self._loss])
            if abs(loss - med) > s.spike * max(abs(med), spread, 1e-12):
                return f"a loss of {loss:.6g} against a recent median of {med:.6g}"
        if grad_norm is not None and len(self._gnorm) >= s.warmup:
            med = statistics.median(self._gnorm)
            if med > 0 and grad_norm > s.spike * med:
                return f"a gradient norm of {grad_norm:.6g} against a recent median of {med:.6g}"
        return ""

    def learn(self, loss: float | None, grad_norm: float | None) -> None:
        """A healthy step's values join the history."""
        if loss is not None and math.isfinite(loss):
            self._loss.append(float(loss))
        if grad_norm is not None and math.isfinite(grad_norm):
            self._gnorm.append(float(grad_norm))
