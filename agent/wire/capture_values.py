"""A tensor's values captured on request (CONTROL ``capture``, answered by STATUS ``capture``).

The console asks for one tensor's element values at the next step on a few ranks; each of
them saves the tensor whole next to its local dump and sends up to :data:`MAX_ELEMENTS` of
its values, in C order, so the coordinator can show slices of two ranks and their
difference. The request's args::

    {"id": "cap-3", "tensor": "Sentinel.param_end.fc1.weight", "ranks": [0, 1]}

and each rank's answer (``values`` are the first ``len(values) / itemsize`` elements of the
tensor in C order, as ``sent_dtype``; ``error`` instead when the rank could not)::

    {"id": "cap-3", "rank": 0, "step": 7, "tensor": "...", "shape": [256, 256],
     "dtype": "Float32", "sent_dtype": "float32", "values": b"...", "numel": 65536,
     "path": "/dump/captures/cap-3/Sentinel.param_end.fc1.weight.npy", "error": ""}

Why a cap: the coordinator keeps the values in memory for the page, and a weight of a
large model is hundreds of MB; the whole tensor is in the rank's ``path``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.wire.errors import ProtocolError, check_map

WHAT = "capture"
#: Elements a rank sends of one captured tensor (1 MiB as float32).
MAX_ELEMENTS = 1 << 18
#: Ranks one request may name: the page compares two; a few more fit in memory.
MAX_RANKS = 8
MAX_NAME = 512
_SENT_DTYPES = ("float32", "float64", "int64", "uint8")

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": str, "rank": int, "step": int, "tensor": str, "shape": list, "dtype": str, "sent_dtype": str,
    "values": bytes, "numel": int, "path": str, "error": str}
_REQUIRED = ("id", "rank", "tensor")


def check_request(args: Any) -> dict[str, Any]:
    """A capture request's args, checked (a ValueError names the field)."""
    if not isinstance(args, dict):
        raise ValueError("capture: args must be a map with tensor and ranks")
    tensor = args.get("tensor")
    if not isinstance(tensor, str) or not tensor.strip() or len(tensor) > MAX_NAME:
        raise ValueError(f"capture: args.tensor must name a tensor (1 to {MAX_NAME} characters), got {tensor!r:.80}")
    ranks = args.get("ranks")
    if not isinstance(ranks, list) or not ranks or len(ranks) > MAX_RANKS or \
            not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise ValueError(f"capture: args.ranks must list 1 to {MAX_RANKS} rank ids, got {ranks!r:.80}")
    out = {"tensor": tensor.strip(), "ranks": sorted(set(ranks))}
    if "id" in args:
        if not isinstance(args["id"], str) or not args["id"]:
            raise ValueError("capture: args.id must be a non-empty string")
        out["id"] = args["id"]
    return out


def encode(arr: np.ndarray) -> tuple[bytes, str]:
    """(the first MAX_ELEMENTS values in C order, their dtype): floats as float32 (float64
    kept), integers as int64, booleans as uint8."""
    flat = np.ascontiguousarray(arr).reshape(-1)[:MAX_ELEMENTS]
    if flat.dtype.kind == "f":
        flat = flat if flat.dtype == np.float64 else flat.astype(np.float32)
    elif flat.dtype.kind == "b":
        flat = flat.astype(np.uint8)
    else:
        flat = flat.astype(np.int64)
    return flat.tobytes(), flat.dtype.name


def decode(detail: dict[str, Any]) -> np.ndarray:
    """The sent values as a flat array."""
    return np.frombuffer(detail.get("values") or b"", dtype=np.dtype(detail.get("sent_dtype") or "float32"))


def check_detail(detail: Any) -> dict[str, Any]:
    """A rank's answer as sent, checked field by field (every error names the field)."""
    check_map(detail, "status.capture", _FIELDS, _REQUIRED)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in detail.get("shape", [])):
        raise ProtocolError("bad_field", "status.capture.shape must list non-negative sizes")
    sent = detail.get("sent_dtype", "float32")
    if sent not in _SENT_DTYPES:
        raise ProtocolError("bad_field", f"status.capture.sent_dtype {sent!r:.40}")
    if len(detail.get("values", b"")) % np.dtype(sent).itemsize or \
            len(detail.get("values", b"")) > MAX_ELEMENTS * 8:
        raise ProtocolError("bad_field", "status.capture.values is not a whole number of elements within the cap")
    return detail
