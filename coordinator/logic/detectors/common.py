"""Helpers the detectors share: picking the first flagged record and bounded evidence."""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from rankscope.coordinator.logic.align.aligner import NO_EXEC, StepView
from rankscope.coordinator.logic.verdict import Verdict
from rankscope.wire.records import NO_CRC, STAT_COLUMNS, Kind

#: Evidence lists at most this many ranks' values, so a 1024-rank verdict stays small.
MAX_EVIDENCE_RANKS = 64


def nanmedian0(a: np.ndarray) -> np.ndarray:
    """Median over axis 0 ignoring NaN (NaN for an all-NaN column).

    np.nanmedian goes through masked arrays for short axes and costs ~15x more; here
    NaNs sort last as +inf and each column's median is read at its own count.
    """
    fin = np.isfinite(a)
    rows = a.shape[0]
    if rows == 0:
        return np.full(a.shape[1], np.nan)
    if fin.all():  # the usual case: one partition, the same two middle ranks everywhere
        lo, hi = (rows - 1) // 2, rows // 2
        part = np.partition(a, (lo, hi), axis=0)
        return 0.5 * (part[lo] + part[hi])
    n = fin.sum(axis=0)
    srt = np.sort(np.where(fin, a, np.inf).T, axis=1)
    idx = np.arange(a.shape[1])
    with np.errstate(invalid="ignore"):
        med = 0.5 * (srt[idx, np.maximum((n - 1) // 2, 0)] + srt[idx, np.maximum(n // 2, 0)])
    med[n == 0] = np.nan
    return med


def set_medians(a: np.ndarray, groups: list[np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """(median, count of finite values) of each row's set, as (R, C) arrays. ``groups``
    None: one set of every row; else the rows of each set of two or more (a row in none
    is a set of its own: its median is its own value)."""
    if groups is None:
        med = nanmedian0(a)
        return np.broadcast_to(med, a.shape), np.broadcast_to(np.isfinite(a).sum(axis=0), a.shape)
    med = a.copy()
    n = np.isfinite(a).astype(np.int64)
    for rows in groups:
        sub = a[rows]
        med[rows] = nanmedian0(sub)[None, :]
        n[rows] = np.isfinite(sub).sum(axis=0)[None, :]
    return med, n


def kind_mask(kinds: np.ndarray, wanted: frozenset[int] | set[int]) -> np.ndarray:
    """Columns whose kind is in ``wanted`` (a lookup table: np.isin sorts every call)."""
    lut = np.zeros(257, bool)
    lut[list(wanted)] = True
    return lut[kinds]  # an unknown kind (-1) reads lut[-1], which is False


def first_flagged(view: StepView, flag: np.ndarray) -> tuple[int, int, list[int]] | None:
    """(row, column, tied rows) of the earliest flagged record by execution index.

    Rows whose earliest flagged record has the same execution index are ties; the
    row with the lowest rank id is named first, so the answer is deterministic.
    """
    if not flag.any():
        return None
    ex = np.where(flag, view.exec, NO_EXEC)
    row_min = ex.min(axis=1)
    first = row_min.min()
    rows = np.flatnonzero(row_min == first)
    rows = rows[np.argsort(view.ranks[rows], kind="stable")]
    row = int(rows[0])
    col = int(np.argmin(ex[row]))
    if first == NO_EXEC:  # flagged records without an execution index: first flagged column
        col = int(np.flatnonzero(flag[row])[0])
    return row, col, [int(r) for r in rows[1:]]


def num(x: Any) -> Any:
    """JSON-safe number (NaN/Inf become strings)."""
    if isinstance(x, (np.integer,)):
        return int(x)
    x = float(x)
    return x if math.isfinite(x) else str(x)


def crc_hex(crc: Any) -> str | None:
    """A record's checksum as evidence shows it: 8 hex digits, None where it has none."""
    return None if crc == NO_CRC else f"{int(crc):08x}"


def stats_dict(view: StepView, row: int, col: int) -> dict[str, Any]:
    return {name: num(view.stats[row, col, i]) for i, name in enumerate(STAT_COLUMNS)}


def group_values(view: StepView, col: int, values: np.ndarray, focus: list[int]) -> dict[str, Any]:
    """The group's values of one column: per rank (bounded, focus rows always in) + summary."""
    rows = np.flatnonzero(view.present[:, col])
    keep = list(dict.fromkeys(list(focus) + [int(r) for r in rows]))[:MAX_EVIDENCE_RANKS]
    vals = values[rows]
    fin = vals[np.isfinite(vals)]
    summary = {"n": int(rows.shape[0])}
    if fin.shape[0]:
        summary.update(median=num(np.median(fin)), min=num(fin.min()), max=num(fin.max()))
    return {"by_rank": {str(int(view.ranks[r])): num(values[r]) for r in keep}, "summary": summary}


_CALL = re.compile(r"\.(?:forward|backward)\.(\d+)(?=\.|$)")


def record_token(batch_token: int, tensor: str) -> int | None:
    """Inference token of a record: the step's first recorded token + the call index.

    Under token_range=[a, b] the probe names a cell's n-th recorded call
    ``...forward.<n>`` and that call is token a + n on every worker; the StepBatch's
    ``token`` carries a (the first forward call recorded in the step).
    """
    if batch_token < 0:
        return None
    m = _CALL.search(tensor)
    return batch_token + (int(m.group(1)) if m else 0)


def make_verdict(detector: str, view: StepView, row: int, col: int, ties: list[int],
                 evidence: dict[str, Any]) -> Verdict:
    kind = int(view.kind[col])
    ex = int(view.exec[row, col])
    return Verdict(
        detector=detector, rank=int(view.ranks[row]), step=view.step, tensor=view.keys.names[col],
        exec_index=None if ex == NO_EXEC else ex, kind=Kind(kind).name.lower() if kind >= 0 else None,
        group=view.group, evidence=evidence, ties=sorted(int(view.ranks[t]) for t in ties), job=view.job,
        token=record_token(int(view.token[row]), view.keys.names[col]),
    )
