"""Flight-recorder steps on disk: msgpack (every column, exact) + a JSON summary (readable).

msgpack rather than JSON for the columns because NaN/Inf must survive exactly (they are
usually why the bundle exists) and because K steps x thousands of tensors is large as
text. Arrays use the wire's typed-bytes form and are read back with the wire's
validating :func:`rankscope.wire.protocol.decode_array`: no pickle, numeric dtypes only.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

import msgpack
import numpy as np

from rankscope.wire.protocol import decode_array
from rankscope.wire.records import STAT_COLUMNS, Kind, StepBatch, StepOutput

FORMAT = "rankscope-flight-recorder/1"
COLUMNS = ("name_ids", "kinds", "exec_index", "stats", "nan_count", "inf_count", "numel", "crc32")


def _array(arr: np.ndarray) -> dict:
    arr = np.ascontiguousarray(arr)
    return {"d": arr.dtype.str, "s": list(arr.shape), "b": arr.tobytes()}


def as_batches(steps: Iterable[StepOutput | StepBatch]) -> list[StepBatch]:
    return [s.batch if isinstance(s, StepOutput) else s for s in steps]


def encode_steps(batches: list[StepBatch], names: Mapping[int, str]) -> bytes:
    doc = {
        "format": FORMAT,
        "names": {int(k): str(v) for k, v in names.items()},
        "steps": [{"job": b.job, "rank": int(b.rank), "step": int(b.step), "token": int(b.token),
                   "wall_time": float(b.wall_time),
                   "cols": {c: _array(getattr(b, c)) for c in COLUMNS}} for b in batches],
    }
    return msgpack.packb(doc, use_bin_type=True)


def load_steps(data: bytes) -> tuple[list[StepBatch], dict[int, str]]:
    """Inverse of :func:`encode_steps`; raises ValueError on anything unexpected."""
    doc = msgpack.unpackb(data, raw=False, strict_map_key=False, max_ext_len=0)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} file")
    names = {int(k): str(v) for k, v in doc["names"].items()}
    batches = []
    for s in doc["steps"]:
        cols = {c: decode_array(s["cols"][c], f"steps.cols.{c}") for c in COLUMNS}
        batch = StepBatch(job=s["job"], rank=s["rank"], step=s["step"], token=s["token"],
                          wall_time=s["wall_time"], **{c: cols[c].copy() for c in COLUMNS})
        batch.validate()
        batches.append(batch)
    return batches, names


def _num(x: float) -> Any:
    """JSON has no NaN/Inf; spell them so a browser's JSON.parse still reads the file."""
    x = float(x)
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def summarize_steps(batches: list[StepBatch], names: Mapping[int, str], k: int | None = None) -> dict:
    """Per step: record count, losses, first non-finite record (in execution order)."""
    out = []
    for b in batches:
        nonfinite = np.flatnonzero((b.nan_count > 0) | (b.inf_count > 0))
        first = None
        if nonfinite.size:
            i = int(nonfinite[np.argmin(b.exec_index[nonfinite])])
            first = {"name": names.get(int(b.name_ids[i]), f"#{int(b.name_ids[i])}"),
                     "kind": Kind(int(b.kinds[i])).name, "exec_index": int(b.exec_index[i]),
                     "nan_count": int(b.nan_count[i]), "inf_count": int(b.inf_count[i])}
        losses = {names.get(int(b.name_ids[i]), f"#{int(b.name_ids[i])}"):
                  {c: _num(v) for c, v in zip(STAT_COLUMNS, b.stats[i])}
                  for i in np.flatnonzero(b.kinds == int(Kind.LOSS))}
        out.append({"step": int(b.step), "rank": int(b.rank), "job": b.job, "records": len(b),
                    "nonfinite_records": int(nonfinite.size), "first_nonfinite": first,
                    "loss": losses, "wall_time": float(b.wall_time)})
    return {"format": FORMAT + "+summary", "ring_size": k, "steps_kept": len(batches),
            "names_known": len(names), "full_data": "flight_recorder_steps.msgpack", "steps": out}


def summary_json(batches: list[StepBatch], names: Mapping[int, str], k: int | None = None) -> bytes:
    return json.dumps(summarize_steps(batches, names, k), indent=1).encode()
