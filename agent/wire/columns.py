"""The step columns on the wire, and the STEPS frame's packed body.

A STEP (one rank's step) carries its columns as typed arrays (``{"d", "s", "b"}`` each,
:func:`rankscope.wire.protocol.decode_array`). A STEPS frame (a node agent's parts for one
ingest shard, :mod:`rankscope.wire.step_pack`) is what a shard reads thousands of times a
step, and there a typed array per column cost more to check than the rest of the frame's
handling: its body carries every column in one bytes field and the parts' header in
another, laid out by the tables below, so checking a frame is a few length comparisons::

    {"k": parts, "n": rows, "head": bytes, "cols": bytes, "src": [str] * k, "names": [map] * k}

``cols``: the :data:`STEP_COLS` columns one after the other in :data:`BLOB_ORDER` (widest
items first, so every column starts aligned), ``n`` rows each; ``head``: the
:data:`PART_FIELDS` columns (int64), then the parts' wall times (float64), ``k`` rows each.
The decoder turns that into the form a STEPS body has in memory (:func:`unpack_steps`):
``{"parts": {"head": (k, 5) int64, "wall", "src", "names"}, "cols": {name: array}}``,
the arrays views of the frame's bytes; :func:`pack_steps` does the reverse.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.wire.errors import ProtocolError
from rankscope.wire.records import Kind

#: column -> (dtype, ndim) of a step's records.
STEP_COLS: dict[str, tuple[str, int]] = {
    "name_ids": ("<u4", 1), "kinds": ("|u1", 1), "exec_index": ("<u4", 1),
    "stats": ("<f8", 2), "nan_count": ("<i8", 1), "inf_count": ("<i8", 1),
    "numel": ("<i8", 1), "crc32": ("<i8", 1),
}
STEP_COLUMNS = tuple(STEP_COLS)
#: Items per row beyond the first axis (stats: min, max, mean, norm).
STEP_TAIL: dict[str, tuple[int, ...]] = {name: (4,) if ndim == 2 else () for name, (_, ndim) in STEP_COLS.items()}
MAX_KIND = int(max(Kind))
#: Every byte value that is a known kind: ``bytes.translate`` deletes them in C, and
#: whatever is left of a kinds column is an unknown kind.
_KIND_BYTES = bytes(range(MAX_KIND + 1))

#: A STEPS header: per part these int64 fields, then its wall time.
PART_FIELDS = ("seq", "rank", "step", "token", "rows")
SEQ, ROWS = PART_FIELDS.index("seq"), PART_FIELDS.index("rows")
HEAD_ROW_BYTES = 8 * len(PART_FIELDS) + 8

BLOB_ORDER = ("stats", "nan_count", "inf_count", "numel", "crc32", "name_ids", "exec_index", "kinds")
#: Per column in blob order: (name, dtype, items per row, bytes per row).
_BLOB = tuple((name, np.dtype(STEP_COLS[name][0]), int(np.prod(STEP_TAIL[name], dtype=np.int64)),
               np.dtype(STEP_COLS[name][0]).itemsize * int(np.prod(STEP_TAIL[name], dtype=np.int64)))
              for name in BLOB_ORDER)
#: Bytes of one record in a STEPS frame (and in a step slot: the stated memory per record).
ROW_BYTES = sum(b[3] for b in _BLOB)
if sorted(BLOB_ORDER) != sorted(STEP_COLUMNS) or [b[1].itemsize for b in _BLOB] != sorted(
        (b[1].itemsize for b in _BLOB), reverse=True):
    raise ImportError("BLOB_ORDER must hold every step column, widest items first")

_WIRE_KEYS = frozenset({"k", "n", "head", "cols", "src", "names"})


def check_names(names: Any, what: str) -> None:
    if type(names) is not dict:
        raise ProtocolError("bad_field", f"{what}.new_names is not a map")
    # Type sets and min() run in C: a 16k-rank job's first step carries ~1M names.
    if names and ({*map(type, names)} != {int} or min(names) < 0 or {*map(type, names.values())} != {str}):
        raise ProtocolError("bad_field", f"{what}.new_names must map int -> str")


def pack_steps(body: dict) -> dict:
    """The wire body of a STEPS body held in memory (arrays of any contiguity, any order)."""
    parts, cols = body["parts"], body["cols"]
    head = np.asarray(parts["head"], np.int64).reshape(-1, len(PART_FIELDS))
    k, n = head.shape[0], int(len(cols["kinds"]))
    return {"k": k, "n": n,
            "head": head.T.astype("<i8").tobytes() + np.asarray(parts["wall"], "<f8").tobytes(),
            "cols": b"".join(np.asarray(cols[name], dt).tobytes() for name, dt, _, _ in _BLOB),
            "src": list(parts["src"]), "names": list(parts["names"])}


def unpack_steps(body: dict) -> None:
    """Check a STEPS wire body and turn it, in place, into its form in memory."""
    if body.keys() != _WIRE_KEYS:
        raise ProtocolError("bad_field", f"steps has {sorted(map(str, body))[:8]}")
    k, n, head, raw, src, names = body["k"], body["n"], body["head"], body["cols"], body["src"], body["names"]
    if type(k) is not int or type(n) is not int or k < 0 or n < 0:
        raise ProtocolError("bad_field", "steps.k and steps.n must be counts")
    if type(raw) is not bytes or len(raw) != n * ROW_BYTES:
        raise ProtocolError("bad_shape", f"steps.cols: {len(raw) if type(raw) is bytes else type(raw).__name__} "
                                         f"bytes for {n} rows of {ROW_BYTES}")
    if type(head) is not bytes or len(head) != k * HEAD_ROW_BYTES:
        raise ProtocolError("bad_shape", f"steps.head: {len(head) if type(head) is bytes else type(head).__name__} "
                                         f"bytes for {k} parts of {HEAD_ROW_BYTES}")
    if type(src) is not list or len(src) != k or not all(type(x) is str for x in src):
        raise ProtocolError("bad_field", f"steps.src: expected {k} strings")
    if type(names) is not list or len(names) != k:
        raise ProtocolError("bad_field", f"steps.names: expected {k} maps")
    for table in names:
        if table:
            check_names(table, "steps.parts")
        elif type(table) is not dict:
            raise ProtocolError("bad_field", "steps.names: a table is not a map")
    fields = np.frombuffer(head, "<i8", k * len(PART_FIELDS)).reshape(len(PART_FIELDS), k)
    if k and (min(fields[SEQ].tolist()) < 0 or min(rows := fields[ROWS].tolist()) < 0):
        raise ProtocolError("bad_field", "steps: a negative seq or row count")
    if k and sum(rows) != n or not k and n:
        raise ProtocolError("bad_shape", f"steps: parts hold {sum(rows) if k else 0} rows, cols have {n}")
    cols, at = {}, 0
    for name, dt, items, width in _BLOB:
        a = np.frombuffer(raw, dt, n * items, at)
        cols[name] = a.reshape(n, items) if items > 1 else a
        if name == "kinds" and raw[at:at + n].translate(None, _KIND_BYTES):
            # A kind the detectors do not know would make StepBatch.validate() fail downstream.
            raise ProtocolError("bad_field", f"steps.cols.kinds: unknown kind {int(a.max())}")
        at += n * width
    body.clear()
    body["parts"] = {"head": fields.T, "wall": np.frombuffer(head, "<f8", k, k * 8 * len(PART_FIELDS)),
                     "src": src, "names": names}
    body["cols"] = cols
