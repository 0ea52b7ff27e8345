"""Replaying an anomalous step somewhere else than the rank that saw it.

Two halves of one record (:mod:`rankscope.files.replay_files`):

- :func:`keep`, in the rank, right after :class:`~rankscope.probe.rerun.rerun.Rerunner` re-ran
  an anomalous ``value_and_grad`` call: the call's tensors, the parameters it
  differentiates (as the step started), the RNG state, what the first execution returned
  and the rank's recent loss and gradient-norm history.
- :class:`Replayer`, in a process ``rankscope rerun`` starts with the job's own script
  and ``RANKSCOPE_REPLAY`` set: at the script's first call of a gradient function over
  the same parameters, it loads the record's parameters and tensors, makes the call
  (float32 as recorded, then a float64 reference where MindSpore runs it), writes what
  came out to ``RANKSCOPE_REPLAY_OUT`` and ends the process: the script trains no further.

The job's own code runs the replay, so no model has to be serialised; another process
(on this machine, or on any node ``rankscope rerun`` runs on) is the other device.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from rankscope.probe.rerun.call_outputs import leaves, measure
from rankscope.probe.rerun.rerun_gate import AnomalyGate
from rankscope.probe.tensors.stats import is_tensor, to_numpy
from rankscope.files import replay_files

ENV, OUT_ENV = replay_files.ENV, replay_files.OUT_ENV
_PLAIN = (int, float, bool, str, type(None))


def keep(dump_path: str, detail: dict, args: tuple, kwargs: dict, weights: Any, names: list[str],
         first: tuple[float | None, list[int]], rng: Any, gate: AnomalyGate) -> str:
    """Write the record of this call; its folder, or "" when the call cannot be kept."""
    inputs: dict[str, np.ndarray] = {}
    shape: dict[str, Any] = {"args": [], "kwargs": {}}
    for key, value, slot in [(f"arg{i}", v, None) for i, v in enumerate(args)] + \
            [(f"kw_{k}", v, k) for k, v in kwargs.items()]:
        if is_tensor(value):
            arr, dtype = to_numpy(value)
            if dtype == "BFloat16":
                return ""  # NumPy has no bfloat16: the bits alone would replay as another type
            inputs[key] = np.array(arr)
            entry: Any = {"tensor": key, "dtype": dtype}
        elif isinstance(value, _PLAIN):
            entry = {"value": value}
        else:
            return ""  # an argument that is neither a tensor nor a plain value
        if slot is None:
            shape["args"].append(entry)
        else:
            shape["kwargs"][slot] = entry
    params, dtypes = {}, []
    for name, p in zip(names, weights if not is_tensor(weights) else (weights,)):
        arr, dtype = to_numpy(p)
        if dtype == "BFloat16":
            return ""
        params[name] = np.array(arr)
        dtypes.append(dtype)
    loss, grad_crcs = first
    meta = {"rank": detail["rank"], "step": detail["step"], "trigger": detail["trigger"],
            "outcome": detail["outcome"], "call": shape, "params": list(params), "param_dtypes": dtypes,
            "rng": [int(b) for b in to_numpy(rng)[0].reshape(-1)] if rng is not None else None,
            "first": {"loss": _num(loss), "grad_crc32": grad_crcs},
            "history": {"loss": list(gate._loss), "grad_norm": list(gate._gnorm)},  # noqa: SLF001
            "argv": list(sys.argv), "cwd": os.getcwd()}
    where = replay_files.replay_dir(dump_path, detail["rank"], detail["step"])
    return str(replay_files.save(where, meta, inputs, params))


def first_outputs(out: Any) -> tuple[float | None, list[int]]:
    """(loss, CRC-32 of each gradient) of a call's result: what a replay is compared with."""
    loss, _ = measure(out)
    return loss, [replay_files.crc(to_numpy(g)[0]) for label, g in leaves(out, []) if label.startswith("grad ")]


def _num(x: float | None) -> Any:
    """A float as JSON holds it (NaN and Inf spelled as strings)."""
    return None if x is None else x if math.isfinite(x) else repr(x)


class Replayer:
    """In a replay process: makes the recorded call at the script's first matching call."""

    def __init__(self, where: str, out: str) -> None:
        self.where, self.out = where, out
        self.meta, self.inputs, self.params = replay_files.load(where)

    def matches(self, names: list[str]) -> bool:
        return list(names) == self.meta["params"]

    def run(self, inner: Any, weights: Any) -> None:
        """The recorded call, then the float64 reference; writes the result, ends the process."""
        result: dict[str, Any] = {"record": self.where}
        try:
            result["float32"] = self._call(inner, weights, None)
        except Exception as exc:  # noqa: BLE001 - said in the result
            result["error"] = f"the replayed call raised {type(exc).__name__}: {str(exc)[:300]}"
        try:
            result["float64"] = self._call(inner, weights, np.float64)
        except Exception as exc:  # noqa: BLE001 - a reference MindSpore cannot run in float64
            result["float64_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        Path(self.out).write_text(json.dumps(result, indent=1))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _call(self, inner: Any, weights: Any, cast: Any) -> dict[str, Any]:
        import mindspore as ms
        for p, name in zip(weights if not is_tensor(weights) else (weights,), self.meta["params"]):
            arr = self.params[name]
            if cast is not None and arr.dtype.kind == "f":
                p.set_dtype(ms.float64)
                arr = arr.astype(cast)
            p.set_data(ms.Tensor(arr))
        if self.meta.get("rng") is not None:
            ms.set_rng_state(ms.Tensor(np.array(self.meta["rng"], np.uint8)))
        args = [self._value(e, cast) for e in self.meta["call"]["args"]]
        kwargs = {k: self._value(e, cast) for k, e in self.meta["call"]["kwargs"].items()}
        out = inner(*args, **kwargs)
        loss, crcs = first_outputs(out)
        _, gnorm = measure(out)
        gate = AnomalyGate()
        for lv in self.meta["history"]["loss"]:
            gate.learn(lv, None)
        for gv in self.meta["history"]["grad_norm"]:
            gate.learn(None, gv)
        return {"loss": _num(loss), "grad_norm": _num(gnorm), "grad_crc32": crcs,
                "anomalous": gate.judge(loss, gnorm),
                "bitwise": cast is None and [_num(loss), crcs] == [self.meta["first"]["loss"],
                                                                  self.meta["first"]["grad_crc32"]]}

    def _value(self, entry: dict, cast: Any) -> Any:
        import mindspore as ms
        if "tensor" not in entry:
            return entry["value"]
        arr = self.inputs[entry["tensor"]]
        return ms.Tensor(arr.astype(cast) if cast is not None and arr.dtype.kind == "f" else arr)


def from_env() -> Replayer | None:
    """The replayer of a process ``rankscope rerun`` started, else None."""
    where, out = os.environ.get(ENV), os.environ.get(OUT_ENV)
    if not where or not out:
        return None
    try:
        return Replayer(where, out)
    except ValueError as exc:
        Path(out).write_text(json.dumps({"record": where, "error": str(exc)}))
        return None
