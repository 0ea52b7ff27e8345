"""What a ``value_and_grad`` call returned, read the same way by the re-run and by the
replay: (label, tensor) of its loss, other outputs and gradients, and (loss, gradient
norm)."""
from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.probe.tensors.stats import is_tensor, to_numpy


def leaves(out: Any, names: list[str]) -> list[tuple[str, Any]]:
    """(label, tensor) of a value_and_grad result: the loss (and any other outputs), then
    each gradient under its parameter's name."""
    value, grads = (out[0], out[1]) if isinstance(out, tuple) and len(out) == 2 else (out, ())
    values = list(value) if isinstance(value, (tuple, list)) else [value]
    grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
    got = [("loss" if i == 0 else f"output {i}", v) for i, v in enumerate(values) if is_tensor(v)]
    got += [(f"grad {names[i] if i < len(names) else i}", g) for i, g in enumerate(grads) if is_tensor(g)]
    return got


def measure(out: Any, squared_norm: Any = None) -> tuple[float | None, float | None]:
    """(loss, norm of the gradients) of one call's result. ``squared_norm(g)``: a gradient's
    squared norm read elsewhere this step, or None to read it here."""
    got = leaves(out, [])
    loss = None
    if got and got[0][0] == "loss":
        arr, _ = to_numpy(got[0][1])
        loss = float(arr.reshape(-1)[0]) if arr.size == 1 else None
    sq, any_grad = 0.0, False
    for label, g in got:
        if label.startswith("grad "):
            known = squared_norm(g) if squared_norm is not None else None
            if known is not None:
                sq += known
                any_grad = True
                continue
            arr, _ = to_numpy(g)
            if arr.dtype.kind == "f" and arr.size:
                flat = arr.reshape(-1) if arr.dtype.itemsize >= 4 else arr.reshape(-1).astype(np.float32)
                sq += float(np.dot(flat, flat))
                any_grad = True
    return loss, (float(np.sqrt(sq)) if any_grad else None)
