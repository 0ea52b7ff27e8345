"""Real faults one DP inference worker can be given, chosen by ``INFER_FAULT``.

Spellings (WORKER is the worker's own id, 0..N-1):

- ``perturb_weight:WORKER:LAYER[:TOKEN]``: just before forward call TOKEN (default 0;
  0 = prefill, k = decode iteration k) of its first request, that worker adds 1e-3 to
  the query/key/value projection weight of block LAYER, as a bit flip or a bad weight
  reload mid-serving would. Calls before TOKEN are untouched, so the first departure
  is (TOKEN, block LAYER).
- ``dtype:WORKER``: that worker holds its weights in float16 (a wrong ``dtype=`` at load).
- ``seed:WORKER``: that worker initialises its weights from a different seed (a replica
  that loaded a different checkpoint).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import mindspore as ms
from decoder import WEIGHT_SEED, IterationHook, TinyDecoder
from mindspore import ops

PERTURBATION = 1e-3


class FaultKind(str, enum.Enum):
    PERTURB_WEIGHT = "perturb_weight"
    DTYPE = "dtype"
    SEED = "seed"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    worker: int
    layer: int | None = None
    token: int = 0

    def applies_to(self, worker: int) -> bool:
        return self.worker == worker


_USAGE = "INFER_FAULT must be perturb_weight:WORKER:LAYER[:TOKEN], dtype:WORKER or seed:WORKER"


def _int(field: str, text: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"INFER_FAULT={spec!r}: {field} must be an integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"INFER_FAULT={spec!r}: {field} must be >= 0, got {value}")
    return value


def parse_fault(spec: str | None) -> Fault | None:
    """Parse an ``INFER_FAULT`` value; empty means no fault. Errors name the bad part."""
    if not spec:
        return None
    parts = spec.split(":")
    try:
        kind = FaultKind(parts[0])
    except ValueError:
        raise ValueError(f"INFER_FAULT={spec!r}: unknown kind {parts[0]!r}; {_USAGE}") from None
    if kind is FaultKind.PERTURB_WEIGHT:
        if len(parts) not in (3, 4):
            raise ValueError(f"INFER_FAULT={spec!r}: {_USAGE}")
        token = _int("TOKEN", parts[3], spec) if len(parts) == 4 else 0
        return Fault(kind, _int("WORKER", parts[1], spec), _int("LAYER", parts[2], spec), token)
    if len(parts) != 2:
        raise ValueError(f"INFER_FAULT={spec!r}: {_USAGE}")
    return Fault(kind, _int("WORKER", parts[1], spec))


def weight_seed(fault: Fault | None, worker: int) -> int:
    return WEIGHT_SEED + 1 if fault and fault.kind is FaultKind.SEED and fault.applies_to(worker) else WEIGHT_SEED


def weight_dtype(fault: Fault | None, worker: int) -> ms.Type:
    return ms.float16 if fault and fault.kind is FaultKind.DTYPE and fault.applies_to(worker) else ms.float32


def perturbed_parameter_name(layer: int) -> str:
    return f"layers.{layer}.attn.qkv.weight"


def iteration_hook(fault: Fault | None, worker: int, n_layers: int) -> IterationHook | None:
    """The ``before_call`` hook that injects a perturb_weight fault, or None."""
    if not (fault and fault.kind is FaultKind.PERTURB_WEIGHT and fault.applies_to(worker)):
        return None
    if fault.layer >= n_layers:
        raise ValueError(f"INFER_FAULT: LAYER={fault.layer} but the model has {n_layers} layers")

    done = False

    def before_call(it: int, model: TinyDecoder) -> None:
        nonlocal done
        if done or it != fault.token:
            return
        done = True  # one corruption, in the first request that reaches TOKEN
        weight = model.layers[fault.layer].attn.qkv.weight
        weight.set_data(weight + ops.ones_like(weight) * PERTURBATION)

    return before_call
